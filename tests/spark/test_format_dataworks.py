"""The ``dataworks`` format: DataWorks real-time sync JSON (Kafka, and DataHub Blob topics).

Every example of seeds 001 (DataWorks to Kafka) and 003 (DataWorks to DataHub, Blob) replayed from
tests/fixtures/seeds/ (see the README there), the ../shared/corpus/dataworks files against
EXPECTED.json, and an end-to-end replay with both update styles, DDL and control messages.

Landing files hold one message per line: valid JSON fixtures are re-serialized on one line, invalid
ones keep their bytes minus the line breaks.
"""

import datetime as dt
import json
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.formats import canonical as C
from cdc_platform.formats import dataworks, detect
from cdc_platform.formats import json_records as J
from cdc_platform.formats.column_specs import ColumnSpec
from cdc_platform.normalize import table_name
from cdc_platform.steps.current import current_rows
from cdc_platform.steps.replay import replay
from tests.conftest import CORPUS, FIXTURES, SEEDS
from tests.tables import changelog, current, quarantine, write_lines

SEED = FIXTURES / "seeds"
DATE = "2026-01-01"
SOURCE = "t"
SEED_DOCS = {"001": SEEDS / "001_69964fe312001323.txt", "003": SEEDS / "003_e51400503c8b3855.txt"}
FIXTURE_NAMES = sorted(p.name for p in SEED.glob("00[13]_*.json"))
INVALID_AS_PRINTED = {
    "001_dataworks_format_definition.json",  # // comments
    "003_datahub_blob_format_definition.json",  # // comments, a bare XXX, commas in comments
    "003_datahub_tuple_table.json",  # a table of field values, not JSON
}


# --- helpers ---------------------------------------------------------------------------------


def _text(name: str) -> str:
    return (SEED / name).read_text(encoding="utf-8")


def _line(name: str) -> str:
    """The fixture as one landing line: JSON on one line, or the verbatim bytes minus newlines."""
    text = _text(name)
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except json.JSONDecodeError:
        return text.replace("\r", "").replace("\n", "")


def _replay(spark, warehouse, files, key=None, types=None):
    return replay(
        spark, warehouse, files,
        SourceConfig(name=SOURCE, format="dataworks", primary_key=key, column_types=types or {}),
        DATE,
    )  # fmt: skip


def _parsed(spark, warehouse) -> list[dict]:
    """The format's parsed records of everything in raw, by landing position."""
    raw = lake.read(spark, lake.TableRef(lake.RAW, SOURCE).uri(warehouse))
    return dataworks.parse(raw, {}).orderBy("ingest_date", "file", "line").toArrow().to_pylist()


def _ms(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def _position(change: dict) -> str:
    """The format's own part of the sequence (before the raw-position tie-break)."""
    return change["sequence"].split("|")[0]


def _columns(df_schema: T.StructType) -> dict[str, T.DataType]:
    return {f.name: f.dataType for f in df_schema.fields}


# --- the fixtures are the seed's bytes; completed copies only the documented repairs --------

_COMMENT = re.compile(r"[ \t]*//[^\n]*")  # the documentation's // annotations
_PLACEHOLDER = re.compile(r":XXX\b")  # "sequenceId":XXX, a bare placeholder
_SWALLOWED_COMMA = re.compile(r'(["\d\]}])(\n[ \t]*")')  # a comma that sat inside a comment


def _repair(text: str) -> str:
    return _SWALLOWED_COMMA.sub(r"\1,\2", _PLACEHOLDER.sub(':"XXX"', _COMMENT.sub("", text)))


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_seed_fixtures_are_verbatim_and_completed_only_by_the_documented_repairs(name):
    text = _text(name)
    seed = SEED_DOCS[name[:3]].read_text(encoding="utf-8")
    if name.endswith(".completed.json"):
        verbatim = _text(name.replace(".completed", ""))
        assert _repair(verbatim) == text  # byte for byte
        assert isinstance(json.loads(text), dict)
        return
    assert text in seed  # byte for byte, indentation included
    if name in INVALID_AS_PRINTED:
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)
    else:
        assert isinstance(json.loads(text), dict)


