"""Every Debezium handling mode, one table: the same change stream, encoded as Debezium's
documentation says each mode writes it, gives the same current table.

The modes (Debezium MySQL connector documentation, "Data type mappings" and the connector
properties; Kafka Connect's JsonConverter for ``schemas.enable`` and ``decimal.format``):

- ``decimal.handling.mode``: ``precise`` (a Connect ``Decimal``: base64 of the unscaled value, or
  a JSON number with ``decimal.format=NUMERIC``), ``double`` (``float64``), ``string``;
- ``time.precision.mode``: ``adaptive`` (TIME(0-3) ``io.debezium.time.Time`` in ms, TIME(4-6)
  ``MicroTime`` in µs; DATETIME(0-3) ``Timestamp`` in ms, DATETIME(4-6) ``MicroTimestamp`` in
  µs), ``adaptive_time_microseconds`` (every TIME ``MicroTime``), ``connect`` (Kafka Connect's
  ``Date``, ``Time`` and ``Timestamp``, all in ms); DATE is days since the epoch in every mode,
  TIMESTAMP a ``ZonedTimestamp`` ISO string;
- ``binary.handling.mode``: ``bytes`` (``bytes``, written base64 by the JsonConverter),
  ``base64``, ``base64-url-safe`` and ``hex`` (``string`` in the schema);
- the JsonConverter with ``schemas.enable`` true and false.

What a message cannot say, the table's ``column_types`` says (the README's rule): the decimal
type in the ``double`` and ``string`` modes, the binary encoding in the string binary modes,
and every type without a schema. What a mode loses, the expectation loses too, and only that:
``connect`` keeps milliseconds of TIME(6) and DATETIME(6); ``double`` is exact here because
decimal(12,3) values have at most 15 significant digits, which a double keeps.

With a schema, every combination of the three modes (48) is written: one table per binary mode
(its ``column_types`` say the binary encoding) holds the 12 decimal and time combinations, each
under its own keys, so the table also mixes message schemas that write one column differently
(ms and µs, base64 and numbers) in one batch, as a reconfigured connector does. Four schemaless
tables cover each decimal, time and binary mode again. One replay writes them all."""

import base64
import datetime as dt
import json
from decimal import Decimal

import pytest

from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.steps.current import current_rows
from cdc_platform.steps.replay import replay

pytestmark = pytest.mark.spark

DATE = "2026-03-01"
DECIMAL_MODES = ("precise", "numeric", "double", "string")  # numeric: precise + NUMERIC
TIME_MODES = ("adaptive", "adaptive_time_microseconds", "connect")
BINARY_MODES = ("bytes", "base64", "base64-url-safe", "hex")
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
UTC = dt.UTC

# The logical rows: (op, id, row after the change or None).
ROW_1 = {"id": 1, "amount": Decimal("1234.567"), "d": dt.date(2026, 3, 1),
         "t": dt.timedelta(hours=12, minutes=34, seconds=56, microseconds=789012),
         "t3": dt.timedelta(hours=8, milliseconds=125),
         "dt": dt.datetime(2026, 3, 1, 12, 0, 0, 123456, UTC),
         "dt3": dt.datetime(2026, 3, 1, 12, 0, 0, 250000, UTC),
         "zts": dt.datetime(2026, 3, 1, 23, 59, 59, 999999, UTC),
         "bin": b"\xfb\xff\x00>?"}  # fmt: skip
ROW_1B = {**ROW_1, "amount": Decimal("-999999999.999"), "bin": b"\x00",
          "t": dt.timedelta(hours=23, minutes=59, seconds=59, microseconds=999999)}  # fmt: skip
ROW_2 = {"id": 2, "amount": Decimal("0.001"), "d": dt.date(1969, 12, 31),
         "t": dt.timedelta(0), "t3": dt.timedelta(0),
         "dt": dt.datetime(1969, 12, 31, 23, 59, 59, 999999, UTC),
         "dt3": EPOCH, "zts": EPOCH, "bin": b""}  # fmt: skip
ROW_3 = {"id": 3, "amount": None, "d": None, "t": None, "t3": None, "dt": None, "dt3": None,
         "zts": None, "bin": None}  # fmt: skip
STREAM = [("c", ROW_1), ("c", ROW_2), ("u", ROW_1B), ("d", ROW_2), ("c", ROW_3)]
COLUMNS = list(ROW_1)


