"""A Kafka Connect Decimal in each of the JsonConverter's encodings gives the same table: base64
text of the unscaled value (the default, ``decimal.format=BASE64``) and a JSON number
(``decimal.format=NUMERIC``, KIP-481; what Paimon's and Flink CDC's published Debezium test data
use). The token's type tells them apart, never the text: digits-only text like ``1234`` is valid
base64 too. Numbers are exact to 38 digits (``from_json`` reads a number through a double).

Debezium's ``VariableScaleDecimal`` (PostgreSQL NUMERIC without a precision: ``{"scale": s,
"value": base64}`` in either encoding) becomes decimal(38,18), exactly, and a value with more
fractional digits than 18 is a type mismatch, not rounded."""

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
# Row values. Column d: row 1 as a number is the token 1234, and row 2 in base64 is the text
# "1234" (-265882.4 at scale 1): the same text, told apart by the token's type.
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
# VariableScaleDecimal column v, per row: (unscaled, scale) as the wire carries them.
VARIABLE = {1: (314159, 5), 2: (-123456789012345678905, 1), 3: (0, 0),
            4: (15 * 10**19, 20)}  # fmt: skip
VARIABLE_VALUES = {1: "3.14159", 2: "-12345678901234567890.5", 3: "0", 4: "1.5"}
# One digit too many for decimal(38,9): a type mismatch in the quarantine, not a failed job.
TOO_BIG = {"id": 5, "pt": "0.1", "d": "0.1", "u": "1", "big": "100000000000000000000000000000",
           "neg": "1"}  # fmt: skip
# A variable-scale value with 19 fractional digits, one more than decimal(38,18) keeps.
TOO_FINE = {"id": 6, "pt": "0.1", "d": "0.1", "u": "1", "big": "1", "neg": "1"}
VARIABLE[5], VARIABLE[6] = (1, 0), (1, 19)


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
    ] + [{"field": "v", "type": "struct", "optional": True,
          "name": "io.debezium.data.VariableScaleDecimal", "version": 1,
          "fields": [{"field": "scale", "type": "int32", "optional": False},
                     {"field": "value", "type": "bytes", "optional": False}]}]  # fmt: skip
    image = {"type": "struct", "fields": fields, "optional": True, "name": "inv.t.Value"}
    return {"type": "struct", "name": "inv.t.Envelope", "fields": [
        {**image, "field": "before"}, {**image, "field": "after"},
        {"type": "struct", "field": "source", "fields": []}, {"type": "string", "field": "op"},
    ]}  # fmt: skip


def _message(pos: int, row: dict, encoding: str) -> str:
    after: dict = {"id": row["id"]}
    for c, (_, scale) in DECIMALS.items():
        if encoding == "base64":
            after[c] = _base64(row[c], scale)
        else:
            after[c] = Decimal(row[c])  # written below as a bare JSON number
    unscaled, scale = VARIABLE[row["id"]]
    size = max(1, (unscaled.bit_length() + 8) // 8)
    value = base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()
    after["v"] = {"scale": scale, "value": value}  # bytes are base64 in either encoding
    source = {"connector": "mysql", "db": "inv", "table": "t", "ts_ms": 1000 + pos,
              "file": "mysql-bin.000001", "pos": pos, "row": 0}  # fmt: skip
    payload = {"before": None, "after": after, "op": "c", "source": source, "ts_ms": 1000 + pos}
    text = json.dumps({"schema": _schema(), "payload": payload}, default=str)
    if encoding == "numeric":  # json.dumps wrote each Decimal as a string: unquote it
        for c in DECIMALS:
            text = text.replace(f'"{c}": "{after[c]}"', f'"{c}": {after[c]}')
    return text


def _current(spark, tmp_path, encoding: str) -> tuple[list[dict], list]:
    landing = tmp_path / encoding / "events.jsonl"
    landing.parent.mkdir()
    lines = [
        _message(10 * (i + 1), row, encoding) for i, row in enumerate([*ROWS, TOO_BIG, TOO_FINE])
    ]
    landing.write_text("\n".join(lines) + "\n")
    warehouse = tmp_path / encoding / "warehouse"
    table = TableConfig(name="t", source_table="inv.t", primary_key=["id"])
    source = SourceConfig(name="s", format="debezium", tables=[table])
    replay(spark, warehouse, [landing], source, DATE)
    rows = lake.read(spark, lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse))
    quarantine = lake.read_arrow(lake.TableRef(lake.QUARANTINE, "s").uri(warehouse))
    reasons = [] if quarantine is None else quarantine.column("reason").to_pylist()
    columns = ["id", *DECIMALS, "v"]
    return rows.select(*columns).orderBy("id").toArrow().to_pylist(), reasons


