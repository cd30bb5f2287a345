"""``infer_types``: messages without a schema (Debezium's JsonConverter with schemas.enable=false)
type their columns by their JSON tokens: integral numbers bigint, other numbers double, booleans
boolean; strings stay strings, even "7". A batch's tokens are merged (integers and fractions:
double). A later batch keeps the table's types where they hold its tokens (integers in a double
column), and a token they cannot hold is that message's type mismatch: Delta does not widen
bigint to double (it would lose digits above 2^53), and neither do we."""

import json

import pytest

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.steps.current import current_rows
from cdc_platform.steps.replay import replay

pytestmark = pytest.mark.spark


def _change(pos: int, after: dict) -> str:
    source = {"connector": "mysql", "db": "inv", "table": "t", "ts_ms": 1000 + pos,
              "file": "mysql-bin.000001", "pos": pos, "row": 0}  # fmt: skip
    return json.dumps({"before": None, "after": after, "op": "c", "source": source})


def _replay(spark, tmp_path, warehouse, day: str, rows: list[dict], infer: bool) -> None:
    landing = tmp_path / day / "events.jsonl"
    landing.parent.mkdir()
    start = 100 * int(day[-2:])
    landing.write_text("\n".join(_change(start + i, r) for i, r in enumerate(rows)) + "\n")
    table = TableConfig(name="t", source_table="inv.t", primary_key=["id"])
    source = SourceConfig(name="s", format="debezium", tables=[table], infer_types=infer)
    replay(spark, warehouse, [landing], source, day)


FIRST = [
    {"id": 1, "qty": 5, "price": 1.5, "ok": True, "name": "7", "code": 1, "tags": [1],
     "gone": None},
    {"id": 2, "qty": 6, "price": 2, "ok": False, "name": "x", "code": "A", "tags": None,
     "gone": None},
]  # fmt: skip
LATER = [
    {"id": 3, "qty": 7, "price": 3, "ok": None, "name": "y", "code": "B", "tags": [], "gone": None},
    {"id": 4, "qty": 7.25, "price": 4, "ok": True, "name": "z", "code": "C", "tags": [],
     "gone": None},
]  # fmt: skip


def test_infer_types_types_schemaless_columns_by_their_tokens(spark, tmp_path):
    warehouse = tmp_path / "warehouse"
    _replay(spark, tmp_path, warehouse, "2026-03-01", FIRST, infer=True)
    first = current_rows(spark, warehouse, "s", "t")
    types = dict(first.dtypes)
    assert {c: types[c] for c in ("id", "qty", "price", "ok", "name", "code", "tags")} == {
        "id": "bigint", "qty": "bigint", "price": "double", "ok": "boolean",
        "name": "string",  # a JSON string stays a string
        "code": "string",  # a number and a string in one batch: string
        "tags": "string",  # an array keeps its JSON text
    }  # fmt: skip
    assert types["gone"] == "string"  # only nulls: nothing to infer from

    # A later batch: integers in the double column are doubles; a fraction in the bigint column
    # is a type mismatch of its message.
    _replay(spark, tmp_path, warehouse, "2026-03-02", LATER, infer=True)
    later = current_rows(spark, warehouse, "s", "t")
    assert dict(later.dtypes)["qty"] == "bigint" and dict(later.dtypes)["price"] == "double"
    rows = later.select("id", "qty", "price", "ok", "name").orderBy("id").toArrow().to_pylist()
    assert rows == [
        {"id": 1, "qty": 5, "price": 1.5, "ok": True, "name": "7"},
        {"id": 2, "qty": 6, "price": 2.0, "ok": False, "name": "x"},
        {"id": 3, "qty": 7, "price": 3.0, "ok": None, "name": "y"},
    ]
    quarantine = lake.read_arrow(lake.TableRef(lake.QUARANTINE, "s").uri(warehouse))
    assert quarantine.column("reason").to_pylist() == [
        "type mismatch: after.qty = 7.25 is not bigint"
    ]


def test_without_infer_types_schemaless_columns_are_strings(spark, tmp_path):
    warehouse = tmp_path / "warehouse"
    _replay(spark, tmp_path, warehouse, "2026-03-01", FIRST, infer=False)
    types = dict(current_rows(spark, warehouse, "s", "t").dtypes)
    assert {types[c] for c in ("id", "qty", "price", "ok", "name")} == {"string"}