def test_parse_returns_raw_columns_plus_exactly_the_parsed_schema(spark):
    raw = spark.createDataFrame([], "topic string, value binary, key binary, line bigint")
    parsed = dataworks.parse(raw, {})
    assert parsed.columns[: len(raw.columns)] == raw.columns
    assert [(f.name, f.dataType) for f in parsed.schema.fields[len(raw.columns) :]] == [
        (f.name, f.dataType) for f in C.PARSED_SCHEMA.fields
    ]


def test_column_specs_type_the_dataworks_types():
    value_schema = json.dumps(
        [{"name": n, "type": t} for n, t in [("b", "BOOLEAN"), ("d", "DOUBLE"), ("t", "DATE"),
         ("x", "BYTES"), ("l", "LONG"), ("s", "STRING"), ("o", "GEOMETRY")]]
    )  # fmt: skip
    assert dataworks.column_specs(value_schema) == {
        "b": ColumnSpec("boolean"),
        "d": ColumnSpec("double"),
        "t": ColumnSpec("timestamp", "epoch_millis"),  # 13-digit epoch ms, exact in a timestamp
        "x": ColumnSpec("binary", "base64"),
        "l": ColumnSpec("bigint"),
        "s": ColumnSpec("string"),
        "o": ColumnSpec("string"),  # not a DataWorks type: kept as text
    }
    assert dataworks.column_specs("null") == {}


# --- seeds 001 and 003 (Blob), and the end-to-end topic below: one replay --------------------

NO_PK = "pkset_test.pkset_test_no_pk"  # seed 001
PK_TABLE = "yunshi_db.t_shiyu_pk"  # seed 003
ROW_ID = "#alibaba_rds_row_id#"
MAN = {"name": "name11", "job": "job11", "sex": "man", ROW_ID: 15}
WOMAN = {**MAN, "sex": "woman"}
SEED_001 = [
    "001_dataworks_format_definition.json",  # invalid JSON as printed
    "001_dataworks_format_definition.completed.json",  # op is the list of ops: unknown
    "001_dataworks_heartbeat.json",
    "001_dataworks_insert_no_pk.json",
    "001_dataworks_update_before.json",  # the two-message update ...
    "001_dataworks_update_after.json",  # ... paired on sequenceId
    "001_dataworks_update_in_one.json",  # the one-message update, same sequenceId
    "001_dataworks_delete.json",
]
SEED_003 = [
    "003_datahub_blob_format_definition.json",  # invalid JSON as printed
    "003_datahub_blob_format_definition.completed.json",  # op is the list of ops: unknown
    "003_datahub_blob_insert.json",
    "003_datahub_blob_update_before.json",
    "003_datahub_blob_update_after.json",
    "003_datahub_blob_delete.json",
    "003_datahub_blob_heartbeat.json",
    "003_datahub_blob_ddl.json",
]


@pytest.fixture(scope="module")
def replayed(spark, tmp_path_factory) -> SimpleNamespace:
    """One replay (each costs seconds of Spark) of the seed 001 and 003 examples and the
    end-to-end topic, one landing file each; results are read back per file."""
    d = tmp_path_factory.mktemp("dataworks")
    warehouse = d / "warehouse"
    files = {
        "001": write_lines(d / "seed001.jsonl", [_line(n) for n in SEED_001]),
        "003": write_lines(d / "seed003.jsonl", [_line(n) for n in SEED_003]),
        "e2e": write_lines(d / "orders.jsonl", _end_to_end_messages()),
    }
    summary, result = _replay(spark, warehouse, list(files.values()))
    parsed, quarantined = _parsed(spark, warehouse), quarantine(spark, warehouse, SOURCE)

    def of(rows: list[dict], name: str) -> list[dict]:
        return [r for r in rows if r["file"] == str(files[name].resolve())]

    return SimpleNamespace(
        warehouse=warehouse,
        summary=summary,
        result=result,
        parsed={k: of(parsed, k) for k in files},
        quarantined={k: of(quarantined, k) for k in files},
    )


