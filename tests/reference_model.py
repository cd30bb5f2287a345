"""A pure-Python reference model of a Debezium change stream for one table keyed by ``id``.

The property tests in ``tests/spark/test_convergence_property.py`` generate a stream of Kafka
records (change events and tombstones), write them as landing files and check the lake against
what this model computes by replaying the stream one event at a time, in ``source.lsn`` order.
"""

from dataclasses import dataclass
from typing import Any

PLACEHOLDER = "__debezium_unavailable_value"  # Postgres: an unchanged TOASTed value
COLUMNS = ("id", "name", "qty", "note")
TABLE = {"db": "app", "schema": "public", "table": "items"}
TOPIC = "pg.public.items"

Row = dict[str, Any]


@dataclass(frozen=True)
class Record:
    """One Kafka record: a Debezium change event, or a tombstone (``op`` None, value null)."""

    offset: int
    op: str | None
    lsn: int | None = None
    key: int | None = None
    before: Row | None = None
    after: Row | None = None

    @property
    def change(self) -> tuple:
        """What the event says, without where it sits: equal for a re-delivered duplicate."""
        return (self.lsn, self.op, self.key, _frozen(self.before), _frozen(self.after))

    def kafka_line(self) -> dict:
        """The ``*.kafka.jsonl`` envelope of the record (Debezium JSON without a schema)."""
        line: dict[str, Any] = {
            "topic": TOPIC,
            "partition": 0,
            "offset": self.offset,
            "timestamp": 1_767_225_600_000 + self.offset,
            "key": None if self.key is None else {"id": self.key},
        }
        if self.op is None:
            line["value"] = None
            return line
        ts_ms = event_time_ms(self.lsn)
        source = {
            "version": "2.7.3.Final", "connector": "postgresql", "name": "pg", "ts_ms": ts_ms,
            "snapshot": "true" if self.op == "r" else "false", **TABLE,
            "txId": 700 + self.lsn // 16, "lsn": self.lsn, "xmin": None,
        }  # fmt: skip
        value: dict[str, Any] = {"source": source, "op": self.op}
        if self.op != "t":  # Debezium's truncate event carries no row images
            value = {"before": self.before, "after": self.after, **value}
        line["value"] = {**value, "ts_ms": ts_ms + 3, "transaction": None}
        return line

    def describe(self) -> str:
        """A short line for failure messages and reports."""
        if self.op is None:
            return f"@{self.offset} tombstone key={self.key}"
        return (
            f"@{self.offset} lsn={self.lsn} op={self.op} key={self.key} "
            f"before={self.before} after={self.after}"
        )


def event_time_ms(lsn: int) -> int:
    """``source.ts_ms`` of the event at ``lsn``: grows with it."""
    return 1_767_225_600_000 + lsn // 8


def _frozen(row: Row | None) -> tuple | None:
    return None if row is None else tuple(sorted(row.items()))


def in_order(records: list[Record]) -> list[Record]:
    """Change events in the order the source made them (``lsn``, then Kafka offset), exact
    duplicates (a re-delivered event) dropped, Kafka tombstones left out."""
    seen: set[tuple] = set()
    ordered = []
    for r in sorted((r for r in records if r.op is not None), key=lambda r: (r.lsn, r.offset)):
        if r.change not in seen:
            seen.add(r.change)
            ordered.append(r)
    return ordered


def _new_image(previous: Row | None, after: Row) -> Row:
    """The row an update leaves: TOAST placeholders keep the previous value (null if none)."""
    return {
        c: (previous or {}).get(c) if after.get(c) == PLACEHOLDER else after.get(c) for c in COLUMNS
    }


def current_state(records: list[Record]) -> dict[int, Row]:
    """The table after replaying ``records`` in source order: key -> row."""
    table: dict[int, Row] = {}
    for r in in_order(records):
        if r.op in ("c", "r"):
            table[r.after["id"]] = _new_image(None, r.after)
        elif r.op == "u":
            if r.before is not None and r.before["id"] != r.after["id"]:
                table.pop(r.before["id"], None)  # the key changed: the row moves
            table[r.after["id"]] = _new_image(table.get(r.after["id"]), r.after)
        elif r.op == "d":
            table.pop(r.before["id"] if r.before else r.key, None)
        elif r.op == "t":
            table.clear()
    return table


@dataclass(frozen=True)
class Version:
    """One SCD2 version of a key: the row's values from ``start`` until ``end`` (None: open)."""

    key: int
    row: tuple  # values in COLUMNS order
    start: tuple  # (lsn, offset) of the change that opened it
    end: tuple | None
    deleted: bool
    op: str


def history(records: list[Record]) -> list[Version]:
    """SCD type 2 history of ``records``: a new version per change that changes the row;
    a delete closes the live version and opens a deleted one (the values before the delete);
    a truncate deletes every live key; a key change deletes the old key at the same position."""
    versions: list[Version] = []
    open_: dict[int, int] = {}  # key -> index of its open version in ``versions``

    def close(key: int, at: tuple) -> Version | None:
        if key not in open_:
            return None
        i = open_.pop(key)
        versions[i] = Version(**{**versions[i].__dict__, "end": at})
        return versions[i]

    def live(key: int) -> Version | None:
        v = versions[open_[key]] if key in open_ else None
        return v if v is not None and not v.deleted else None

    def put(key: int, row: Row, at: tuple, op: str, deleted: bool = False) -> None:
        close(key, at)
        open_[key] = len(versions)
        versions.append(Version(key, tuple(row[c] for c in COLUMNS), at, None, deleted, op))

    def delete(key: int, at: tuple, op: str) -> None:
        v = live(key)
        if v is not None:
            put(key, dict(zip(COLUMNS, v.row, strict=True)), at, op, deleted=True)

    for r in in_order(records):
        at = (r.lsn, r.offset)
        if r.op in ("c", "r", "u"):
            if r.op == "u" and r.before is not None and r.before["id"] != r.after["id"]:
                delete(r.before["id"], at, r.op)
            key = r.after["id"]
            v = live(key)
            previous = dict(zip(COLUMNS, v.row, strict=True)) if v else None
            row = _new_image(previous, r.after)
            if row != previous:
                put(key, row, at, r.op)
        elif r.op == "d":
            delete(r.before["id"] if r.before else r.key, at, r.op)
        elif r.op == "t":
            for key in sorted(open_):
                delete(key, at, r.op)
    return versions
