"""PostgreSQL's special types as Debezium's PostgreSQL connector writes them (its documentation,
"Data type mappings": PostgreSQL basic, other and domain types), with the JsonConverter's schema:
``uuid`` (``io.debezium.data.Uuid``), ``json``/``jsonb`` (``io.debezium.data.Json``), ``money``
(a Connect Decimal of scale ``money.fraction.digits``), ``numeric`` without a precision
(``VariableScaleDecimal``), ``interval`` in both ``interval.handling.mode``s, ``hstore`` in both
``hstore.handling.mode``s, and an unchanged TOASTed column sent as the unavailable-value
placeholder.

Two modes differ by nature, and the table says what the wire said: ``interval.handling.mode``
``numeric`` is an approximate count of microseconds (``MicroDuration``: a month is 30.4375
days), ``string`` the exact ISO 8601 text (``Interval``); ``hstore.handling.mode`` ``json`` is
the connector's JSON text, ``map`` a Connect map, kept as its JSON text."""

import base64
import json
from decimal import Decimal

import pytest

from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.steps.current import current_rows
from cdc_platform.steps.replay import replay

pytestmark = pytest.mark.spark

UUID = "6f1c0e8a-2b3c-4d5e-8f90-123456789abc"
PLACEHOLDER = "__debezium_unavailable_value"


def _field(column: str, kind: str, **more) -> dict:
    return {"field": column, "type": kind, "optional": column != "id", **more}


def _schema(table: str, interval: str, hstore: str) -> dict:
    money = {"scale": "2", "connect.decimal.precision": "19"}
    variable = [{"field": "scale", "type": "int32", "optional": False},
                {"field": "value", "type": "bytes", "optional": False}]  # fmt: skip
    fields = [
        _field("id", "int32"),
        _field("uid", "string", name="io.debezium.data.Uuid", version=1),
        _field("doc", "string", name="io.debezium.data.Json", version=1),
        _field("price", "bytes", name="org.apache.kafka.connect.data.Decimal", version=1,
               parameters=money),
        _field("ratio", "struct", name="io.debezium.data.VariableScaleDecimal", version=1,
               fields=variable),
        _field("span", "int64", name="io.debezium.time.MicroDuration", version=1)
        if interval == "numeric"
        else _field("span", "string", name="io.debezium.time.Interval", version=1),
        _field("attrs", "string", name="io.debezium.data.Json", version=1)
        if hstore == "json"
        else _field("attrs", "map", keys={"type": "string", "optional": False},
                    values={"type": "string", "optional": True}),
        _field("body", "string"),  # a TOASTed text column
    ]  # fmt: skip
    image = {"type": "struct", "fields": fields, "optional": True, "name": f"pg.public.{table}"}
    return {"type": "struct", "name": f"pg.public.{table}.Envelope", "fields": [
        {**image, "field": "before"}, {**image, "field": "after"},
        {"type": "string", "field": "op"}]}  # fmt: skip


def _messages(table: str, interval: str, hstore: str) -> list[str]:
    one = base64.b64encode((314159).to_bytes(3, "big", signed=True)).decode()
    row = {
        "id": 1, "uid": UUID, "doc": '{"vip": true, "tags": ["a"]}',
        "price": base64.b64encode((123456).to_bytes(3, "big", signed=True)).decode(),
        "ratio": {"scale": 5, "value": one},
        # 1 year 2 months 3 days 04:05:06.78, as each mode writes it (numeric: 14 months of
        # 30.4375 days and 3 days, and the time, in µs).
        "span": 37_091_106_780_000 if interval == "numeric" else "P1Y2M3DT4H5M6.78S",
        "attrs": '{"color":"red","size":"L"}' if hstore == "json"
        else {"color": "red", "size": "L"},
        "body": "a long text",
    }  # fmt: skip
    update = {**row, "price": base64.b64encode((99).to_bytes(1, "big")).decode(),
              "body": PLACEHOLDER}  # fmt: skip
    lines = []
    for lsn, (op, before, after) in enumerate([("c", None, row), ("u", row, update)], start=1):
        source = {"connector": "postgresql", "db": "pg", "schema": "public", "table": table,
                  "ts_ms": 1000 + lsn, "lsn": 100 * lsn}  # fmt: skip
        payload = {"before": before, "after": after, "op": op, "source": source}
        lines.append(json.dumps({"schema": _schema(table, interval, hstore), "payload": payload}))
    return lines


def test_postgres_special_types_in_each_mode(spark, tmp_path):
    modes = {"numeric_json": ("numeric", "json"), "string_map": ("string", "map")}
    lines = [line for table, m in modes.items() for line in _messages(table, *m)]
    landing = tmp_path / "landing" / "events.jsonl"
    landing.parent.mkdir()
    landing.write_text("\n".join(lines) + "\n")
    warehouse = tmp_path / "warehouse"
    tables = [TableConfig(name=t, source_table=f"pg.public.{t}", primary_key=["id"]) for t in modes]
    replay(spark, warehouse, [landing], SourceConfig(name="s", format="debezium", tables=tables),
           "2026-03-01")  # fmt: skip

    common = {"id": 1, "uid": UUID, "doc": '{"vip": true, "tags": ["a"]}',
              "price": Decimal("0.99"), "ratio": Decimal("3.14159"),
              "body": "a long text"}  # the placeholder kept the TOASTed value  # fmt: skip
    expected = {
        "numeric_json": {**common, "span": 37_091_106_780_000,
                         "attrs": '{"color":"red","size":"L"}'},
        "string_map": {**common, "span": "P1Y2M3DT4H5M6.78S",
                       "attrs": '{"color":"red","size":"L"}'},
    }  # fmt: skip
    for table, want in expected.items():
        current = current_rows(spark, warehouse, "s", table)
        types = dict(current.dtypes)
        assert types["price"] == "decimal(19,2)" and types["ratio"] == "decimal(38,18)"
        assert types["span"] == ("bigint" if table == "numeric_json" else "string")
        assert current.select(*want).toArrow().to_pylist() == [want], table
