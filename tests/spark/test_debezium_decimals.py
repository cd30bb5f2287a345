"""A Kafka Connect Decimal as the JsonConverter writes it by default (base64 of the unscaled
value, big-endian two's complement) is read exactly to 38 digits, negative values included, and
a value with one digit too many is a type mismatch in the quarantine, not a failed job (Spark's
ANSI mode fails a query on a decimal overflow)."""

import base64
import json
from decimal import Context, Decimal

import pytest

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.steps.replay import replay

pytestmark = pytest.mark.spark

DATE = "2026-01-01"
# column -> (precision, scale)
DECIMALS = {"pt": (2, 1), "d": (8, 1), "u": (20, 0), "big": (38, 9), "neg": (12, 1)}
# Row values (column d, row 2: the digits-only base64 text "1234").
ROWS = [
    {"id": 1, "pt": "1.1", "d": "1234", "u": "987654321",
     "big": "12345678901234567890.123456789", "neg": "-0.5"},
    {"id": 2, "pt": "-0.9", "d": "-265882.4", "u": "18446744073709551615",
     "big": "-0.000000001", "neg": "-12345678901.2"},
    {"id": 3, "pt": "0.0", "d": "0", "u": "0",
     "big": "99999999999999999999999999999.999999999", "neg": "0"},
    {"id": 4, "pt": "-0.1", "d": "0.1", "u": "1",
     "big": "-99999999999999999999999999999.999999999", "neg": "1"},
]  # fmt: skip
# One digit too many for decimal(38,9): a type mismatch in the quarantine, not a failed job.
TOO_BIG = {"id": 5, "pt": "0.1", "d": "0.1", "u": "1", "big": "100000000000000000000000000000",
           "neg": "1"}  # fmt: skip


def _base64(value: str, scale: int) -> str:
    unscaled = int(Decimal(value).scaleb(scale, Context(prec=60)))  # the default rounds at 28
    size = max(1, (unscaled.bit_length() + 8) // 8)  # room for the sign bit
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


def _schema() -> dict:
    fields = [{"field": "id", "type": "int32", "optional": False}] + [
        {"field": c, "type": "bytes", "optional": True,
         "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
         "parameters": {"scale": str(s), "connect.decimal.precision": str(p)}}
        for c, (p, s) in DECIMALS.items()
    ]  # fmt: skip
    image = {"type": "struct", "fields": fields, "optional": True, "name": "inv.t.Value"}
    return {"type": "struct", "name": "inv.t.Envelope", "fields": [
        {**image, "field": "before"}, {**image, "field": "after"},
        {"type": "struct", "field": "source", "fields": []}, {"type": "string", "field": "op"},
    ]}  # fmt: skip


def _message(pos: int, row: dict) -> str:
    after = {"id": row["id"], **{c: _base64(row[c], scale) for c, (_, scale) in DECIMALS.items()}}
    source = {"connector": "mysql", "db": "inv", "table": "t", "ts_ms": 1000 + pos,
              "file": "mysql-bin.000001", "pos": pos, "row": 0}  # fmt: skip
    payload = {"before": None, "after": after, "op": "c", "source": source, "ts_ms": 1000 + pos}
    return json.dumps({"schema": _schema(), "payload": payload})


def _current(spark, tmp_path) -> tuple[list[dict], list]:
    landing = tmp_path / "events.jsonl"
    lines = [_message(10 * (i + 1), row) for i, row in enumerate([*ROWS, TOO_BIG])]
    landing.write_text("\n".join(lines) + "\n")
    warehouse = tmp_path / "warehouse"
    table = TableConfig(name="t", source_table="inv.t", primary_key=["id"])
    source = SourceConfig(name="s", format="debezium", tables=[table])
    replay(spark, warehouse, [landing], source, DATE)
    rows = lake.read(spark, lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse))
    quarantine = lake.read_arrow(lake.TableRef(lake.QUARANTINE, "s").uri(warehouse))
    reasons = [] if quarantine is None else quarantine.column("reason").to_pylist()
    columns = ["id", *DECIMALS]
    return rows.select(*columns).orderBy("id").toArrow().to_pylist(), reasons


def test_connect_decimals_are_exact_to_38_digits_and_an_overflow_is_quarantined(spark, tmp_path):
    expected = [{"id": r["id"], **{c: Decimal(r[c]) for c in DECIMALS}} for r in ROWS]
    assert _base64("-265882.4", 1) == "1234"
    rows, reasons = _current(spark, tmp_path)
    assert rows == expected
    assert len(reasons) == 1, reasons
    assert reasons[0].startswith("type mismatch: after.big = "), reasons
    assert reasons[0].endswith(" is not decimal(38,9)"), reasons