def test_seed_examples_replay_summary(replayed):
    assert {t: replayed.summary["tables"][t] for t in (NO_PK, PK_TABLE)} == {
        NO_PK: {"inserted": 1, "updated": 2, "deleted": 1, "rows": 0},
        PK_TABLE: {"inserted": 1, "updated": 1, "deleted": 1, "rows": 0},
    }
    # error: the format definition, verbatim and completed (its op); control: the heartbeat and
    # the UPDATE_BEFOR consumed by its UPDATE_AFTER; ddl: ALTER (seed 003)
    assert Counter(p["kind"] for p in replayed.parsed["001"]) == {
        "change": 4, "control": 2, "error": 2
    }  # fmt: skip
    assert Counter(p["kind"] for p in replayed.parsed["003"]) == {
        "change": 3, "control": 2, "error": 2, "ddl": 1
    }  # fmt: skip
    assert replayed.summary["quarantined"] == 2 + 2 + 5  # seeds 001, 003, the end-to-end topic
    assert (replayed.result.messages, replayed.result.control, replayed.result.ddl) == (
        8 + 8 + 28, 2 + 2 + 8, 1 + 1
    )  # fmt: skip


def test_seed_001_examples(spark, replayed):
    # primaryKey is null: keyed by the synthetic row-id column, typed LONG -> bigint.
    assert replayed.result.tables[table_name(NO_PK)].key == [ROW_ID]
    changes = changelog(spark, replayed.warehouse, SOURCE, NO_PK)
    assert [(c["op"], c["key"], c["before"], c["after"]) for c in changes] == [
        ("c", {ROW_ID: 15}, None, MAN),
        ("u", {ROW_ID: 15}, MAN, WOMAN),  # before from UPDATE_BEFOR, after from UPDATE_AFTER
        ("u", {ROW_ID: 15}, MAN, WOMAN),  # both images in one UPDATE_AFTER
        ("d", {ROW_ID: 15}, WOMAN, None),
    ]
    assert [c["line"] for c in changes] == [4, 6, 7, 8]  # the pair is the UPDATE_AFTER's record
    assert [_position(c) for c in changes] == [
        "1:01620457642589000000", "1:01620457642589000001", "1:01620457642589000001",
        "1:01620457642589000002",
    ]  # fmt: skip
    assert [c["event_time"] for c in changes] == [
        _ms(1620457896000), _ms(1620458077000), _ms(1620458077000), _ms(1620458266000)
    ]  # fmt: skip
    meta = {
        (c["database"], c["schema"], c["table"], c["source_format"], c["tx_id"]) for c in changes
    }
    assert meta == {("pkset_test", None, "pkset_test_no_pk", "dataworks", None)}
    assert current(spark, replayed.warehouse, SOURCE, NO_PK, [ROW_ID]) == []

    quarantined = replayed.quarantined["001"]
    assert [(q["line"], q["value"]) for q in quarantined] == [
        (1, _line(SEED_001[0]).encode()),
        (2, _line(SEED_001[1]).encode()),
    ]
    assert quarantined[0]["reason"] == "invalid JSON: not a JSON object"
    assert quarantined[1]["reason"].startswith("unknown DataWorks op 'INSERT/UPDATE_BEFOR/")

    parsed = replayed.parsed["001"]
    assert [p["kind"] for p in parsed] == [
        "error", "error", "control", "change", "control", "change", "change", "change"
    ]  # fmt: skip
    heartbeat, paired_before = parsed[2], parsed[4]
    assert heartbeat["reason"] == "heartbeat (MHEARTBEAT)"
    assert heartbeat["event_time"] == _ms(1620457659000)
    assert paired_before["reason"].startswith("UPDATE_BEFOR paired with its UPDATE_AFTER")
    # The completed format definition: everything but its (list-of-ops) op is read.
    definition = parsed[1]
    assert (definition["database"], definition["schema"], definition["table"]) == (
        "myDatabase", "mySchema", "tableName"
    )  # fmt: skip
    assert definition["key_columns"] == ["pkName1", "pkName2"]
    assert definition["tx_id"] == "xxxx"  # Oracle scn
    assert definition["event_time"] == _ms(1)  # eventTime 1 in the example
    assert dict(definition["after_image"])["rowid"] == "AAIUMPAAFAACxExAAE"
    assert dataworks.column_specs(definition["value_schema"]) == {
        "id": ColumnSpec("bigint"),
        "name": ColumnSpec("string"),
        "binData": ColumnSpec("binary", "base64"),
        "ts": ColumnSpec("timestamp", "epoch_millis"),
        "rowid": ColumnSpec("string"),
    }


