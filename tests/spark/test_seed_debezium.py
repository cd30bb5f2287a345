"""Every example message of seeds 000 (Lindorm, Debezium Format V2.0) and 004 (Debezium Db2),
replayed verbatim from tests/fixtures/seeds/ (see the README there for where each comes from).

The landing format is one message per line, so each fixture is fed as one line: valid JSON is
re-serialized on one line, invalid JSON keeps its bytes minus the line breaks.
"""

import datetime as dt
import json
import re

import pytest
from pyspark.sql import types as T

from cdc_platform import cli, lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.formats import debezium
from cdc_platform.normalize import table_name
from cdc_platform.steps.current import current_rows
from cdc_platform.steps.replay import replay
from tests.conftest import FIXTURES
from tests.tables import changelog, current, quarantine, write_lines

SEED = FIXTURES / "seeds"
DATE = "2026-01-01"
LINDORM = "ld-xxxx.default.customers"
DB2 = "mydatabase.MYSCHEMA.CUSTOMERS"


# --- fixtures as landing lines ---------------------------------------------------------------


def _text(name: str) -> str:
    return (SEED / name).read_text(encoding="utf-8")


def _line(name: str) -> str:
    """The fixture as one landing line: JSON on one line, or the verbatim bytes minus newlines."""
    text = _text(name)
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except json.JSONDecodeError:
        return text.replace("\r", "").replace("\n", "")


def _json(name: str) -> dict:
    return json.loads(_text(name))


def _kafka(offset: int, key: object, value: object) -> str:
    """A ``.kafka.jsonl`` envelope line; a str key/value is kept as its bytes, None a tombstone."""
    return json.dumps(
        {"topic": "t", "partition": 0, "offset": offset, "timestamp": 1559729470000 + offset,
         "key": key, "value": value},
        ensure_ascii=False,
    )  # fmt: skip


def _replay(spark, warehouse, files, key=None, types=None):
    return replay(
        spark, warehouse, files,
        SourceConfig(name="seed", format="debezium", primary_key=key, column_types=types or {}),
        DATE,
    )  # fmt: skip


