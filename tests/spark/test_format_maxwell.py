"""Maxwell JSON (``cdc_platform.formats.maxwell``): the ../shared/corpus file against EXPECTED.json
and an end-to-end replay with transactions, bootstrap, DDL and bad messages."""

import datetime as dt
import json
import struct
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.formats import canonical as C
from cdc_platform.formats import json_records as J
from cdc_platform.formats import maxwell
from cdc_platform.ingest import landing
from cdc_platform.steps.replay import replay
from tests.conftest import CORPUS
from tests.tables import changelog, current, write_lines

pytestmark = pytest.mark.spark

DATE = "2026-01-01"
SOURCE = SourceConfig(name="t", format="maxwell")


def _source(**settings) -> SourceConfig:
    """SOURCE with a key or column types for every table."""
    return SourceConfig(name="t", format="maxwell", **settings)


# EXPECTED.json names the types Flink's test declares ("INT NOT NULL", "STRING", "FLOAT").
FLINK_TO_SQL = {"INT": "int", "STRING": "string", "FLOAT": "float", "DOUBLE": "double"}


def _column_types(entry: dict) -> dict[str, str]:
    return {c: FLINK_TO_SQL[t.split()[0]] for c, t in entry["column_types"].items()}


def _float32(x):
    return None if x is None else struct.unpack("f", struct.pack("f", x))[0]


def _comparable(rows: list[dict], entry: dict) -> list[dict]:
    f32 = [c for c, how in entry.get("compare", {}).items() if how == "float32"]
    return [{c: _float32(v) if c in f32 else v for c, v in r.items()} for r in rows]


def _parse(spark, tmp_path: Path, messages: list) -> list[dict]:
    path = write_lines(tmp_path / "parse.jsonl", messages)
    raw = spark.createDataFrame(landing.read_files([(path, path.name)], DATE, topic="t"))
    return maxwell.parse(raw, {}).orderBy("line").toArrow().to_pylist()