def test_seed_003_blob_examples(spark, replayed):
    assert replayed.result.tables[table_name(PK_TABLE)].key == ["id", "name"]
    joe = {"id": 1, "name": "joe", "comment": "comment"}
    joe1 = {**joe, "comment": "com1"}
    changes = changelog(spark, replayed.warehouse, SOURCE, PK_TABLE)
    assert [(c["op"], c["key"], c["before"], c["after"]) for c in changes] == [
        ("c", {"id": 1, "name": "joe"}, None, joe),
        ("u", {"id": 1, "name": "joe"}, joe, joe1),
        ("d", {"id": 1, "name": "joe"}, joe1, None),
    ]
    assert [_position(c) for c in changes] == [
        "1:01605339516000000004", "1:01605339516000000005", "1:01605339516000000006"
    ]  # fmt: skip
    assert [c["event_time"] for c in changes] == [
        _ms(1605339932000), _ms(1605339934000), _ms(1605339937000)
    ]  # fmt: skip
    assert [c["line"] for c in changes] == [3, 5, 6]
    assert current(spark, replayed.warehouse, SOURCE, PK_TABLE, ["id"]) == []
    quarantined = replayed.quarantined["003"]
    assert [(q["line"], q["value"]) for q in quarantined] == [
        (1, _line(SEED_003[0]).encode()),
        (2, _line(SEED_003[1]).encode()),
    ]
    assert quarantined[0]["reason"] == "invalid JSON: not a JSON object"
    assert quarantined[1]["reason"].startswith("unknown DataWorks op 'INSERT/UPDATE/DELETE/")

    parsed = replayed.parsed["003"]
    assert [p["kind"] for p in parsed] == [
        "error", "error", "change", "control", "change", "change", "control", "ddl"
    ]  # fmt: skip
    heartbeat, ddl = parsed[6], parsed[7]
    assert (heartbeat["reason"], heartbeat["event_time"]) == (
        "heartbeat (MHEARTBEAT)", _ms(1605339953629)
    )  # fmt: skip
    assert (ddl["reason"], ddl["ddl"], ddl["database"], ddl["table"]) == (
        "DDL ALTER", "alter table t_shiyu_nopk add column holo text", "yunshi_db", "t_shiyu_nopk"
    )  # fmt: skip
    assert (ddl["source_sequence"], ddl["event_time"]) == (
        "1:01605339516000000035", _ms(1605342109000)
    )  # fmt: skip


# --- ../shared/corpus/dataworks against EXPECTED.json ----------------------------------------

CORPUS_FILES = ["dataworks/event-insert.txt", "dataworks/event-update-in-one.txt",
                "dataworks/event-delete.txt"]  # fmt: skip


def _comparable(spark, warehouse, entry: dict) -> list[dict]:
    """The current rows, timestamps as epoch milliseconds.

    DataWorks DATE is a 13-digit epoch-millisecond number; the format types it ``timestamp``
    (its documented meaning). EXPECTED.json keeps create_time as the wire's epoch ms, so the
    honest comparison turns the timestamp back into epoch ms (exact: Spark timestamps hold µs)
    rather than loosening the expectation. ``val`` (DOUBLE sent as the string '1.100000') is a
    real double here and compares equal to the number 1.1.
    """
    df = current_rows(spark, warehouse, SOURCE, table_name(entry["table"]))
    as_ms = [
        F.unix_millis(f.name).alias(f.name) if f.dataType == T.TimestampType() else F.col(f.name)
        for f in df.schema.fields
    ]
    return df.select(*as_ms).orderBy(*entry["primary_key"]).toArrow().to_pylist()


def _license_lines(path: Path) -> list[tuple[int, bytes]]:
    lines = path.read_bytes().split(b"\n")
    return [(n, b) for n, b in enumerate(lines, 1) if b.strip() and not b.strip().startswith(b"{")]


