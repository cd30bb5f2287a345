"""Oracle GoldenGate JSON (``cdc_platform.formats.ogg``): the ../shared/corpus file against
EXPECTED.json and an end-to-end replay with inserts, updates, deletes, a truncate and bad input."""

import datetime as dt
import json
import struct
from decimal import Decimal

import pytest
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.formats import canonical as C
from cdc_platform.formats import json_records as J
from cdc_platform.formats import ogg
from cdc_platform.ingest import landing
from cdc_platform.steps.replay import replay
from tests.conftest import CORPUS
from tests.tables import changelog, current, write_lines

pytestmark = pytest.mark.spark

DATE = "2026-01-01"
SOURCE = SourceConfig(name="t", format="ogg")


def _source(**settings) -> SourceConfig:
    """SOURCE with a key or column types for every table."""
    return SourceConfig(name="t", format="ogg", **settings)


FLINK_TO_SQL = {"INT": "int", "STRING": "string", "FLOAT": "float", "DOUBLE": "double"}


def _column_types(entry: dict) -> dict[str, str]:
    return {c: FLINK_TO_SQL[t.split()[0]] for c, t in entry["column_types"].items()}


def _float32(x):
    return None if x is None else struct.unpack("f", struct.pack("f", x))[0]


def _comparable(rows: list[dict], entry: dict) -> list[dict]:
    f32 = [c for c, how in entry.get("compare", {}).items() if how == "float32"]
    return [{c: _float32(v) if c in f32 else v for c, v in r.items()} for r in rows]


def _op(op_type: str, pos: int, op_ts: str, table="HR.EMP", **images) -> dict:
    m = {"table": table, "op_type": op_type, "op_ts": op_ts,
         "current_ts": "2024-03-01T10:00:09.000000", "pos": f"{pos:020d}",
         "primary_keys": ["ID"]}  # fmt: skip
    return {**m, **images}


# --- format module ----------------------------------------------------------------------------


def test_claims(spark):
    values = {
        "ogg": _op("I", 1, "2024-03-01 10:00:00.000000", after={"ID": 1}),
        "truncate": {"table": "HR.EMP", "op_type": "T", "pos": "1"},
        "debezium": {"op": "c", "source": {}, "after": {}},
        "maxwell": {"database": "d", "table": "t", "type": "insert", "ts": 1, "data": {}},
    }
    df = spark.createDataFrame([(k, json.dumps(v)) for k, v in values.items()], ["name", "value"])
    keys = F.json_object_keys("value")
    claims = ogg.claims(keys, F.col("value"), J.probe(keys, ogg.CLAIM_PATHS))
    got = {r["name"]: r["c"] for r in df.select("name", claims.alias("c")).collect()}
    assert got == {"ogg": True, "truncate": True, "debezium": False, "maxwell": False}
    assert ogg.column_specs("{}") == {}


def test_parse_returns_the_parsed_schema_and_never_raises(spark, tmp_path):
    ts = "2024-03-01 10:00:00.000000"
    messages = [
        "garbage",
        '"a string"',
        {"table": "HR.EMP", "after": {"ID": 1}},
        _op("X", 1, ts, after={"ID": 1}),
        {"op_type": "I", "after": {"ID": 1}},
        _op("I", 2, ts),
        _op("D", 3, ts),
        _op("U", 4, ts, before={"ID": 1}, after={"ID": 1, "N": 2.5}),
        _op("T", 5, ts),
        _op("I", 6, ts, table="PDB1.HR.EMP", after={"ID": 1}),
    ]
    path = write_lines(tmp_path / "bad.jsonl", messages)
    raw = spark.createDataFrame(landing.read_files([(path, path.name)], DATE, topic="t"))
    parsed = ogg.parse(raw, {})
    assert parsed.columns == raw.columns + [f.name for f in C.PARSED_SCHEMA.fields]
    for f in C.PARSED_SCHEMA.fields:
        assert parsed.schema[f.name].dataType == f.dataType, f.name
    rows = parsed.orderBy("line").toArrow().to_pylist()
    assert [(r["kind"], r["reason"], r["op"]) for r in rows] == [
        ("error", "invalid JSON: not a JSON object", None),
        ("error", "invalid JSON: not a JSON object", None),
        ("error", "not a GoldenGate message: no 'op_type' field", None),
        ("error", "unknown GoldenGate op_type 'X'", None),
        ("error", "no table: table unknown", None),
        ("error", "op_type I without an after image", None),
        ("error", "delete without a before image: the row cannot be identified", None),
        ("change", None, "u"),
        ("change", None, "t"),
        ("change", None, "c"),
    ]
    update, truncate, pdb = rows[7], rows[8], rows[9]
    assert (update["schema"], update["table"], update["database"]) == ("HR", "EMP", None)
    assert update["after_image"] == [("ID", "1"), ("N", "2.5")]
    assert update["source_sequence"] == "pos:" + "4".zfill(32)
    assert update["event_time"] == dt.datetime(2024, 3, 1, 10, tzinfo=dt.UTC)
    assert truncate["before_image"] is None and truncate["after_image"] is None
    assert (pdb["database"], pdb["schema"], pdb["table"]) == ("PDB1", "HR", "EMP")
    assert all(r["source_format"] == "ogg" and r["after_partial"] is False for r in rows)


