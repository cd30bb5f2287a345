"""The ``datahub-tuple`` format: DataHub Tuple records (DataWorks real-time sync), landed as JSON
objects of their fields.

Seed 003 shows its Tuple example as a table of field values (tests/fixtures/seeds/
003_datahub_tuple_table.json, verbatim): replayed as printed it is quarantined as invalid JSON;
turned into the four records it describes it parses to an insert, one paired update and a delete.
"""

import datetime as dt
import json
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from cdc_platform.catalog import SourceConfig
from cdc_platform.formats import canonical as C
from cdc_platform.formats import datahub_tuple, detect
from cdc_platform.ingest import landing
from cdc_platform.steps.replay import replay
from tests.conftest import FIXTURES
from tests.tables import changelog, current, quarantine, write_lines

pytestmark = pytest.mark.spark

SEED = FIXTURES / "seeds"
DATE = "2026-01-01"
SOURCE = "t"
USERS = "shop.users"
ITEMS = "inventory.public.items"
TYPES = {"id": "bigint", "name": "string", "score": "double"}
T0 = 1767225600000  # 2026-01-01T00:00:00Z


def _ms(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def _seed_table() -> tuple[str, list[dict]]:
    """The verbatim Tuple example, and the records it shows: five field names, then five values
    per record (the document prints one cell per line, blank lines between)."""
    text = (SEED / "003_datahub_tuple_table.json").read_text(encoding="utf-8")
    cells = [c.strip() for c in text.splitlines() if c.strip()]
    names, values = cells[:5], cells[5:]
    assert len(values) == 4 * len(names)
    records = [dict(zip(names, values[i : i + 5], strict=True)) for i in range(0, len(values), 5)]
    return text, records


def _parse(spark, tmp_path: Path, lines: list[str]) -> list[dict]:
    """Parsed records of landing lines, without the pipeline (no Delta)."""
    raw = landing.read_file(write_lines(tmp_path / "parse.jsonl", lines), DATE, SOURCE)
    df = datahub_tuple.parse(spark.createDataFrame(raw), {})
    return df.orderBy("line").toArrow().to_pylist()


def _rec(op: str, seq: str | None, row: dict, before: str = "N", after: str = "N",
         table: str | None = USERS, at: int | None = None) -> str:  # fmt: skip
    """One Tuple record as landed: meta columns, then the table's own columns."""
    meta = {"_sequence_id_": seq, "_operation_type_": op,
            "_excute_time_": at if at is not None else T0 + int(seq or 0),
            "_source_table_": table, "_before_image_": before, "_after_image_": after}  # fmt: skip
    return json.dumps({k: v for k, v in meta.items() if v is not None} | row)


def _i(seq, row, **kw):
    return _rec("I", seq, row, after="Y", **kw)


def _ub(seq, row, **kw):
    return _rec("U", seq, row, before="Y", **kw)


def _ua(seq, row, **kw):
    return _rec("U", seq, row, after="Y", **kw)


def _d(seq, row, **kw):
    return _rec("D", seq, row, before="Y", **kw)


def _user(i: int, name: str, score: float) -> dict:
    return {"id": i, "name": name, "score": score}


def _replay(spark, warehouse, files):
    return replay(
        spark, warehouse, files,
        SourceConfig(name=SOURCE, format="datahub-tuple", primary_key=["id"], column_types=TYPES),
        DATE,
    )  # fmt: skip


# --- the format's contract -------------------------------------------------------------------


def test_parse_returns_raw_columns_plus_exactly_the_parsed_schema(spark):
    raw = spark.createDataFrame([], "topic string, value binary, key binary, line bigint")
    parsed = datahub_tuple.parse(raw, {})
    assert parsed.columns[: len(raw.columns)] == raw.columns
    assert [(f.name, f.dataType) for f in parsed.schema.fields[len(raw.columns) :]] == [
        (f.name, f.dataType) for f in C.PARSED_SCHEMA.fields
    ]
    assert datahub_tuple.column_specs("anything") == {}  # types come from configuration


# --- seed 003: the Tuple example -------------------------------------------------------------


def test_seed_003_tuple_example(spark, tmp_path):
    text, records = _seed_table()
    assert [r["_operation_type_"] for r in records] == ["I", "U", "U", "D"]
    extra = [
        # Qualified source tables, a microsecond time, a table keyed by DataWorks' row id.
        _i("5", {"#alibaba_rds_row_id#": 7, "a": "x"}, table="db1.tbl", at=1649991726000123),
        _i("6", {"a": "y"}, table="db1.s1.tbl", at=1649991726000),
    ]
    lines = [json.dumps(r) for r in records] + extra + [text.replace("\n", "")]
    parsed = _parse(spark, tmp_path, lines)

    assert [(p["kind"], p["op"]) for p in parsed] == [
        ("change", "c"), ("control", None), ("change", "u"), ("change", "d"),
        ("change", "c"), ("change", "c"), ("error", None),
    ]  # fmt: skip
    insert, before_half, update, delete = parsed[:4]
    # The U pair is one update: the before image from the _before_image_=Y record.
    assert before_half["reason"].startswith("update before image paired with its after image")
    assert (update["before_image"], update["after_image"]) == ([], [])  # no table columns shown
    assert (insert["before_image"], insert["after_image"]) == (None, [])
    assert (delete["before_image"], delete["after_image"]) == ([], None)
    assert [p["source_sequence"] for p in (insert, update, delete)] == [
        "1:01649991610688000000", "1:01649991610688000001", "1:01649991610688000002"
    ]  # fmt: skip
    # _excute_time_ is 13-digit epoch milliseconds in the example.
    assert [p["event_time"] for p in (insert, update, delete)] == [
        _ms(1649991726000), _ms(1649991756000), _ms(1649991774000)
    ]  # fmt: skip
    # No _source_table_ in the example: a Tuple topic holds one table, named by the topic.
    assert {(p["database"], p["schema"], p["table"]) for p in parsed[:4]} == {(None, None, "t")}
    assert all(
        (p["source_format"], p["image_encoding"], p["after_partial"], p["value_schema"])
        == ("datahub-tuple", "json", False, None)
        for p in parsed
    )
    row_id, three_parts, verbatim = parsed[4:]
    assert (row_id["database"], row_id["schema"], row_id["table"]) == ("db1", None, "tbl")
    assert row_id["key_columns"] == ["#alibaba_rds_row_id#"]
    assert row_id["event_time"] == _ms(1649991726000) + dt.timedelta(microseconds=123)
    assert dict(row_id["after_image"]) == {"#alibaba_rds_row_id#": "7", "a": "x"}
    assert (three_parts["database"], three_parts["schema"], three_parts["table"]) == (
        "db1", "s1", "tbl"
    )  # fmt: skip
    assert three_parts["key_columns"] is None
    assert verbatim["reason"] == "invalid JSON: not a JSON object"


# --- end to end ------------------------------------------------------------------------------


@pytest.mark.connect  # its [connect] run: the whole path on Spark Connect
def test_end_to_end_inserts_paired_updates_deletes_and_errors(spark, warehouse, tmp_path):
    seed_text, _ = _seed_table()
    records = [
        _i("10", _user(1, "ann", 1.5)),
        _i("11", _user(2, "bob", 2.5)),
        _i("12", _user(3, "cid", 3.5)),
        _ua("13", _user(1, "ann", 9.5)),  # the after half first: pairing is order-free
        _ub("13", _user(1, "ann", 1.5)),
        _d("14", _user(2, "bob", 2.5)),
        _i("16", _user(4, "dan", 4.5)),
        _ub("17", _user(4, "dan", 4.5)),  # an update that changes the key: 4 -> 40
        _ua("17", _user(40, "dan", 4.5)),
        _i("18", _user(1, "widget", 0.5), table=ITEMS),
        _ub("15", _user(3, "cid", 3.5)),  # no after half in the batch
        _rec("X", "19", _user(5, "eve", 5.0)),  # unknown operation
        _rec("I", None, _user(6, "fay", 6.0), after="Y"),  # no _sequence_id_: cannot be ordered
        seed_text.replace("\n", ""),  # the seed's table as printed: invalid JSON
        _ua("20", _user(3, "cid", 7.5)),  # an after half whose before half came earlier
    ]
    f = write_lines(tmp_path / "users.jsonl", records)
    summary, result = _replay(spark, warehouse, [f])

    assert summary == {
        "tables": {
            USERS: {"inserted": 4, "updated": 3, "deleted": 1, "rows": 3},
            ITEMS: {"inserted": 1, "updated": 0, "deleted": 0, "rows": 1},
        },
        "quarantined": 4,
    }
    assert (result.control, result.ddl) == (2, 0)  # the two consumed before halves
    assert current(spark, warehouse, SOURCE, USERS, "id") == [
        _user(1, "ann", 9.5), _user(3, "cid", 7.5), _user(40, "dan", 4.5)
    ]  # fmt: skip
    assert current(spark, warehouse, SOURCE, ITEMS, "id") == [_user(1, "widget", 0.5)]
    reasons = {q["line"]: q["reason"] for q in quarantine(spark, warehouse, SOURCE)}
    assert reasons[11].startswith("unpaired update: the before image (_sequence_id_ 15)")
    assert reasons[12] == "unknown DataHub Tuple _operation_type_ 'X'"
    assert reasons[13].startswith("_sequence_id_ 'null' is not an integer")
    assert reasons[14] == "invalid JSON: not a JSON object"
    changes = changelog(spark, warehouse, SOURCE, USERS)
    assert [(c["op"], c["key"], c["before"], c["after"]) for c in changes] == [
        ("c", {"id": 1}, None, _user(1, "ann", 1.5)),
        ("c", {"id": 2}, None, _user(2, "bob", 2.5)),
        ("c", {"id": 3}, None, _user(3, "cid", 3.5)),
        ("u", {"id": 1}, _user(1, "ann", 1.5), _user(1, "ann", 9.5)),
        ("d", {"id": 2}, _user(2, "bob", 2.5), None),
        ("c", {"id": 4}, None, _user(4, "dan", 4.5)),
        ("u", {"id": 40}, _user(4, "dan", 4.5), _user(40, "dan", 4.5)),
        ("u", {"id": 3}, None, _user(3, "cid", 7.5)),  # the lone after half: no before image
    ]
    assert [c["event_time"] for c in changes] == [
        _ms(T0 + s) for s in (10, 11, 12, 13, 14, 16, 17, 20)
    ]  # fmt: skip
    assert {(c["database"], c["schema"], c["table"]) for c in changes} == {("shop", None, "users")}
    [item] = changelog(spark, warehouse, SOURCE, ITEMS)
    assert (item["database"], item["schema"], item["table"]) == ("inventory", "public", "items")


def test_claims_and_detection(spark):
    docs = [
        _i("1", _user(1, "ann", 1.5)),
        json.dumps({"_operation_type_": "I", "id": 1}),
        (SEED / "003_datahub_blob_insert.json").read_text(encoding="utf-8"),
    ]
    df = spark.createDataFrame([(d,) for d in docs], "value string")
    keys = F.json_object_keys("value")
    rows = df.select(
        datahub_tuple.claims(keys, F.col("value"), F.lit(None)),
        detect.claimants(keys, F.col("value")),
    ).collect()
    assert [r[0] for r in rows] == [True, False, False]
    assert rows[0][1] == ["datahub-tuple"]  # format: auto gives Tuple records to this format