@pytest.mark.connect  # its [connect] run: the whole path on Spark Connect
@pytest.mark.parametrize("name", CORPUS_FILES)
def test_corpus_file_reaches_final_state(spark, warehouse, expected, name):
    entry = expected[name]
    summary, result = _replay(spark, warehouse, [CORPUS / name])  # key from schema.primaryKey

    assert result.tables[table_name(entry["table"])].key == entry["primary_key"]
    current = current_rows(spark, warehouse, SOURCE, table_name(entry["table"]))
    assert _columns(current.schema) == {
        "id": T.LongType(), "val": T.DoubleType(), "name": T.StringType(),
        "create_time": T.TimestampType(),
    }  # fmt: skip
    assert _comparable(spark, warehouse, entry) == entry["final_state"]
    counts = summary["tables"][entry["table"]]
    assert (counts["inserted"], counts["updated"], counts["deleted"]) == (
        entry["counts"]["insert"], entry["counts"]["update"], entry["counts"]["delete"]
    )  # fmt: skip
    # The 17-line license header is quarantined line by line, never in the change log.
    header = _license_lines(CORPUS / name)
    assert len(header) == 17
    quarantined = quarantine(spark, warehouse, SOURCE)
    assert [(q["line"], q["value"]) for q in quarantined] == header
    assert all(q["reason"] == "invalid JSON: not a JSON object" for q in quarantined)
    assert summary["quarantined"] == 17 and result.control == result.ddl == 0
    [change] = changelog(spark, warehouse, SOURCE, entry["table"])
    assert change["line"] == 19


def test_corpus_files_as_one_topic_leave_the_updated_row(spark, warehouse, expected, tmp_path):
    # One topic, in the order insert, update, delete: one landing file, so offsets follow it.
    data = b"\n".join((CORPUS / n).read_bytes().rstrip(b"\n") for n in CORPUS_FILES)
    topic = tmp_path / "dataworks-one-topic.txt"
    topic.write_bytes(data + b"\n")
    entry = expected["dataworks/event-update-in-one.txt"]

    summary, _ = _replay(spark, warehouse, [topic])

    assert _comparable(spark, warehouse, entry) == entry["final_state"]  # id 2, val 2.2
    assert summary == {
        "tables": {entry["table"]: {"inserted": 1, "updated": 1, "deleted": 1, "rows": 1}},
        "quarantined": 3 * 17,
    }
    assert [q["line"] for q in quarantine(spark, warehouse, SOURCE)] == [
        n for n, _ in _license_lines(topic)
    ]
    changes = changelog(spark, warehouse, SOURCE, entry["table"])
    # The full-load insert (sequenceId -1) sorts before every incremental change; its event
    # time falls back to systemTime (eventTime is -1).
    assert [(c["op"], c["key"]) for c in changes] == [("c", {"id": 2}), ("d", {"id": 1}),
                                                       ("u", {"id": 2})]  # fmt: skip
    assert _position(changes[0]) == dataworks.FULL_LOAD_SEQUENCE
    assert changes[0]["event_time"] == _ms(1731661820245)
    assert [_position(c) for c in changes[1:]] == ["1:01731663842292000000",
                                                   "1:01731663842292000001"]  # fmt: skip


# --- end to end (replayed with the seeds, `replayed`): updates of both styles, DDL, control ---

ORDERS = "shop.orders"
ORDER_COLUMNS = [("id", "LONG"), ("amount", "DOUBLE"), ("paid", "BOOLEAN"), ("created", "DATE"),
                 ("note", "STRING"), ("blob", "BYTES")]  # fmt: skip
ORA = "ORCL.HR.JOBS"
ORA_COLUMNS = [("title", "STRING"), ("rowid", "STRING")]
EVENTS = "shop.events"
T0 = 1767225600000  # 2026-01-01T00:00:00Z


def _dw(op: str, seq: str | None = None, table: str | None = ORDERS, before=None, after=None,
        columns=ORDER_COLUMNS, pk=("id",), event: int | None = None, scn: str | None = None,
        ddl: str | None = None) -> str:  # fmt: skip
    """One DataWorks message, as DataWorks writes it."""
    source = None
    if table:
        db, *schema, name = table.split(".")
        source = {"dbType": "MySQL", "dbName": db, "tableName": name}
        if schema:
            source["schemaName"] = schema[0]
    payload = {
        "before": {"dataColumn": before} if before is not None else None,
        "after": {"dataColumn": after} if after is not None else None,
        "sequenceId": seq,
        "timestamp": {"eventTime": event if event is not None else T0 + _int(seq),
                      "systemTime": T0 + 999_999, "checkpointTime": -1},
        "op": op,
        "ddl": {"text": ddl, "ddlMeta": None} if ddl else None,
    }  # fmt: skip
    if scn:
        payload["scn"] = scn
    schema_part = {
        "dataColumn": [{"name": n, "type": t} for n, t in columns] if columns else None,
        "primaryKey": list(pk) if pk else None,
        "source": source,
    }
    return json.dumps({"schema": schema_part, "payload": payload, "version": "0.0.1"})


