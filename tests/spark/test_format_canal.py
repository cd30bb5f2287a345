"""Canal flat-message JSON (``cdc_platform.formats.canal``): the seed 002 examples verbatim, the
../shared/corpus Canal files against EXPECTED.json, and end-to-end replays in both conventions."""

import base64
import datetime as dt
import json
import struct
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.formats import canal
from cdc_platform.formats import canonical as C
from cdc_platform.formats.column_specs import ColumnSpec
from cdc_platform.ingest import landing
from cdc_platform.normalize import table_name
from cdc_platform.steps.current import current_rows
from cdc_platform.steps.replay import replay
from tests.conftest import CORPUS, FIXTURES, SEEDS
from tests.tables import changelog, current, quarantine, write_lines

SEED = FIXTURES / "seeds"
DATE = "2026-01-01"
CANAL_FILES = sorted(str(p.relative_to(CORPUS)) for p in (CORPUS / "canal").glob("*.txt"))
# mydb.project's mysqlType says int(11) but its ids are 'A101'..; its DDL says VARCHAR(255).
PROJECT = TableConfig(
    name=table_name("mydb.project"), source_table="mydb.project", column_types={"id": "string"}
)


# --- helpers ---------------------------------------------------------------------------------


def _source(convention: str = "current", tables=(), name: str = "t") -> SourceConfig:
    return SourceConfig(
        name=name,
        format="canal",
        format_options={"canal.convention": convention},
        tables=list(tables),
    )


def _replay(spark, warehouse, files, source: SourceConfig, **kw):
    return replay(spark, warehouse, files, source, DATE, **kw)


def _float32(x):
    return None if x is None else struct.unpack("f", struct.pack("f", x))[0]


def _comparable(rows: list[dict], entry: dict, columns) -> list[dict]:
    f32 = [c for c, how in entry.get("compare", {}).items() if how == "float32"]
    out = []
    for r in rows:
        row = {}
        for c in columns:
            v = r[c]
            if c in f32:
                v = _float32(v)
            elif isinstance(v, dt.date):
                v = v.isoformat()
            row[c] = v
        out.append(row)
    return out