@pytest.mark.slow
def test_base64_and_numeric_decimals_give_the_same_exact_table(spark, tmp_path):
    expected = [
        {
            "id": r["id"],
            **{c: Decimal(r[c]) for c in DECIMALS},
            "v": Decimal(VARIABLE_VALUES[r["id"]]),
        }
        for r in ROWS
    ]
    assert _base64("-265882.4", 1) == "1234"  # the digits-only base64 text the test relies on
    assert '"d": 1234,' in _message(10, ROWS[0], "numeric")
    for encoding in ("base64", "numeric"):
        rows, reasons = _current(spark, tmp_path, encoding)
        assert rows == expected, encoding
        assert len(reasons) == 2, (encoding, reasons)
        big, fine = sorted(reasons)
        assert big.startswith("type mismatch: after.big = "), (encoding, reasons)
        assert big.endswith(" is not decimal(38,9)"), (encoding, reasons)
        assert fine.startswith("type mismatch: after.v = "), (encoding, reasons)
        assert fine.endswith(" is not decimal(38,18)"), (encoding, reasons)


def _scaled_message(pos: int, id_: int, value: str, precision: int, scale: int) -> str:
    """A message whose schema gives ``amount`` this precision and scale."""
    parameters = {"scale": str(scale), "connect.decimal.precision": str(precision)}
    amount = {"field": "amount", "type": "bytes", "optional": True, "version": 1,
              "name": "org.apache.kafka.connect.data.Decimal",
              "parameters": parameters}  # fmt: skip
    image = {"type": "struct", "optional": True, "name": "inv.t.Value",
             "fields": [{"field": "id", "type": "int32", "optional": False}, amount]}  # fmt: skip
    schema = {"type": "struct", "name": "inv.t.Envelope", "fields": [
        {**image, "field": "before"}, {**image, "field": "after"},
        {"type": "string", "field": "op"}]}  # fmt: skip
    source = {"connector": "mysql", "db": "inv", "table": "t", "ts_ms": 1000 + pos,
              "file": "mysql-bin.000001", "pos": pos, "row": 0}  # fmt: skip
    after = {"id": id_, "amount": _base64(value, scale)}
    payload = {"before": None, "after": after, "op": "c", "source": source}
    return json.dumps({"schema": schema, "payload": payload})


def test_a_scale_change_within_a_batch_decodes_each_message_at_its_own_scale(spark, tmp_path):
    """ALTER TABLE ... MODIFY amount DECIMAL(12,3) between two messages of one batch: the bytes
    of the first are read at scale 2, of the second at 3 (one decoder for the table read the
    first as 1.234, ten times too small), and the table takes the wider type."""
    landing = tmp_path / "landing" / "events.jsonl"
    landing.parent.mkdir()
    lines = [_scaled_message(10, 1, "12.34", 10, 2), _scaled_message(20, 2, "12.345", 12, 3)]
    landing.write_text("\n".join(lines) + "\n")
    warehouse = tmp_path / "warehouse"
    table = TableConfig(name="t", source_table="inv.t", primary_key=["id"])
    replay(spark, warehouse, [landing], SourceConfig(name="s", format="debezium", tables=[table]),
           DATE)  # fmt: skip
    rows = lake.read(spark, lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse))
    assert dict(rows.dtypes)["amount"] == "decimal(12,3)"
    got = {r["id"]: r["amount"] for r in rows.select("id", "amount").toArrow().to_pylist()}
    assert got == {1: Decimal("12.340"), 2: Decimal("12.345")}