def _int(seq: str | None) -> int:
    return int(seq) if seq and seq.isdigit() else 0


def _order(i: int, amount: float, paid: bool = False, note: str = "n") -> dict:
    return {"id": i, "amount": f"{amount:.6f}", "paid": paid, "created": T0 - 86_400_000 * i,
            "note": note, "blob": "3q2+7w=="}  # fmt: skip


def _typed(i: int, amount: float, paid: bool = False, note: str = "n") -> dict:
    return {"id": i, "amount": amount, "paid": paid, "created": _ms(T0 - 86_400_000 * i),
            "note": note, "blob": b"\xde\xad\xbe\xef"}  # fmt: skip


def _ora(op: str, seq: str, scn: str, before=None, after=None) -> str:
    return _dw(op, seq, ORA, before, after, ORA_COLUMNS, pk=None, scn=scn)


def _event(op: str, seq: str, row=None) -> str:
    cols = [("id", "LONG"), ("what", "STRING")]
    before, after = (row, None) if op == "DELETE" else (None, row)
    return _dw(op, seq, EVENTS, before, after, cols)


def _end_to_end_messages() -> list[str]:
    """Inserts, both update styles, a key move, deletes, DDL, control messages, a truncate, a
    table without primary key (Oracle rowid, scn) and errors, as one topic."""
    return [
        _dw("TRANSACTION_BEGIN", table=None, columns=None, pk=None),
        _dw("INSERT", "-1", after=_order(1, 10.5), event=-1),  # full load
        _dw("INSERT", "100", after=_order(2, 20.0)),
        _dw("INSERT", "101", after=_order(3, 30.0)),
        _dw("UPDATE_BEFOR", "102", before=_order(1, 10.5)),  # two-message update of 1
        _dw("UPDATE_AFTER", "102", after=_order(1, 11.5, paid=True)),
        _dw("UPDATE_AFTER", "103", before=_order(2, 20.0), after=_order(2, 21.0)),  # in one
        _dw("UPDATE_AFTER", "104", after=_order(30, 30.0, note="moved")),  # key 3 -> 30 ...
        _dw("DELETE", "105", before=_order(2, 21.0)),
        _dw("MHEARTBEAT", table=None, columns=None, pk=None),
        _dw("ALTER", "106", columns=None, ddl="alter table orders add column note text"),
        _dw("UPDATE_BEFOR", "104", before=_order(3, 30.0)),  # ... its before half, after it
        _dw("TRANSACTION_END", table=None, columns=None, pk=None),
        _dw("GTID", table=None, columns=None, pk=None),
        _dw("XACOMMIT", table=None, columns=None, pk=None),
        _dw("XAROLLBACK", table=None, columns=None, pk=None),
        _ora("INSERT", "200", "9001", after={"title": "dev", "rowid": "AAIUMPAAFAACxExAAE"}),
        _ora(
            "UPDATE_AFTER",
            "201",
            "9002",
            before={"title": "dev", "rowid": "AAIUMPAAFAACxExAAE"},
            after={"title": "lead", "rowid": "AAIUMPAAFAACxExAAE"},
        ),
        _event("INSERT", "300", {"id": 1, "what": "a"}),
        _event("INSERT", "301", {"id": 2, "what": "b"}),
        _event("TRUNCATE", "302"),
        _event("INSERT", "303", {"id": 3, "what": "c"}),
        _dw("UPDATE_BEFOR", "107", before=_order(1, 11.5, paid=True)),  # no partner
        _dw("UPSERT", "108", after=_order(9, 9.0)),  # unknown op
        _dw("Insert", "109", after=_order(9, 9.0)),  # ops are case-sensitive
        _dw("INSERT", "abc", after=_order(9, 9.0)),  # cannot be ordered
        '{"schema": {"dataColumn": [], "payload": ',  # invalid JSON
        # An UPDATE_AFTER whose UPDATE_BEFOR came in an earlier batch applies on its own.
        _dw("UPDATE_AFTER", "110", after=_order(1, 12.5, paid=True, note="lone half")),
    ]