def _ms(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def _fixture_line(name: str) -> str:
    """A fixture as one landing line: valid JSON re-serialized, invalid JSON minus line breaks."""
    text = (SEED / name).read_text(encoding="utf-8")
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except json.JSONDecodeError:
        return text.replace("\r", "").replace("\n", "")


def _parse(spark, tmp_path: Path, messages: list, convention: str = "current") -> list[dict]:
    """parse() alone on landing lines (no Delta): the parsed records in order."""
    path = write_lines(tmp_path / "parse.jsonl", messages)
    raw = spark.createDataFrame(landing.read_files([(path, path.name)], DATE, topic="t"))
    parsed = canal.parse(raw, {"canal.convention": convention})
    return parsed.orderBy("line", "source_sequence").toArrow().to_pylist()


def _msg(typ: str, data=None, old=None, table="orders", es=1600161894000, id_=1, **extra):
    m = {
        "data": data,
        "database": "shop",
        "es": es,
        "id": id_,
        "isDdl": False,
        "mysqlType": ORDERS_TYPES,
        "old": old,
        "pkNames": ["id"],
        "sql": "",
        "table": table,
        "ts": es + 500,
        "type": typ,
    }
    return {**m, **extra}


def _ddl(sql: str, table: str, typ: str = "ALTER", es: int = 1600161895000) -> dict:
    return {"data": None, "database": "shop", "es": es, "id": 9, "isDdl": True,
            "mysqlType": None, "old": None, "pkNames": None, "sql": sql, "sqlType": None,
            "table": table, "ts": es, "type": typ}  # fmt: skip


ORDERS_TYPES = {
    "id": "int(11)",
    "price": "decimal(12,2)",
    "name": "varchar(20)",
    "born": "date",
    "seen": "datetime",
    "big": "bigint(20) unsigned",
    "qty": "smallint unsigned",
    "ratio": "double",
    "bin": "varbinary(4)",
}


def _row(id_: int, name: str, price: str = "1.50", **kw) -> dict:
    row = {"id": str(id_), "price": price, "name": name, "born": "2001-02-03",
           "seen": "2020-01-02 03:04:05", "big": "18446744073709551615", "qty": "65535",
           "ratio": "0.25", "bin": "\u00ff\u0080\u0000A"}  # fmt: skip
    return {**row, **kw}


def _image(row: dict) -> dict:
    """A row as the parsed image holds it: binary values (ISO-8859-1 text) as base64."""
    return {**row, "bin": base64.b64encode(row["bin"].encode("latin-1")).decode()}


# --- format module: types, claims, parse errors ------------------------------------------------


@pytest.mark.parametrize(
    ("mysql", "spark_type"),
    [
        ("int(11)", "int"), ("INTEGER", "int"), ("int unsigned", "bigint"),
        ("int(10) unsigned zerofill", "bigint"), ("bigint", "bigint"),
        ("bigint unsigned", "decimal(20,0)"), ("BIGINT(20) UNSIGNED", "decimal(20,0)"),
        ("tinyint(1)", "tinyint"), ("tinyint unsigned", "smallint"), ("smallint", "smallint"),
        ("smallint(5) unsigned", "int"), ("mediumint", "int"), ("mediumint unsigned", "int"),
        ("float", "float"), ("FLOAT", "float"), ("double", "double"), ("real", "double"),
        ("decimal(10,2)", "decimal(10,2)"), ("DECIMAL(38, 10)", "decimal(38,10)"),
        ("decimal(12)", "decimal(12,0)"), ("numeric(5,5)", "decimal(5,5)"),
        ("decimal", "string"), ("decimal(65,30)", "string"),
        ("varchar(255)", "string"), ("VARCHAR(512)", "string"), ("char(3)", "string"),
        ("text", "string"), ("longtext", "string"), ("json", "string"),
        ("enum('a','b')", "string"), ("set('a')", "string"), ("time", "string"),
        ("bit(1)", "string"), ("date", "date"), ("DATE", "date"), ("datetime(6)", "timestamp"),
        ("timestamp", "timestamp"), ("year", "int"), ("blob", "binary"),
        ("longblob", "binary"), ("varbinary(16)", "binary"), ("binary(16)", "binary"),
        ("geometry", "string"), ("", "string"),
    ],
)  # fmt: skip
def test_mysql_types_map_to_spark_types(mysql, spark_type):
    assert canal.mysql_type(mysql) == spark_type


def test_column_specs_read_mysql_type_json():
    specs = canal.column_specs(json.dumps({"id": "INTEGER", "name": "VARCHAR(255)", "x": 7}))
    assert specs == {
        "id": ColumnSpec("int"),
        "name": ColumnSpec("string"),
        "x": ColumnSpec("string"),
    }
    assert canal.column_specs('{"b": "blob"}') == {"b": ColumnSpec("binary", "base64")}
    assert list(specs) == ["id", "name", "x"]
    with pytest.raises(ValueError):
        canal.column_specs("not json")


def test_claims(spark):
    values = {
        "dml": _msg("INSERT", [_row(1, "a")]),
        "dts_ddl": {
            "database": "d",
            "es": 1,
            "id": 58,
            "isDdl": True,
            "sql": "x",
            "table": "t",
            "ts": 2,
            "type": "DDL",
        },  # fmt: skip
        "maxwell": {"database": "d", "table": "t", "type": "insert", "ts": 1, "data": {}},
        "debezium": {"op": "c", "source": {}, "after": {}},
    }
    df = spark.createDataFrame([(k, json.dumps(v)) for k, v in values.items()], ["name", "value"])
    keys = F.json_object_keys("value")
    got = {
        r["name"]: r["c"]
        for r in df.select(
            "name", canal.claims(keys, F.col("value"), F.lit(None)).alias("c")
        ).collect()
    }
    assert got == {"dml": True, "dts_ddl": True, "maxwell": False, "debezium": False}


def test_parse_returns_the_parsed_schema_and_never_raises(spark, tmp_path):
    messages = [
        "not json",
        "[1, 2]",
        '{"a": 1, "a": 2}',
        {"type": "INSERT", "data": [{"id": "1"}]},  # no table
        {"table": "t", "data": [{"id": "1"}]},  # no type
        _msg("UPSERT", [_row(1, "a")]),
        _msg("INSERT", None),
        _msg("INSERT", []),
        _msg("INSERT", {"id": "1"}),
        _msg("UPDATE", None, [{"name": "x"}]),
        _msg("DELETE", [None, _row(2, "b")]),
        _msg("MHEARTBEAT", None, table=""),
    ]
    path = write_lines(tmp_path / "bad.jsonl", messages)
    raw = spark.createDataFrame(landing.read_files([(path, path.name)], DATE, topic="t"))
    parsed = canal.parse(raw, {})
    assert parsed.columns == raw.columns + [f.name for f in C.PARSED_SCHEMA.fields]
    for f in C.PARSED_SCHEMA.fields:
        assert parsed.schema[f.name].dataType == f.dataType, f.name
    rows = parsed.orderBy("line", "source_sequence").toArrow().to_pylist()
    got = [(r["line"], r["kind"], r["reason"]) for r in rows]
    assert got == [
        (1, "error", "invalid JSON: not a JSON object"),
        (2, "error", "invalid JSON: not a JSON object"),
        (3, "error", "invalid JSON: not a JSON object"),  # duplicate keys
        (4, "error", "no table: table unknown"),
        (5, "error", "not a Canal message: no 'type' field"),
        (6, "error", "unknown Canal type 'UPSERT'"),
        (7, "error", "INSERT without rows in 'data' or 'old'"),
        (8, "error", "INSERT without rows: the row array is empty"),
        (9, "error", "'data'/'old' are not arrays of JSON objects"),
        (10, "error", "UPDATE without new values in 'data'"),
        (11, "error", "row 0 of the message is null"),
        (11, "change", None),
        (12, "control", "canal MHEARTBEAT"),
    ]
    assert all(r["source_format"] == "canal" and r["after_partial"] is False for r in rows)


def test_both_conventions_give_the_same_records_for_the_same_changes(spark, tmp_path):
    """One logical history (insert, update, delete) written in each convention."""
    full_old, full_new = _row(7, "old name"), _row(7, "new name", price="2.25")
    current = [
        _msg("INSERT", [full_old]),
        _msg("UPDATE", [full_new], [{"name": "old name", "price": "1.50"}]),
        _msg("DELETE", [full_new]),
    ]
    legacy = [
        _msg("INSERT", None, [full_old]),  # the new values are in `old`
        _msg("UPDATE", [full_old], [full_new]),  # data = previous row, old = new row
        _msg("DELETE", None, [full_new]),  # a DELETE's row is in `old`
    ]
    fields = ("kind", "op", "database", "table", "key_columns", "before_image", "after_image")
    a = [{k: r[k] for k in fields} for r in _parse(spark, tmp_path, current, "current")]
    b = [{k: r[k] for k in fields} for r in _parse(spark, tmp_path, legacy, "legacy")]
    assert a == b
    assert [r["op"] for r in a] == ["c", "u", "d"]
    assert dict(a[1]["before_image"]) == _image(full_old)
    assert dict(a[1]["after_image"]) == _image(full_new)
    assert dict(a[2]["before_image"]) == _image(full_new) and a[2]["after_image"] is None
    # Read in the wrong convention the update swaps its images.
    wrong = _parse(spark, tmp_path, legacy[1:2], "current")[0]
    assert dict(wrong["after_image"]) == _image(full_old)


def test_update_before_image_is_the_new_row_overlaid_with_old(spark, tmp_path):
    rows = _parse(
        spark,
        tmp_path,
        [_msg("UPDATE", [_row(1, "b", note="n"), _row(2, "d")], [{"name": "a", "note": None}, {}])],
    )
    assert [r["source_sequence"][-10:] for r in rows] == ["0000000000", "0000000001"]
    # present-with-null: the old value was NULL; absent: unchanged; a key only in `old` is kept
    assert dict(rows[0]["before_image"]) == _image(_row(1, "a", note=None))
    assert dict(rows[0]["after_image"]) == _image(_row(1, "b", note="n"))
    assert dict(rows[1]["before_image"]) == dict(rows[1]["after_image"]) == _image(_row(2, "d"))


def test_truncate_ddl_is_a_truncate_change_and_other_ddl_is_counted(spark, tmp_path):
    rows = _parse(
        spark,
        tmp_path,
        [
            _ddl("TRUNCATE TABLE `orders`", "orders", typ="TRUNCATE"),
            _ddl("truncate orders", "orders", typ="QUERY"),
            _ddl("ALTER TABLE other ADD c int", "other"),
            _ddl("CREATE TABLE x (a int)", "x", typ="CREATE"),
        ],
    )
    got = [(r["kind"], r["op"], r["table"], r["ddl"]) for r in rows]
    assert got == [
        ("change", "t", "orders", "TRUNCATE TABLE `orders`"),
        ("change", "t", "orders", "truncate orders"),
        ("ddl", None, "other", "ALTER TABLE other ADD c int"),
        ("ddl", None, "x", "CREATE TABLE x (a int)"),
    ]
    assert all(r["before_image"] is None and r["after_image"] is None for r in rows)


def test_metadata_event_time_tx_id_and_numbers_are_exact(spark, tmp_path):
    # A producer that writes numbers (Flink's canal-json does) keeps their exact text.
    msg = json.dumps(_msg("INSERT", [{"id": 1, "price": 0}], gtid="abc:12"))
    msg = msg.replace('"price": 0', '"price": 12345678901234567890.123456789')
    row = _parse(spark, tmp_path, [msg])[0]
    assert row["after_image"] == [("id", "1"), ("price", "12345678901234567890.123456789")]
    assert row["event_time"] == _ms(1600161894000)
    assert row["tx_id"] == "abc:12"
    assert json.loads(row["value_schema"]) == ORDERS_TYPES  # its keys sorted (a variant's)
    assert row["source_sequence"].startswith("pos:f") and row["source_sequence"].endswith(
        ":0000000000"
    )


# --- seed 002: the Canal Json examples verbatim --------------------------------------------------

SEED_FILES = ("002_canal_legacy_delete.json", "002_canal_current_delete.json", "002_canal_ddl.json")


def test_seed_examples_are_the_document_bytes():
    doc = (SEEDS / "002_3b5fb1cb675b2a10.txt").read_bytes()
    lines = doc.splitlines(keepends=True)
    ranges = {SEED_FILES[0]: (231, 256), SEED_FILES[1]: (260, 286), SEED_FILES[2]: (291, 300)}
    for name, (a, b) in ranges.items():
        assert (SEED / name).read_bytes() == b"".join(lines[a - 1 : b]), name
    assert isinstance(json.loads((SEED / SEED_FILES[0]).read_text()), dict)
    assert isinstance(json.loads((SEED / SEED_FILES[1]).read_text()), dict)
    with pytest.raises(json.JSONDecodeError):  # the DDL example is annotated inline
        json.loads((SEED / SEED_FILES[2]).read_text())


SEED_TABLE = "dbname.tablename"


def test_seed_current_delete_and_annotated_ddl(spark, warehouse, tmp_path):
    insert = {**json.loads(_fixture_line(SEED_FILES[1])), "type": "INSERT", "es": 1600161893000}
    insert["data"] = [{"id": "500000287", "shipping_type": "aaa"}]
    path = write_lines(
        tmp_path / "seed.jsonl",
        [insert, _fixture_line(SEED_FILES[1]), _fixture_line(SEED_FILES[2])],
    )
    summary, result = _replay(spark, warehouse, [path], _source())

    assert summary["tables"][SEED_TABLE] == {"inserted": 1, "updated": 0, "deleted": 1, "rows": 0}
    log = changelog(spark, warehouse, "t", SEED_TABLE)
    assert [(r["op"], r["key"]) for r in log] == [
        ("c", {"id": 500000287}),
        ("d", {"id": 500000287}),
    ]
    delete = log[1]
    assert delete["before"] == {"id": 500000287, "shipping_type": None}  # bigint, varchar
    assert delete["after"] is None
    assert delete["event_time"] == _ms(1600161894000)
    assert (delete["database"], delete["schema"], delete["table"]) == ("dbname", None, "tablename")
    assert delete["source_format"] == "canal" and delete["tx_id"] is None
    # The DDL example carries inline comments: not JSON, quarantined with its bytes.
    [q] = quarantine(spark, warehouse, "t")
    assert q["reason"].startswith("invalid JSON")
    assert q["value"] == _fixture_line(SEED_FILES[2]).encode()
    assert q["line"] == 3 and result.ddl == 0


def test_seed_legacy_delete_names_no_key_and_is_quarantined(spark, warehouse, tmp_path):
    """Before 2022-03-20 DTS put a DELETE's row in `old`; the document's example row carries only
    `shipping_type`, not the key `id`, so it cannot be applied: quarantined, not dropped."""
    insert = {**json.loads(_fixture_line(SEED_FILES[0])), "type": "INSERT"}
    insert["old"] = [{"id": "500000287", "shipping_type": "aaa"}]
    keyed = {**json.loads(_fixture_line(SEED_FILES[0])), "es": 1600161895000}
    keyed["old"] = [{"id": "500000288", "shipping_type": "bbb"}]
    insert2 = {**insert, "old": [{"id": "500000288", "shipping_type": "bbb"}]}
    path = write_lines(
        tmp_path / "legacy.jsonl", [insert, insert2, _fixture_line(SEED_FILES[0]), keyed]
    )
    summary, _ = _replay(spark, warehouse, [path], _source("legacy"))

    assert summary["tables"][SEED_TABLE] == {"inserted": 2, "updated": 0, "deleted": 1, "rows": 1}
    assert current(spark, warehouse, "t", SEED_TABLE, "id") == [
        {"id": 500000287, "shipping_type": "aaa"}
    ]
    [q] = quarantine(spark, warehouse, "t")
    assert q["reason"] == "primary key column 'id' is null"
    assert q["line"] == 3 and q["value"] == _fixture_line(SEED_FILES[0]).encode()
    log = changelog(spark, warehouse, "t", SEED_TABLE)
    assert log[-1]["op"] == "d" and log[-1]["before"] == {"id": 500000288, "shipping_type": "bbb"}


# --- corpus ------------------------------------------------------------------------------------


@pytest.mark.connect  # its [connect] run: the whole path on Spark Connect
@pytest.mark.parametrize("name", CANAL_FILES)
def test_corpus_file_reaches_final_state(spark, warehouse, expected, name):
    entry = expected[name]
    others = entry.get("other_tables", {})
    source = _source(tables=[PROJECT] if "mydb.project" in others else [])
    summary, result = _replay(spark, warehouse, [CORPUS / name], source)

    columns = list(entry["column_types"])
    rows = current(spark, warehouse, "t", entry["table"], entry["primary_key"][0])
    assert _comparable(rows, entry, columns) == _comparable(entry["final_state"], entry, columns)
    counts = summary["tables"][entry["table"]]
    assert counts["inserted"] == entry["counts"]["insert"]
    assert counts["updated"] == entry["counts"]["update"]
    assert counts["deleted"] == entry["counts"]["delete"]
    assert counts["rows"] == len(entry["final_state"])
    assert result.ddl == entry["counts"]["other"]  # DDL is counted, not failed
    assert summary["quarantined"] == 0
    # Every table of the topic is routed to its own table; the target sees only its own rows.
    assert set(summary["tables"]) == {entry["table"], *others}
    for qualified, other in others.items():
        got = summary["tables"][qualified]
        assert (got["inserted"], got["updated"], got["deleted"]) == (
            other["counts"]["insert"],
            other["counts"]["update"],
            other["counts"]["delete"],
        )
        cols = list(other["final_state"][0])
        key = cols[0]
        assert _comparable(
            current(spark, warehouse, "t", qualified, key), entry, cols
        ) == _comparable(other["final_state"], entry, cols)
    # Types come from mysqlType.
    df = current_rows(spark, warehouse, "t", table_name(entry["table"]))
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert {c: types[c] for c in columns} == {
        "id": "int",
        "name": "string",
        "description": "string",
        "weight": "float",
    }
    if name.endswith("with-init.txt"):
        # 'other' is not in mysqlType: kept as a string column, full-row images.
        other = {r["id"]: r["other"] for r in rows}
        assert types["other"] == "string"
        assert (other[101], other[106]) == (None, "val0")
        log = changelog(spark, warehouse, "t", entry["table"])
        assert [r["op"] for r in log[:9]] == ["r"] * 9
    if others:
        orders = current_rows(spark, warehouse, "t", table_name("mydb.orders")).schema
        assert orders["order_date"].dataType.simpleString() == "date"


def test_corpus_order_is_file_order_not_es_or_id(spark):
    """The evidence for the sequence: es/id contradict file order and tie across messages."""
    name = "canal/canal-data-filter-table.txt"
    raw = spark.createDataFrame(landing.read_files([(CORPUS / name, name)], DATE, topic="t"))
    rows = canal.parse(raw, {}).toArrow().to_pylist()
    msgs = [json.loads(line) for line in (CORPUS / name).read_text().splitlines() if line]
    # Two different messages share id 9 (UPDATE then DELETE of 111) with identical es/ts.
    nines = [m for m in msgs if m["id"] == 9]
    assert [m["type"] for m in nines] == ["UPDATE", "DELETE"]
    assert nines[0]["es"] == nines[1]["es"] and nines[0]["ts"] == nines[1]["ts"]
    # The last INSERT's es is earlier than the messages before it.
    assert msgs[-1]["es"] < max(m["es"] for m in msgs[:-1])
    # The sequence follows file order, then the row's index in its message.
    seqs = [
        r["source_sequence"] for r in sorted(rows, key=lambda r: (r["line"], r["source_sequence"]))
    ]
    assert seqs == sorted(seqs)
    change = [r for r in rows if r["kind"] == "change" and r["table"] == "product"]
    of_111 = [r for r in change if r["before_image"] and dict(r["before_image"])["id"] == "111"]
    last_111 = max(of_111, key=lambda r: r["source_sequence"])
    assert last_111["op"] == "d"


# --- end to end --------------------------------------------------------------------------------


ORDERS = "shop.orders"
ITEMS = "shop.items"


def _item(typ, rows, es, id_=50):
    return _msg(typ, rows, table="items", es=es, id_=id_,
                mysqlType={"sku": "varchar(8)", "stock": "int"}, pkNames=["sku"])  # fmt: skip


def test_end_to_end_current_convention(spark, warehouse, tmp_path):
    es = 1700000000000
    first = write_lines(
        tmp_path / "a_first.jsonl",
        [
            _msg("INIT", [_row(1, "one"), _row(2, "two")], es=es - 60000, id_=1),
            _msg("INSERT", [_row(3, "three"), _row(4, "four")], es=es, id_=2),
            _item("INSERT", [{"sku": "A", "stock": "1"}, {"sku": "B", "stock": "2"}], es),
            # multi-row update: row 1 renamed, row 3 repriced; old lists changed columns only
            _msg(
                "UPDATE",
                [_row(1, "uno"), _row(3, "three", price="9.99")],
                [{"name": "one"}, {"price": "1.50"}],
                es=es + 1000,
                id_=3,
            ),  # fmt: skip
            _ddl("ALTER TABLE orders ADD COLUMN note varchar(10)", "orders"),
            _msg("DELETE", [_row(2, "two")], es=es + 2000, id_=4),
            # the key changes: 4 -> 5 (the old key gets a tombstone)
            _msg("UPDATE", [_row(5, "four")], [{"id": "4"}], es=es + 3000, id_=5),
            "garbage, not a message",
            _msg("UPSERT", [_row(8, "x")], es=es + 3000, id_=5),
            _msg("INSERT", [_row(9, "bad price", price="abc")], es=es + 3000, id_=5),
            _msg("INSERT", [_row(10, "bad bytes", bin="中")], es=es + 3000, id_=5),
        ],
    )
    second = write_lines(
        tmp_path / "b_second.jsonl",
        [
            # same batch id and an *earlier* es than the update above: file order still wins
            _msg("UPDATE", [_row(1, "eins")], [{"name": "uno"}], es=es, id_=3),
            # two messages of one batch with the same es: 3 is row 1 of the update and row 0 of
            # the delete, so an (es, id, row index) sequence would apply the delete first
            _msg(
                "UPDATE",
                [_row(5, "fünf"), _row(3, "drei", price="9.99")],
                [{"name": "four"}, {"name": "three"}],
                es=es + 5000,
                id_=8,
            ),  # fmt: skip
            _msg("DELETE", [_row(3, "drei", price="9.99")], es=es + 5000, id_=8),
            _ddl("TRUNCATE TABLE items", "items", typ="TRUNCATE", es=es - 99999),
            _item("INSERT", [{"sku": "C", "stock": "3"}], es - 99999, id_=1),
        ],
    )
    summary, result = _replay(spark, warehouse, [first, second], _source())

    orders = current(spark, warehouse, "t", ORDERS, "id")
    assert [(r["id"], r["name"], r["price"]) for r in orders] == [
        (1, "eins", Decimal("1.50")),
        (5, "fünf", Decimal("1.50")),
    ]
    assert orders[0] == {
        "id": 1, "price": Decimal("1.50"), "name": "eins", "born": dt.date(2001, 2, 3),
        "seen": dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "big": Decimal("18446744073709551615"), "qty": 65535, "ratio": 0.25,
        "bin": b"\xff\x80\x00A",  # Canal writes bytes as ISO-8859-1 text
    }  # fmt: skip
    assert current(spark, warehouse, "t", ITEMS, "sku") == [{"sku": "C", "stock": 3}]
    assert summary["tables"][ORDERS] == {"inserted": 4, "updated": 6, "deleted": 2, "rows": 2}
    assert summary["tables"][ITEMS] == {"inserted": 3, "updated": 0, "deleted": 0, "rows": 1}
    assert result.ddl == 1
    reasons = sorted(r["reason"] for r in quarantine(spark, warehouse, "t"))
    assert reasons == [
        "invalid JSON: not a JSON object",
        "type mismatch: after.bin = 中 is not binary",
        "type mismatch: after.price = abc is not decimal(12,2)",
        "unknown Canal type 'UPSERT'",
    ]
    assert summary["quarantined"] == 4
    log = changelog(spark, warehouse, "t", ORDERS)
    assert [r["op"] for r in log] == ["r", "r", "c", "c", "u", "u", "d", "u", "u", "u", "u", "d"]
    assert log[0]["after"]["id"] == 1 and log[0]["event_time"] == _ms(es - 60000)
    items = changelog(spark, warehouse, "t", ITEMS)
    assert [r["op"] for r in items] == ["c", "c", "t", "c"]


def test_end_to_end_legacy_convention(spark, warehouse, tmp_path):
    """DTS instances created before 2022-03-20: old = new values, data = previous values."""
    es = 1600161894000
    legacy = write_lines(
        tmp_path / "legacy.jsonl",
        [
            _msg("INSERT", None, [_row(1, "one"), _row(2, "two")], es=es),
            # old carries the whole new row, data the whole previous row
            _msg("UPDATE", [_row(1, "one")], [_row(1, "uno", price="2.00")], es=es + 1000),
            # old may also list only the changed columns: data fills the rest
            _msg("UPDATE", [_row(2, "two")], [{"name": "dos"}], es=es + 2000),
            _msg("DELETE", None, [_row(1, "uno", price="2.00")], es=es + 3000),
            _ddl("ALTER TABLE orders ADD COLUMN note varchar(10)", "orders"),
            _msg("INSERT", None, [_row(3, "tres")], es=es + 4000),
        ],
    )
    summary, result = _replay(spark, warehouse, [legacy], _source("legacy"))

    rows = current(spark, warehouse, "t", ORDERS, "id")
    assert [(r["id"], r["name"], r["price"]) for r in rows] == [
        (2, "dos", Decimal("1.50")),
        (3, "tres", Decimal("1.50")),
    ]
    assert summary["tables"][ORDERS] == {"inserted": 3, "updated": 2, "deleted": 1, "rows": 2}
    assert result.ddl == 1 and summary["quarantined"] == 0
    log = changelog(spark, warehouse, "t", ORDERS)
    update = log[2]
    assert (update["before"]["name"], update["after"]["name"]) == ("one", "uno")
    assert (update["before"]["price"], update["after"]["price"]) == (Decimal("1.50"), Decimal("2"))