def _micros(value: dt.timedelta | dt.datetime) -> int:
    delta = value - EPOCH if isinstance(value, dt.datetime) else value
    return delta // dt.timedelta(microseconds=1)


def _field(column: str, decimal: str, time: str, binary: str) -> tuple[dict, object]:
    """The Connect schema field of ``column`` in these modes, and a function of its value."""
    ms = lambda v: _micros(v) // 1000  # noqa: E731
    us = _micros
    if column == "id":
        return {"type": "int32"}, int
    if column == "amount":
        if decimal in ("precise", "numeric"):
            parameters = {"scale": "3", "connect.decimal.precision": "12"}
            schema = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                      "version": 1, "parameters": parameters}  # fmt: skip
            if decimal == "numeric":
                return schema, lambda v: _Number(str(v))
            return schema, lambda v: _unscaled_base64(v, 3)
        if decimal == "double":
            return {"type": "double"}, float
        return {"type": "string"}, str
    if column == "d":
        name = (
            "org.apache.kafka.connect.data.Date" if time == "connect" else "io.debezium.time.Date"
        )
        return {"type": "int32", "name": name}, lambda v: (v - EPOCH.date()).days
    if column in ("t", "t3"):
        if time == "connect":
            return {"type": "int32", "name": "org.apache.kafka.connect.data.Time"}, ms
        if time == "adaptive" and column == "t3":
            return {"type": "int32", "name": "io.debezium.time.Time"}, ms
        return {"type": "int64", "name": "io.debezium.time.MicroTime"}, us
    if column in ("dt", "dt3"):
        if time == "connect":
            return {"type": "int64", "name": "org.apache.kafka.connect.data.Timestamp"}, ms
        if column == "dt3":
            return {"type": "int64", "name": "io.debezium.time.Timestamp"}, ms
        return {"type": "int64", "name": "io.debezium.time.MicroTimestamp"}, us
    if column == "zts":
        iso = lambda v: v.strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # noqa: E731
        return {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}, iso
    encode = {"bytes": base64.b64encode, "base64": base64.b64encode,
              "base64-url-safe": base64.urlsafe_b64encode, "hex": bytes.hex}[binary]  # fmt: skip
    text = lambda v: (lambda e: e if isinstance(e, str) else e.decode())(encode(v))  # noqa: E731
    return {"type": "bytes" if binary == "bytes" else "string"}, text


class _Number(str):
    """A decimal written as a bare JSON number (decimal.format=NUMERIC)."""


def _unscaled_base64(value: Decimal, scale: int) -> str:
    unscaled = int(value.scaleb(scale))
    size = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


def _column_types(decimal: str, time: str, binary: str, schemas: bool) -> dict[str, str]:
    """What the table must say because the messages do not."""
    binary_from = {"bytes": "base64", "base64": "base64", "base64-url-safe": "base64_url",
                   "hex": "hex"}[binary]  # fmt: skip
    types = {}
    if decimal in ("double", "string"):
        types["amount"] = "decimal(12,3)"
    if binary != "bytes":
        types["bin"] = f"binary from {binary_from}"
    if schemas:
        return types
    micros = "millis" if time == "connect" else "micros"
    return {
        **types,
        "id": "int",
        "amount": "decimal(12,3) from base64" if decimal == "precise" else "decimal(12,3)",
        "d": "date from epoch_days",
        "t": f"time from {micros}",
        "t3": "time from micros" if time == "adaptive_time_microseconds" else "time from millis",
        "dt": f"timestamp from epoch_{micros}",
        "dt3": "timestamp from epoch_millis",
        "zts": "timestamp",
        "bin": f"binary from {binary_from}",
    }