def test_end_to_end_both_update_styles_ddl_control_and_errors(spark, replayed):
    warehouse = replayed.warehouse
    summary = replayed.summary

    assert {t: summary["tables"][t] for t in (ORDERS, ORA, EVENTS)} == {
        ORDERS: {"inserted": 3, "updated": 4, "deleted": 1, "rows": 2},
        ORA: {"inserted": 1, "updated": 1, "deleted": 0, "rows": 1},
        EVENTS: {"inserted": 3, "updated": 0, "deleted": 0, "rows": 1},
    }
    kinds = Counter(p["kind"] for p in replayed.parsed["e2e"])
    # control: BEGIN, END, heartbeat, GTID, XACOMMIT, XAROLLBACK, the two paired UPDATE_BEFORs
    assert kinds == {"change": 14, "control": 8, "ddl": 1, "error": 5}
    assert replayed.result.tables[table_name(ORA)].key == ["rowid"]  # no primaryKey: rowid
    reasons = {q["line"]: q["reason"] for q in replayed.quarantined["e2e"]}
    assert len(reasons) == 5
    assert reasons[23].startswith("unpaired update: UPDATE_BEFOR (sequenceId 107) without its")
    assert reasons[24] == "unknown DataWorks op 'UPSERT'"
    assert reasons[25] == "unknown DataWorks op 'Insert'"
    assert reasons[26].startswith("sequenceId 'abc' is not an integer")
    assert reasons[27] == "invalid JSON: not a JSON object"

    assert current(spark, warehouse, SOURCE, ORDERS, ["id"]) == [
        _typed(1, 12.5, paid=True, note="lone half"),
        _typed(30, 30.0, note="moved"),  # the row moved from key 3 (before from UPDATE_BEFOR)
    ]
    assert current(spark, warehouse, SOURCE, ORA, ["rowid"]) == [
        {"title": "lead", "rowid": "AAIUMPAAFAACxExAAE"}
    ]
    assert current(spark, warehouse, SOURCE, EVENTS, ["id"]) == [{"id": 3, "what": "c"}]
    orders = changelog(spark, warehouse, SOURCE, ORDERS)
    assert [(c["op"], c["key"]["id"], (c["before"] or {}).get("id")) for c in orders] == [
        ("c", 1, None), ("c", 2, None), ("c", 3, None), ("u", 1, 1), ("u", 2, 2), ("u", 30, 3),
        ("d", 2, 2), ("u", 1, None),
    ]  # fmt: skip
    assert orders[0]["event_time"] == _ms(T0 + 999_999)  # eventTime -1: systemTime
    assert orders[3]["event_time"] == _ms(T0 + 102)
    assert {c["tx_id"] for c in changelog(spark, warehouse, SOURCE, ORA)} == {"9001", "9002"}  # scn


def _claimants(spark, docs: list[str]) -> list[tuple[bool, list[str]]]:
    """This format's claim, and every format claiming each message (as ``format: auto`` asks)."""
    df = spark.createDataFrame([(d,) for d in docs], "value string")
    keys = F.json_object_keys("value")
    value = F.col("value")
    claim = dataworks.claims(keys, value, J.probe(keys, dataworks.CLAIM_PATHS))
    rows = df.select(claim, detect.claimants(keys, value)).collect()
    return [(r[0], list(r[1])) for r in rows]


def test_claims_and_detection(spark):
    docs = [
        _line("001_dataworks_insert_no_pk.json"),
        _line("001_dataworks_heartbeat.json"),  # sequenceId and dataColumn null
        _line("003_datahub_blob_heartbeat.json"),  # "schema": {}
        _line("003_datahub_blob_update_before.json"),
        json.dumps({"schema": {}, "payload": {"op": "c", "after": {}}}),  # Debezium
        json.dumps({"_operation_type_": "I", "_sequence_id_": "1"}),  # DataHub Tuple
    ]
    claimed = _claimants(spark, docs)
    assert [mine for mine, _ in claimed] == [True] * 4 + [False, False]
    # format: auto gives every DataWorks example to this format alone
    assert [everyone for _, everyone in claimed[:4]] == [["dataworks"]] * 4


def test_detection_gives_dataworks_ddl_to_dataworks_alone(spark):
    [(mine, everyone)] = _claimants(spark, [_line("003_datahub_blob_ddl.json")])
    assert mine
    assert everyone == ["dataworks"]