# --- corpus -----------------------------------------------------------------------------------


@pytest.mark.connect  # its [connect] run: the whole path on Spark Connect
def test_corpus_file_reaches_final_state(spark, warehouse, expected):
    name = "ogg/ogg-data.txt"
    entry = expected[name]
    summary, result = replay(
        spark, warehouse, [CORPUS / name],
        _source(primary_key=entry["primary_key"], column_types=_column_types(entry)),
        DATE,
    )  # fmt: skip

    rows = current(spark, warehouse, "t", entry["table"], entry["primary_key"][0])
    assert _comparable(rows, entry) == _comparable(entry["final_state"], entry)
    counts = summary["tables"][entry["table"]]
    assert counts["inserted"] == entry["counts"]["insert"]
    assert counts["updated"] == entry["counts"]["update"]
    assert counts["deleted"] == entry["counts"]["delete"]
    assert counts["rows"] == len(entry["final_state"])
    assert result.ddl == entry["counts"]["other"] and summary["quarantined"] == 0
    log = changelog(spark, warehouse, "t", entry["table"])
    # pos orders the changes; op_ts does not (pos ...157 ran "before" ...156)
    assert [r["sequence"][:36] for r in log] == ["pos:" + str(p).zfill(32) for p in range(143, 159)]
    assert log[0]["event_time"] == dt.datetime(2020, 5, 13, 15, 40, 6, tzinfo=dt.UTC)
    assert log[14]["event_time"] < log[13]["event_time"]
    assert (log[0]["schema"], log[0]["table"], log[0]["database"]) == ("OGG", "TBL_TEST", None)


# --- end to end -------------------------------------------------------------------------------


def test_end_to_end(spark, warehouse, tmp_path):
    t = "2024-03-01 10:00:{:02d}.000000"
    path = write_lines(
        tmp_path / "ogg.jsonl",
        [
            _op("I", 1, t.format(1), after={"ID": 1, "NAME": "one", "SAL": 100.5}),
            _op("I", 2, t.format(2), after={"ID": 2, "NAME": "two", "SAL": 0}),
            _op("I", 3, t.format(3), after={"ID": 3, "NAME": "three", "SAL": 300}),
            # op_ts goes backwards; pos (and file order) says this update comes last for ID 1
            _op(
                "U",
                5,
                t.format(0),
                before={"ID": 1, "NAME": "one", "SAL": 100.5},
                after={"ID": 1, "NAME": "uno", "SAL": 101},
            ),  # fmt: skip
            _op("D", 6, t.format(6), before={"ID": 3, "NAME": "three", "SAL": 300}),
            "not a message",
            _op("D", 7, t.format(7)),  # a delete without its row
            _op("I", 8, t.format(8), table="HR.DEPT", after={"ID": 10, "NAME": "x", "SAL": 1}),
            _op("I", 9, t.format(9), table="HR.DEPT", after={"ID": 11, "NAME": "y", "SAL": 2}),
            _op("T", 10, t.format(10), table="HR.DEPT"),
            _op("I", 11, t.format(11), table="HR.DEPT", after={"ID": 12, "NAME": "z", "SAL": 3}),
            _op("I", 12, t.format(12), after={"ID": 4, "NAME": "four", "SAL": "x"}),
        ],
    )
    text = path.read_text().replace('"SAL": 0}', '"SAL": 12345678901234567890.123456789}')
    path.write_text(text)
    summary, result = replay(
        spark,
        warehouse,
        [path],
        _source(column_types={"ID": "int", "SAL": "decimal(38,9)"}),
        DATE,
    )

    assert current(spark, warehouse, "t", "HR.EMP", "ID") == [
        {"ID": 1, "NAME": "uno", "SAL": Decimal("101")},
        {"ID": 2, "NAME": "two", "SAL": Decimal("12345678901234567890.123456789")},
    ]
    assert current(spark, warehouse, "t", "HR.DEPT", "ID") == [
        {"ID": 12, "NAME": "z", "SAL": Decimal("3")}
    ]
    assert summary["tables"]["HR.EMP"] == {"inserted": 3, "updated": 1, "deleted": 1, "rows": 2}
    assert summary["tables"]["HR.DEPT"] == {"inserted": 3, "updated": 0, "deleted": 0, "rows": 1}
    assert summary["quarantined"] == 3 and result.ddl == 0
    quarantine = lake.read(spark, lake.TableRef(lake.QUARANTINE, "t").uri(warehouse))
    assert sorted(r["reason"] for r in quarantine.toArrow().to_pylist()) == [
        "delete without a before image: the row cannot be identified",
        "invalid JSON: not a JSON object",
        "type mismatch: after.SAL = x is not decimal(38,9)",
    ]
    assert [r["op"] for r in changelog(spark, warehouse, "t", "HR.DEPT")] == ["c", "c", "t", "c"]
