"""Property: reprocessing change-log partitions in any order, any number of times, converges.

Hypothesis generates a Debezium (Postgres) change stream for one table: inserts, snapshot reads,
updates (of existing keys, and of missing ones: upserts), deletes (some followed by a Kafka
tombstone, some of missing keys), key changes in both of Debezium's forms, truncates, re-delivered
duplicates and, in the TOAST variant, updates whose ``note`` is Postgres' unchanged-TOAST
placeholder. The records are spread over 2-4 landing files, one per ``dt=`` date, either as
contiguous slices or at random (a file then holds events older than another file's). Each file is
ingested once; the dates are then normalized and merged one at a time in a drawn order with
repeats. After every step the current table and the SCD2 history (both updated from the change
log) must equal the reference model's in-order replay of the dates processed so far
(``tests/reference_model.py``), and at the end a full refresh must give the same tables.

Messages are schemaless Debezium JSON; ``column_types`` types the columns. Each example costs a
few Spark jobs per step (about 12 s an example on the 2-core machine), so `make test` draws 1
per property beside the pinned ones: ``CDC_PROPERTY_EXAMPLES`` raises it (`make fuzz`: 200).
The ``@example`` cases are minimal failures hypothesis once found, kept as regressions.
"""

import json
import os
import re
import tempfile
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.steps.changelog import normalize_source
from cdc_platform.steps.current import MergeResult, current_rows, merge_current
from cdc_platform.steps.history import update_history
from cdc_platform.steps.raw import ingest_files
from tests.delta_readers import agreed
from tests.reference_model import (
    COLUMNS,
    PLACEHOLDER,
    Record,
    current_state,
    event_time_ms,
    history,
)

pytestmark = pytest.mark.spark

SOURCE = SourceConfig(
    name="pg",
    format="debezium",
    tables=[
        TableConfig(
            name="items",
            source_table="public.items",
            primary_key=["id"],
            column_types={"id": "int", "name": "string", "qty": "int", "note": "string"},
        )
    ],
)
TABLE = "items"
KEYS = range(1, 10)  # few keys: changes collide often

SETTINGS = settings(
    max_examples=int(os.environ.get("CDC_PROPERTY_EXAMPLES", "1")),
    deadline=None,
    database=None,  # no .hypothesis folder in the clone; a failure prints its example
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6)
_names = st.none() | st.sampled_from(["", "a", "null", '"q"', "ü ✓"]) | _text
_qty = st.none() | st.integers(-(2**31), 2**31 - 1)


@st.composite
def _row(draw, key: int) -> dict:
    return {"id": key, "name": draw(_names), "qty": draw(_qty), "note": draw(_names)}