def _s(seconds: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def _m(typ: str, data=None, ts=1700000000, table="orders", **extra) -> dict:
    m = {"database": "shop", "table": table, "type": typ, "ts": ts, "data": data}
    if typ in ("insert", "update", "delete", "bootstrap-insert"):
        m["primary_key_columns"] = ["id"]
    return {**m, **extra}


# --- format module ----------------------------------------------------------------------------


def test_claims(spark):
    values = {
        "row": _m("insert", {"id": 1}, xid=5, commit=True),
        "ddl": {
            "type": "table-alter",
            "database": "d",
            "table": "t",
            "ts": 1,
            "sql": "ALTER",
            "def": {},
        },  # fmt: skip
        "canal": {
            "data": [],
            "type": "INSERT",
            "pkNames": [],
            "database": "d",
            "table": "t",
            "ts": 1,
        },  # fmt: skip
        "ogg": {"table": "A.B", "op_type": "I", "after": {}},
    }
    df = spark.createDataFrame([(k, json.dumps(v)) for k, v in values.items()], ["name", "value"])
    keys = F.json_object_keys("value")
    claims = maxwell.claims(keys, F.col("value"), J.probe(keys, maxwell.CLAIM_PATHS))
    got = {r["name"]: r["c"] for r in df.select("name", claims.alias("c")).collect()}
    assert got == {"row": True, "ddl": True, "canal": False, "ogg": False}
    assert maxwell.column_specs("{}") == {}


def test_parse_returns_the_parsed_schema_and_never_raises(spark, tmp_path):
    messages = [
        "not json",
        "[]",
        _m("insert", None),
        _m("insert", [1, 2]),
        _m("upsert", {"id": 1}),
        {"database": "shop", "type": "insert", "data": {"id": 1}},
        {"database": "shop", "table": "orders", "data": {"id": 1}},
        _m("bootstrap-start", {}),
        _m("table-alter", None, sql="ALTER TABLE orders ADD c int", **{"def": {}}),
        _m("table-alter", None, sql="TRUNCATE TABLE orders"),
    ]
    path = write_lines(tmp_path / "bad.jsonl", messages)
    raw = spark.createDataFrame(landing.read_files([(path, path.name)], DATE, topic="t"))
    parsed = maxwell.parse(raw, {})
    assert parsed.columns == raw.columns + [f.name for f in C.PARSED_SCHEMA.fields]
    for f in C.PARSED_SCHEMA.fields:
        assert parsed.schema[f.name].dataType == f.dataType, f.name
    rows = parsed.orderBy("line").toArrow().to_pylist()
    assert [(r["kind"], r["reason"], r["op"], r["ddl"]) for r in rows] == [
        ("error", "invalid JSON: not a JSON object", None, None),
        ("error", "invalid JSON: not a JSON object", None, None),
        ("error", "Maxwell insert without a 'data' object: no row image", None, None),
        ("error", "Maxwell insert without a 'data' object: no row image", None, None),
        ("error", "unknown Maxwell type 'upsert'", None, None),
        ("error", "no table: table unknown", None, None),
        ("error", "not a Maxwell message: no 'type' field", None, None),
        ("control", "maxwell bootstrap-start", None, None),
        ("ddl", None, None, "ALTER TABLE orders ADD c int"),
        ("change", None, "t", "TRUNCATE TABLE orders"),
    ]
    assert all(r["source_format"] == "maxwell" and r["after_partial"] is False for r in rows)


def test_images_order_event_time_and_transaction(spark, tmp_path):
    update = json.dumps(
        _m(
            "update",
            {"id": 7, "name": "b", "price": 0, "note": None},
            xid=42,
            xoffset=3,
            old={"name": "a", "note": "was"},
            position="mysql-bin.000012:4567",
        )  # fmt: skip
    ).replace('"price": 0', '"price": 12345678901234567890.123456789')
    rows = _parse(
        spark,
        tmp_path,
        [
            update,
            _m("delete", {"id": 7, "name": "b"}, xid=43, commit=True),
            _m("bootstrap-insert", {"id": 8, "name": "c"}),
        ],
    )
    u, d, r = rows
    assert u["op"] == "u" and u["key_columns"] == ["id"]
    # Exact numbers; the images' columns sorted (a variant's), a new table's order is the wire's
    # (tests/spark/test_column_order.py).
    assert dict(u["after_image"]) == {
        "id": "7", "name": "b", "price": "12345678901234567890.123456789", "note": None
    }  # fmt: skip
    assert dict(u["before_image"]) == {
        "id": "7", "name": "a", "price": "12345678901234567890.123456789", "note": "was"
    }  # fmt: skip
    assert u["tx_id"] == "42" and u["event_time"] == _s(1700000000)
    assert u["source_sequence"] == "binlog:0000000012.00000000000000004567:0000000003"
    assert (d["op"], d["after_image"], dict(d["before_image"])) == (
        "d",
        None,
        {"id": "7", "name": "b"},
    )
    # no position: the topic position, then the row's place in its transaction (commit: last)
    assert d["source_sequence"].startswith("pos:f") and d["source_sequence"].endswith(":9999999999")
    assert (r["op"], r["before_image"], r["tx_id"]) == ("r", None, None)


# --- corpus -----------------------------------------------------------------------------------


@pytest.mark.connect  # its [connect] run: the whole path on Spark Connect
def test_corpus_file_reaches_final_state(spark, warehouse, expected):
    name = "maxwell/maxwell-data.txt"
    entry = expected[name]
    summary, result = replay(
        spark, warehouse, [CORPUS / name],
        _source(primary_key=entry["primary_key"], column_types=_column_types(entry)),
        DATE,
    )  # fmt: skip

    rows = current(spark, warehouse, "t", entry["table"], "id")
    assert _comparable(rows, entry) == _comparable(entry["final_state"], entry)
    counts = summary["tables"][entry["table"]]
    assert counts["inserted"] == entry["counts"]["insert"]
    assert counts["updated"] == entry["counts"]["update"]
    assert counts["deleted"] == entry["counts"]["delete"]
    assert counts["rows"] == len(entry["final_state"])
    assert result.ddl == entry["counts"]["other"] and summary["quarantined"] == 0
    log = changelog(spark, warehouse, "t", entry["table"])
    # xid 7125 = 9 inserts, 7291 = 2 updates, 7322 = 2 deletes; ts is in seconds
    by_tx: dict[str, list[str]] = {}
    for r in log:
        by_tx.setdefault(r["tx_id"], []).append(r["op"])
    assert by_tx["7125"] == ["c"] * 9 and by_tx["7291"] == ["u", "u"] and by_tx["7322"] == ["d"] * 2
    assert log[0]["event_time"] == _s(1596684883)


# --- end to end -------------------------------------------------------------------------------


def test_end_to_end(spark, warehouse, tmp_path):
    ts = 1700000000
    path = write_lines(
        tmp_path / "maxwell.jsonl",
        [
            _m("bootstrap-start", {}, ts=ts - 100),
            _m("bootstrap-insert", {"id": 1, "name": "boot", "price": "1.5"}, ts=ts - 100),
            _m("bootstrap-complete", {}, ts=ts - 100),
            # one transaction: xoffset on all rows but the last, which has commit=true
            _m("insert", {"id": 2, "name": "two", "price": 2.25}, ts=ts, xid=900, xoffset=0),
            _m("insert", {"id": 3, "name": "three", "price": 3}, ts=ts, xid=900, xoffset=1),
            _m("insert", {"id": 4, "name": "four", "price": 4}, ts=ts, xid=900, commit=True),
            _m(
                "update",
                {"id": 1, "name": "uno", "price": "1.5"},
                ts=ts + 1,
                xid=901,
                commit=True,
                old={"name": "boot"},
            ),  # fmt: skip
            _m(
                "table-alter",
                None,
                ts=ts + 2,
                sql="ALTER TABLE orders ADD note text",
                **{"def": {}},
            ),
            _m("delete", {"id": 3, "name": "three", "price": 3}, ts=ts + 3, xid=902, commit=True),
            _m(
                "update",
                {"id": 2, "name": "two", "price": 0},
                ts=ts + 4,
                xid=903,
                commit=True,
                old={"price": 2.25},
            ),  # fmt: skip
            "{broken json",
            _m("delete", None, ts=ts + 5, xid=904, commit=True),
            _m("insert", {"id": 9, "name": "bad", "price": "not a number"}, ts=ts + 5),
        ],
    )
    # a decimal wider than a double: exact from the wire to the table
    text = path.read_text().replace('"price": 0}', '"price": 12345678901234567890.123456789}')
    path.write_text(text)
    summary, result = replay(
        spark,
        warehouse,
        [path],
        _source(column_types={"id": "int", "price": "decimal(38,9)"}),
        DATE,
    )

    assert current(spark, warehouse, "t", "shop.orders", "id") == [
        {"id": 1, "name": "uno", "price": Decimal("1.5")},
        {"id": 2, "name": "two", "price": Decimal("12345678901234567890.123456789")},
        {"id": 4, "name": "four", "price": Decimal("4")},
    ]
    assert summary["tables"]["shop.orders"] == {
        "inserted": 4,
        "updated": 2,
        "deleted": 1,
        "rows": 3,
    }
    assert (result.control, result.ddl, summary["quarantined"]) == (2, 1, 3)
    log = changelog(spark, warehouse, "t", "shop.orders")
    assert [(r["op"], r["tx_id"]) for r in log] == [
        ("r", None), ("c", "900"), ("c", "900"), ("c", "900"), ("u", "901"), ("d", "902"),
        ("u", "903"),
    ]  # fmt: skip
    assert log[4]["before"] == {"id": 1, "name": "boot", "price": Decimal("1.5")}
    assert [r["event_time"] for r in log[1:4]] == [_s(ts)] * 3
    quarantine = lake.read(spark, lake.TableRef(lake.QUARANTINE, "t").uri(warehouse))
    reasons = sorted(r["reason"] for r in quarantine.toArrow().to_pylist())
    assert reasons == [
        "Maxwell delete without a 'data' object: no row image",
        "invalid JSON: not a JSON object",
        "type mismatch: after.price = not a number is not decimal(38,9)",
    ]