def _ms(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


# --- the completed Db2 copies are the verbatim examples with only the documented repairs -------

_CALLOUT = re.compile(r"[ \t]{2,}\d+$", re.M)  # the documentation's numbered callouts "  1"
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")
DB2_EXAMPLES = ("key", "create_value", "update_value", "delete_value")


def _repair(text: str, value_schema: str) -> str:
    text = _CALLOUT.sub("", text)
    # The delete example closes the top-level object early: `"schema": { ... },\n  },`
    text = text.replace('"schema": { ... },\n  },\n', '"schema": { ... },\n')
    text = _TRAILING_COMMA.sub(r"\1", text)
    return text.replace("{ ... }", value_schema)


@pytest.mark.parametrize("name", DB2_EXAMPLES)
def test_db2_examples_are_invalid_verbatim_and_completed_only_by_the_documented_repairs(name):
    verbatim = _text(f"004_db2_{name}.json")
    with pytest.raises(json.JSONDecodeError):
        json.loads(verbatim)
    create = _text("004_db2_create_value.completed.json")
    value_schema = create[create.index("{", 1) : create.index(',\n  "payload"')]
    completed = _text(f"004_db2_{name}.completed.json")
    assert _repair(verbatim, value_schema) == completed  # byte for byte
    assert isinstance(json.loads(completed), dict)


@pytest.mark.parametrize(
    "name",
    [p.name for p in sorted(SEED.glob("000_*.json"))],
)
def test_lindorm_examples_are_valid_json_verbatim(name):
    assert isinstance(json.loads(_text(name)), dict)


# --- Lindorm (seed 000) ---------------------------------------------------------------------


LINDORM_META = {
    "database": "ld-xxxx",
    "schema": "default",
    "table": "customers",
    "event_time": _ms(1465491411807),  # source.ts_ms, not payload.ts_ms (...815)
    "source_format": "lindorm",
    "tx_id": None,
}


def _meta(row: dict) -> dict:
    return {k: row[k] for k in LINDORM_META}


def test_lindorm_sql_examples_insert_update_drop_column_delete(spark, warehouse, tmp_path):
    # All four examples share one source.ts_ms: the landing position (file name, line) orders them.
    first = write_lines(
        tmp_path / "1_insert_update.jsonl",
        [_line("000_lindorm_sql_insert.json"), _line("000_lindorm_sql_update.json")],
    )
    summary, result = _replay(spark, warehouse, [first], key=["id"])

    assert summary == {
        "tables": {LINDORM: {"inserted": 1, "updated": 1, "deleted": 0, "rows": 1}},
        "quarantined": 0,
    }
    assert result.tables[table_name(LINDORM)].key == ["id"]
    assert current(spark, warehouse, "seed", LINDORM, "id") == [
        {"id": "1004", "first_name": "Anne", "last_name": "Kretchmar"}
    ]
    changes = changelog(spark, warehouse, "seed", LINDORM)
    assert [(c["op"], c["key"], c["before"], c["after"]) for c in changes] == [
        ("c", {"id": "1004"}, None,
         {"id": "1004", "first_name": "Anne", "last_name": "Kretchmar"}),
        ("u", {"id": "1004"},
         {"id": "1004", "first_name": "Anne Marie", "last_name": "Kretchmar"},
         {"id": "1004", "first_name": "Anne", "last_name": "Kretchmar"}),
    ]  # fmt: skip
    assert all(_meta(c) == LINDORM_META for c in changes)

    # Dropping a column: an `u` whose full after image lacks last_name -> last_name becomes null.
    drop = write_lines(
        tmp_path / "2_drop_column.jsonl", [_line("000_lindorm_sql_drop_column_update.json")]
    )
    _replay(spark, warehouse, [drop], key=["id"])
    assert current(spark, warehouse, "seed", LINDORM, "id") == [
        {"id": "1004", "first_name": "Anne Marie", "last_name": None}
    ]
    dropped = changelog(spark, warehouse, "seed", LINDORM)[-1]
    assert (dropped["op"], dropped["after"]) == (
        "u",
        {"id": "1004", "first_name": "Anne Marie", "last_name": None},
    )

    delete = write_lines(tmp_path / "3_delete.jsonl", [_line("000_lindorm_sql_delete.json")])
    summary, _ = _replay(spark, warehouse, [delete], key=["id"])

    assert current(spark, warehouse, "seed", LINDORM, "id") == []
    assert summary["tables"][LINDORM]["rows"] == 0
    assert summary["quarantined"] == 0
    changes = changelog(spark, warehouse, "seed", LINDORM)
    assert [c["op"] for c in changes] == ["c", "u", "u", "d"]
    deleted = changes[-1]
    assert (deleted["key"], deleted["after"]) == ({"id": "1004"}, None)
    assert deleted["before"] == {"id": "1004", "first_name": "Anne Marie", "last_name": "Kretchmar"}
    assert _meta(deleted) == LINDORM_META


def test_lindorm_definition_example_takes_column_types_from_its_schema(spark, warehouse, tmp_path):
    f = write_lines(
        tmp_path / "definition.jsonl", [_line("000_lindorm_format_definition_update.json")]
    )
    summary, _ = _replay(spark, warehouse, [f], key=["id"])

    assert summary["tables"][LINDORM] == {"inserted": 0, "updated": 1, "deleted": 0, "rows": 1}
    uri = lake.TableRef(lake.CHANGELOG, "seed", table_name(LINDORM)).uri(warehouse)
    after_type = lake.read(spark, uri).schema["after"].dataType
    assert after_type["id"].dataType == T.IntegerType()  # int32 in the schema, not a string
    assert after_type["name"].dataType == T.StringType()
    [change] = changelog(spark, warehouse, "seed", LINDORM)
    assert (change["op"], change["before"], change["after"]) == (
        "u",
        {"id": 1004, "name": "Jane"},
        {"id": 1004, "name": "Anne"},
    )
    assert _meta(change) == LINDORM_META
    current = current_rows(spark, warehouse, "seed", table_name(LINDORM))
    assert current.schema["id"].dataType == T.IntegerType()
    assert current.toArrow().to_pylist() == [{"id": 1004, "name": "Anne"}]


def test_lindorm_hbase_example_decodes_base64_and_keys_on_row(spark, warehouse, tmp_path):
    f = write_lines(tmp_path / "hbase.jsonl", [_line("000_lindorm_hbase_insert.json")])
    summary, result = _replay(spark, warehouse, [f])  # no key override: ROW is the key

    assert summary == {
        "tables": {LINDORM: {"inserted": 1, "updated": 0, "deleted": 0, "rows": 1}},
        "quarantined": 0,
    }
    assert result.tables[table_name(LINDORM)].key == ["ROW"]
    assert current(spark, warehouse, "seed", LINDORM, "ROW") == [
        {"ROW": "user1", "f_name": "lucky"}
    ]
    [change] = changelog(spark, warehouse, "seed", LINDORM)
    assert (change["op"], change["key"], change["before"]) == ("c", {"ROW": "user1"}, None)
    assert change["event_time"] == _ms(1725258833727)
    assert (change["database"], change["schema"], change["table"]) == (
        "ld-xxxx",
        "default",
        "customers",
    )

    raw = lake.read(spark, lake.TableRef(lake.RAW, "seed").uri(warehouse))
    [parsed] = debezium.parse(raw, {}).toArrow().to_pylist()
    assert (parsed["image_encoding"], parsed["key_columns"], parsed["source_format"]) == (
        "hbase",
        ["ROW"],
        "lindorm",
    )
    assert dict(parsed["after_image"]) == {"ROW": "dXNlcjE=", "f_name": "bHVja3k="}


# --- Debezium Db2 (seed 004) ----------------------------------------------------------------

DB2_ROW = {"ID": 1005, "FIRST_NAME": "john", "LAST_NAME": "doe", "EMAIL": "john.doe@example.org"}
DB2_ROW_UPDATED = {**DB2_ROW, "EMAIL": "noreply@example.org"}


def test_db2_examples_keyed_by_the_kafka_key_with_tombstone(spark, warehouse, tmp_path):
    key = _json("004_db2_key.completed.json")
    values = [
        _json(f"004_db2_{n}.completed.json")
        for n in ("create_value", "update_value", "delete_value")
    ]
    f = write_lines(
        tmp_path / "db2.kafka.jsonl",
        [_kafka(i, key, v) for i, v in enumerate(values)] + [_kafka(3, key, None)],
    )
    summary, result = _replay(spark, warehouse, [f])  # no key override: the Kafka key names ID

    assert summary == {
        "tables": {DB2: {"inserted": 1, "updated": 1, "deleted": 1, "rows": 0}},
        "quarantined": 0,
    }
    assert (result.messages, result.control, result.quarantined) == (4, 1, 0)  # the tombstone
    assert result.tables[table_name(DB2)].key == ["ID"]
    assert current(spark, warehouse, "seed", DB2, "ID") == []  # no row 1005 after the delete
    assert quarantine(spark, warehouse, "seed") == []

    changes = changelog(spark, warehouse, "seed", DB2)
    # The key struct comes from the row image (1005); the doc's key example shows ID 1004.
    assert [(c["op"], c["key"], c["before"], c["after"]) for c in changes] == [
        ("c", {"ID": 1005}, None, DB2_ROW),
        ("u", {"ID": 1005}, DB2_ROW, DB2_ROW_UPDATED),
        ("d", {"ID": 1005}, DB2_ROW_UPDATED, None),
    ]
    lsns = [
        ("00000027:00000758:0005", "00000027:00000758:0003"),
        ("00000027:00000ac0:0007", "00000027:00000ac0:0002"),
        ("00000027:00000db0:0007", "00000027:00000db0:0005"),
    ]
    assert [c["tx_id"] for c in changes] == [commit for commit, _ in lsns]
    positions = [c["sequence"].split("|")[0] for c in changes]
    assert positions == [f"lsn/{commit}/{change}" for commit, change in lsns]
    assert positions == sorted(positions)  # the source position alone sorts in commit order
    assert [c["event_time"] for c in changes] == [
        _ms(1559729468470), _ms(1559729995937), _ms(1559730445243)
    ]  # fmt: skip
    assert {(c["database"], c["schema"], c["table"], c["source_format"]) for c in changes} == {
        ("mydatabase", "MYSCHEMA", "CUSTOMERS", "debezium")
    }
    assert [c["offset"] for c in changes] == [0, 1, 2]


def test_verbatim_db2_examples_are_quarantined_as_invalid_json(spark, warehouse, tmp_path):
    names = ["004_db2_skeleton.json"] + [
        f"004_db2_{n}.json" for n in ("create_value", "update_value", "delete_value")
    ]
    lines = [_line(n) for n in names]
    plain = write_lines(tmp_path / "db2_verbatim.jsonl", lines)
    # The verbatim key (invalid too) as the Kafka key of the verbatim create, then a tombstone.
    key = _line("004_db2_key.json")
    kafka = write_lines(
        tmp_path / "db2_verbatim.kafka.jsonl", [_kafka(0, key, lines[1]), _kafka(1, key, None)]
    )
    summary, result = _replay(spark, warehouse, [plain, kafka])

    assert summary == {"tables": {}, "quarantined": 5}
    assert (result.messages, result.control) == (6, 1)  # the tombstone is control, not an error
    rows = quarantine(spark, warehouse, "seed")
    assert [r["value"] for r in rows] == [line.encode() for line in lines + [lines[1]]]
    assert all(r["reason"].startswith("invalid JSON") for r in rows), rows
    assert [r["line"] for r in rows] == [1, 2, 3, 4, 1]
    assert rows[-1]["key"] == key.encode() and rows[-1]["offset"] == 0


# --- the command line -----------------------------------------------------------------------


def test_cli_replays_and_shows_a_seed_message(spark, tmp_path, capsys):
    # In-process: the command's session is this one (getOrCreate). The standalone-cluster test
    # runs the command in a process of its own.
    f = write_lines(tmp_path / "insert.jsonl", [_line("000_lindorm_sql_insert.json")])
    wh = tmp_path / "wh"

    assert cli.main(["replay", str(f), "--warehouse", str(wh), "--primary-key", "id"]) == 0

    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {
        "tables": {LINDORM: {"inserted": 1, "updated": 0, "deleted": 0, "rows": 1}},
        "quarantined": 0,
    }
    assert cli.main(["show", LINDORM, "--warehouse", str(wh)]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert shown == [{"id": "1004", "first_name": "Anne", "last_name": "Kretchmar"}]