@st.composite
def change_streams(draw, toast: bool) -> list[Record]:
    """Kafka records in offset order; ``lsn`` grows with the stream (a key change's delete and
    create share one, as Debezium's do), duplicates repeat an earlier event at a later offset."""
    kinds = ["insert", "update", "delete", "read", "update", "delete", "rekey", "rekey_update",
             "noop_update", "truncate", "duplicate", "insert"]  # fmt: skip
    if toast:
        kinds += ["toast", "toast", "toast"]
    live: dict[int, dict] = {}  # the table as the source has it, to make the events plausible
    records: list[Record] = []
    lsn = draw(st.integers(1, 10**12))

    def emit(op, key=None, before=None, after=None) -> None:
        records.append(Record(len(records), op, lsn, key, before, after))

    def tombstone(key: int) -> None:
        records.append(Record(len(records), None, key=key))

    def existing_or_not() -> int:
        """Mostly a live key; sometimes one the table does not have."""
        if live and draw(st.integers(0, 3)):
            return draw(st.sampled_from(sorted(live)))
        return draw(st.sampled_from([k for k in KEYS if k not in live] or list(KEYS)))

    def fresh() -> int:
        return draw(st.sampled_from([k for k in KEYS if k not in live] or [max(live) + 1]))

    for _ in range(draw(st.integers(1, 22))):
        kind = draw(st.sampled_from(kinds))
        lsn += draw(st.integers(1, 5000))
        if kind in ("toast", "noop_update", "rekey", "rekey_update") and not live:
            kind = "insert"
        if kind == "duplicate" and not records:  # nothing to repeat yet
            kind = "insert"
        if kind in ("insert", "read"):
            key = fresh() if kind == "insert" else draw(st.sampled_from(KEYS))
            live[key] = draw(_row(key))
            emit("c" if kind == "insert" else "r", key, after=live[key])
        elif kind in ("update", "noop_update", "toast"):
            key = existing_or_not() if kind == "update" else draw(st.sampled_from(sorted(live)))
            row = dict(live[key]) if kind == "noop_update" else draw(_row(key))
            full_before = key in live and draw(st.booleans())  # REPLICA IDENTITY FULL
            before = live.get(key) if full_before else None
            if kind == "toast" or (kind == "noop_update" and toast and draw(st.booleans())):
                kept = live[key]["note"]
                emit("u", key, before, {**row, "note": PLACEHOLDER})
                row["note"] = kept
            else:
                emit("u", key, before, row)
            live[key] = row
        elif kind == "delete":
            key = existing_or_not()
            full = key in live and draw(st.booleans())
            before = live[key] if full else {c: key if c == "id" else None for c in COLUMNS}
            emit("d", key, before)
            live.pop(key, None)
            if draw(st.booleans()):
                tombstone(key)
        elif kind == "rekey":  # Debezium: delete + tombstone of the old key, create of the new
            old, new = draw(st.sampled_from(sorted(live))), fresh()
            before = live.pop(old)
            emit("d", old, before)
            tombstone(old)
            live[new] = {**before, "id": new} if draw(st.booleans()) else draw(_row(new))
            emit("c", new, after=live[new])
        elif kind == "rekey_update":  # one update whose before key differs from its after key
            old, new = draw(st.sampled_from(sorted(live))), fresh()
            before = live.pop(old)
            live[new] = {**before, "id": new} if draw(st.booleans()) else draw(_row(new))
            emit("u", new, before, live[new])
        elif kind == "truncate":
            emit("t")
            live.clear()
        elif kind == "duplicate" and records:  # at-least-once: an earlier record again
            again = draw(st.sampled_from(records))
            records.append(replace(again, offset=len(records)))
    return records


# A date landed again with other records (at a step of the processing order, which date, its
# new records), then reprocessed: a subset (records taken away) or a superset (records that
# arrived late) of what it held.
Rewrite = tuple[int, int, list[Record]]