def _messages(table: str, modes: tuple[str, str, str, bool], offset: int) -> list[str]:
    """The stream in these modes, its keys moved by ``offset``."""
    decimal, time, binary, schemas = modes
    fields = {c: _field(c, decimal, time, binary) for c in COLUMNS}
    image_fields = [{**f, "optional": c != "id", "field": c} for c, (f, _) in fields.items()]
    image = {
        "type": "struct",
        "fields": image_fields,
        "optional": True,
        "name": f"inv.{table}.Value",
    }
    schema = {"type": "struct", "name": f"inv.{table}.Envelope", "optional": False, "fields": [
        {**image, "field": "before"}, {**image, "field": "after"},
        {"type": "struct", "fields": [], "optional": False, "field": "source"},
        {"type": "string", "optional": False, "field": "op"}]}  # fmt: skip

    def wire(row: dict | None) -> dict | None:
        if row is None:
            return None
        row = {**row, "id": row["id"] + offset}
        return {c: None if v is None else fields[c][1](v) for c, v in row.items()}

    lines, before = [], {}
    for pos, (op, row) in enumerate(STREAM, start=1):
        prior = before.get(row["id"])
        after = None if op == "d" else row
        source = {"connector": "mysql", "db": "inv", "table": table, "ts_ms": 1000 + pos,
                  "file": "mysql-bin.000001", "pos": pos * 10, "row": 0}  # fmt: skip
        payload = {"before": wire(prior), "after": wire(after), "op": op, "source": source,
                   "ts_ms": 1000 + pos}  # fmt: skip
        before[row["id"]] = after
        text = json.dumps({"schema": schema, "payload": payload} if schemas else payload)
        for number in {v for img in (payload["before"], payload["after"]) if img
                       for v in img.values() if isinstance(v, _Number)}:  # fmt: skip
            text = text.replace(f'"{number}"', number)  # unquote: a bare JSON number
        lines.append(text)
    return lines


def _tables() -> dict[str, list[tuple[str, str, str, bool]]]:
    """Table name -> the mode combinations written to it, in order."""
    tables = {
        f"bin_{b.replace('-', '_')}": [(d, t, b, True) for d in DECIMAL_MODES for t in TIME_MODES]
        for b in BINARY_MODES
    }
    for i, d in enumerate(DECIMAL_MODES):
        tables[f"schemaless_{d}"] = [(d, TIME_MODES[i % 3], BINARY_MODES[i], False)]
    return tables


def _time_text(value: dt.timedelta) -> str:
    micros = _micros(value)
    s, us = divmod(micros, 1_000_000)
    return f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{us:06d}"


def _expected(time: str, offset: int) -> list[dict]:
    """The final rows as every table holds them, with what ``time`` loses lost."""

    def lossy(v):
        if time != "connect" or v is None:
            return v
        return v - dt.timedelta(microseconds=_micros(v) % 1000)  # to the millisecond

    rows = []
    for row in (ROW_1B, ROW_3):
        out = dict(row)
        for c in ("t", "t3"):
            value = lossy(row[c]) if c == "t" else row[c]
            out[c] = None if value is None else _time_text(value)
        out["dt"] = lossy(row["dt"])
        rows.append({**out, "id": row["id"] + offset})
    return rows


@pytest.mark.slow
def test_every_handling_mode_gives_the_same_table(spark, tmp_path):
    lines, configs = [], []
    for name, combos in _tables().items():
        for n, modes in enumerate(combos):
            lines += _messages(name, modes, offset=100 * n)
        # What any of the table's combinations needs said (column types are per table: a
        # table's binary mode, and without a schema its time mode too, is one).
        types = {k: v for modes in combos for k, v in _column_types(*modes).items()}
        configs.append(TableConfig(name=name, source_table=f"inv.{name}", primary_key=["id"],
                                   column_types=types))  # fmt: skip
    landing = tmp_path / "landing" / "events.jsonl"
    landing.parent.mkdir()
    landing.write_text("\n".join(lines) + "\n")
    warehouse = tmp_path / "warehouse"
    source = SourceConfig(name="s", format="debezium", tables=configs)
    replay(spark, warehouse, [landing], source, DATE)

    schemas = set()
    for name, combos in _tables().items():
        current = current_rows(spark, warehouse, "s", name)
        assert current is not None, name
        schemas.add(tuple(current.select(*COLUMNS).dtypes))
        rows = current.select(*COLUMNS).orderBy("id").toArrow().to_pylist()
        for n, modes in enumerate(combos):
            mine = [r for r in rows if 100 * n < r["id"] < 100 * (n + 1)]
            assert mine == _expected(modes[1], 100 * n), (name, modes)
        assert len(rows) == 2 * len(combos), name
    assert schemas == {(("id", "int"), ("amount", "decimal(12,3)"), ("d", "date"),
                        ("t", "string"), ("t3", "string"), ("dt", "timestamp"),
                        ("dt3", "timestamp"), ("zts", "timestamp"), ("bin", "binary"))}  # fmt: skip