@st.composite
def scenarios(draw, toast: bool) -> tuple[list[list[Record]], list[int], Rewrite | None]:
    """(files, processing order, rewrite): the records split into files, the order in which
    their dates are reprocessed (every date at least once, some several times), and maybe one
    date landed again with a subset or a superset of its records."""
    records = draw(change_streams(toast))
    n = draw(st.integers(2, 4))
    if draw(st.booleans()):  # contiguous slices of the stream
        cuts = sorted(draw(st.lists(st.integers(0, len(records)), min_size=n - 1, max_size=n - 1)))
        bounds = [0, *cuts, len(records)]
        files = [records[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    else:  # each record in a random file: a file may hold events older than another's
        where = draw(st.lists(st.integers(0, n - 1), min_size=len(records), max_size=len(records)))
        files = [[r for r, w in zip(records, where, strict=True) if w == i] for i in range(n)]
    files = [f for f in files if f]
    if draw(st.booleans()):  # lines out of offset order: order is by sequence, never arrival
        files = [draw(st.permutations(f)) for f in files]
    order = list(draw(st.permutations(range(len(files)))))
    for _ in range(draw(st.integers(0, 2))):
        order.insert(draw(st.integers(0, len(order))), draw(st.integers(0, len(files) - 1)))
    rewrite = None
    if draw(st.booleans()):
        i = draw(st.integers(0, len(files) - 1))
        keep = draw(st.lists(st.booleans(), min_size=len(files[i]), max_size=len(files[i])))
        part = [r for r, k in zip(files[i], keep, strict=True) if k]
        if draw(st.booleans()):  # superset: the date first lands without some of its records
            files[i], part = part, files[i]
        rewrite = (draw(st.integers(0, len(order))), i, part)
    return files, order, rewrite


def _dates(count: int) -> list[str]:
    return [(date(2026, 3, 1) + timedelta(days=i)).isoformat() for i in range(count)]


def _land(root: Path, files: list[list[Record]]) -> list[str]:
    """Write each file under its own ``dt=`` folder; ingest each into raw once."""
    dates = _dates(len(files))
    for day, records in zip(dates, files, strict=True):
        _land_date(root, day, records)
    return dates


def _land_date(root: Path, day: str, records: list[Record]) -> None:
    """(Re)write the date's landing file and replace the date in raw with it."""
    path = root / "landing" / SOURCE.name / f"dt={day}" / "000.kafka.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r.kafka_line()) + "\n" for r in records))
    ingest_files(root / "warehouse", SOURCE.name, [(path, path.name)], day, True)


def _rows(uri: str) -> list[dict]:
    """Every row of a table, all columns, in a canonical order (read by delta-rs: no Spark job
    for what only the test looks at)."""
    table = lake.read_arrow(uri)
    return sorted([] if table is None else table.to_pylist(), key=repr)


def _assert_change_log_is_a_fresh_normalization(spark, root: Path, files: list[list[Record]]):
    """The change and control logs, after every reprocess, equal one normalization of raw."""
    fresh = root / "fresh"
    dates = _dates(len(files))
    for day, records in zip(dates, files, strict=True):
        _land_date(fresh, day, records)
    normalize_source(spark, fresh / "warehouse", SOURCE, dates)
    for layer, table in ((lake.CHANGELOG, TABLE), (lake.CONTROL, None)):
        ours = _rows(lake.TableRef(layer, SOURCE.name, table).uri(root / "warehouse"))
        theirs = _rows(lake.TableRef(layer, SOURCE.name, table).uri(fresh / "warehouse"))
        assert ours == theirs, f"{layer} differs from a fresh normalization of raw"


def _lake_rows(spark, warehouse: Path) -> dict[int, dict]:
    for layer in (lake.CURRENT, lake.HISTORY):
        uri = lake.TableRef(layer, SOURCE.name, TABLE).uri(warehouse)
        if lake.exists(uri):
            agreed(spark, uri)  # Spark, delta-rs and DuckDB read the same rows
    df = current_rows(spark, warehouse, SOURCE.name, TABLE)
    rows = [] if df is None else df.toArrow().to_pylist()
    return {r["id"]: {c: r.get(c) for c in COLUMNS} for r in rows}


_SEQUENCE = re.compile(r"^lsn:(\d{20})\|k\d{6}(\d{20})$")


def _position(sequence: str | None) -> tuple[int, int] | None:
    """(lsn, offset) of a change-log sequence."""
    if sequence is None:
        return None
    m = _SEQUENCE.match(sequence)
    assert m, f"unexpected sequence {sequence!r}"
    return int(m[1]), int(m[2])


def _event_ms(position: tuple[int, int] | None) -> int | None:
    return None if position is None else event_time_ms(position[0])


def _lake_history(warehouse: Path) -> list[dict]:
    table = lake.read_arrow(lake.TableRef("history", SOURCE.name, TABLE).uri(warehouse))
    rows = [] if table is None else table.to_pylist()
    return sorted(
        (
            {c: r.get(c) for c in COLUMNS}
            | {
                "start": _position(r["__start_at"]),
                "end": _position(r["__end_at"]),
                "start_ms": _ms(r["__start_time"]),
                "end_ms": _ms(r["__end_time"]),
                "current": r["__is_current"],
                "deleted": r["__is_deleted"],
                "op": r["__op"],
            }
            for r in rows
        ),
        key=lambda v: (v["id"], v["start"]),
    )


def _ms(t: datetime | None) -> int | None:
    if t is None:
        return None
    return round((t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp() * 1000)


def _model_history(records: list[Record]) -> list[dict]:
    return sorted(
        (
            dict(zip(COLUMNS, v.row, strict=True))
            | {
                "start": v.start,
                "end": v.end,
                "start_ms": _event_ms(v.start),
                "end_ms": _event_ms(v.end),
                "current": v.end is None,
                "deleted": v.deleted,
                "op": v.op,
            }
            for v in history(records)
        ),
        key=lambda v: (v["id"], v["start"]),
    )


def _explain(files: list[list[Record]], steps: list[tuple], step: int) -> str:
    done = [f"{i} (landed again)" if again is not None else i for i, again in steps[: step + 1]]
    lines = [f"dates processed: {done}"]
    for i, f in enumerate(files):
        lines += [f"file {i}:"] + [f"  {r.describe()}" for r in f]
    return "\n".join(lines)


def _reprocess(spark, files: list[list[Record]], order: list[int], rewrite: Rewrite | None) -> None:
    """Land and ingest ``files``, then normalize their dates in ``order`` (landing one date
    again as ``rewrite`` says, at its step), each followed by a merge into the current table and
    a history update, both checked against the model of the dates processed so far. At the end
    the change log must equal a fresh normalization of raw, and both tables a full rebuild."""
    files = list(files)
    steps = [(i, None) for i in order]
    if rewrite is not None:
        at, i, records = rewrite
        steps.insert(at, (i, records))
    with tempfile.TemporaryDirectory(prefix="convergence-") as tmp:
        root = Path(tmp)
        warehouse = root / "warehouse"
        dates = _land(root, files)
        done: set[int] = set()
        current, versions = current_state([]), _model_history([])
        for step, (i, records) in enumerate(steps):
            if records is not None:
                files[i] = records
                _land_date(root, dates[i], records)
            result = normalize_source(spark, warehouse, SOURCE, [dates[i]])
            assert result.quarantined == 0, result.quarantine_reasons
            done.add(i)
            seen = [r for j in done for r in files[j]]
            why = _explain(files, steps, step)
            merged = merge_current(spark, warehouse, SOURCE.name, TABLE)
            _assert_live_balance(merged)
            current = current_state(seen)
            assert _lake_rows(spark, warehouse) == current, why
            update_history(spark, warehouse, SOURCE.name, SOURCE.tables[0])
            versions = _model_history(seen)
            assert _lake_history(warehouse) == versions, why
        _assert_change_log_is_a_fresh_normalization(spark, root, files)
        incremental = {layer: _rows(_uri(warehouse, layer)) for layer in LAYERS}
        merged = merge_current(spark, warehouse, SOURCE.name, TABLE, full_refresh=True)
        _assert_live_balance(merged)
        assert _lake_rows(spark, warehouse) == current, "full refresh differs"
        # Nothing new: the merge changes nothing and its balance still holds.
        _assert_live_balance(merge_current(spark, warehouse, SOURCE.name, TABLE))
        update_history(spark, warehouse, SOURCE.name, SOURCE.tables[0], full_refresh=True)
        assert _lake_history(warehouse) == versions, "full refresh differs"
        for layer in LAYERS:
            rebuilt = _rows(_uri(warehouse, layer))
            assert incremental[layer] == rebuilt, f"{layer} differs from a full rebuild"


LAYERS = (lake.CURRENT, lake.HISTORY)


def _uri(warehouse: Path, layer: str) -> str:
    return lake.TableRef(layer, SOURCE.name, TABLE).uri(warehouse)


def _assert_live_balance(merged: MergeResult) -> None:
    """The quality check's row balance, computed apart from the MERGE, holds on every merge."""
    live = merged.live_before - merged.truncated_live + merged.made_live - merged.made_dead
    assert merged.rows == live, merged


def _row_of(key: int, name: str, qty: int, note: str) -> dict:
    return {"id": key, "name": name, "qty": qty, "note": note}


# A batch whose images lack a configured string column: one holding only a truncate.
TRUNCATE_ONLY_BATCH = (
    [[Record(0, "c", 100, 1, None, _row_of(1, "a", 1, "n"))], [Record(1, "t", 200)]],
    [0, 1],
    None,
)
# No records at all (random exploration found the test itself failing on it).
NOTHING = ([], [], None)
# A TOAST update merged before the (older) insert that holds the value it keeps.
TOAST_BEFORE_ITS_VALUE = (
    [
        [Record(0, "c", 100, 1, None, _row_of(1, "a", 1, "n"))],
        [Record(1, "u", 200, 1, None, _row_of(1, "b", 2, PLACEHOLDER))],
    ],
    [1, 0],
    None,
)
# A batch's full image older than the current row, then a newer TOAST update in the same batch:
# the current row's note (from the update in between) must stay. Found with
# --hypothesis-seed=63927964049718730674094769426859291429.
TOAST_AFTER_AN_OLDER_FULL_IMAGE = (
    [
        [
            Record(0, "c", 9, 7, None, _row_of(7, "x", 1, "a")),
            Record(2, "u", 12, 7, None, _row_of(7, "z", 3, PLACEHOLDER)),
        ],
        [Record(1, "u", 10, 7, None, _row_of(7, "y", 2, "null"))],
    ],
    [1, 0],
    None,
)
# A date landed again without its only change of the table, and one landed first without a
# late change (which then arrives): the table must forget, and learn, what they held.
# A date reprocessed as it was: its keys are rebuilt, and the MERGE copies the other rows of the
# file it rewrites (delta-rs once nulled their NOT NULL flags when the source's were nullable).
SAME_DATE_AGAIN = (
    [
        [Record(0, "c", 100, 1, None, _row_of(1, "a", 1, "n"))],
        [Record(1, "c", 200, 2, None, _row_of(2, "b", 2, "m"))],
    ],
    [0, 1, 0],
    None,
)
DATE_LOSES_ITS_CHANGES = (
    [
        [Record(0, "c", 100, 1, None, _row_of(1, "a", 1, "n"))],
        [Record(1, "u", 200, 1, None, _row_of(1, "b", 2, "m"))],
    ],
    [0, 1],
    (2, 1, []),
)
DATE_GETS_A_LATE_CHANGE = (
    [
        [Record(0, "c", 100, 1, None, _row_of(1, "a", 1, "n"))],
        [Record(2, "c", 300, 2, None, _row_of(2, "c", 3, "o"))],
    ],
    [1, 0],
    (
        1,
        1,
        [
            Record(1, "u", 200, 1, None, _row_of(1, "b", 2, PLACEHOLDER)),
            Record(2, "c", 300, 2, None, _row_of(2, "c", 3, "o")),
        ],
    ),
)


# Both properties run the same body on a pinned example: each is pinned on one of them.
@pytest.mark.slow
@SETTINGS
@given(scenario=scenarios(toast=False))
@example(scenario=TRUNCATE_ONLY_BATCH)
@example(scenario=DATE_LOSES_ITS_CHANGES)
@example(scenario=SAME_DATE_AGAIN)
@example(scenario=NOTHING)
def test_reprocessing_in_any_order_converges(spark, scenario):
    _reprocess(spark, *scenario)


@pytest.mark.slow
@SETTINGS
@given(scenario=scenarios(toast=True))
@example(scenario=TOAST_BEFORE_ITS_VALUE)
@example(scenario=TOAST_AFTER_AN_OLDER_FULL_IMAGE)
@example(scenario=DATE_GETS_A_LATE_CHANGE)
def test_reprocessing_with_toast_placeholders_converges(spark, scenario):
    _reprocess(spark, *scenario)
