"""DTS Avro (``formats.dts_avro``): decoding, typing, detection and an end-to-end replay.

Seed 002 shows no DTS Avro bytes (only the schema reference), so the messages are built here with
``fastavro.schemaless_writer`` and the package's ``dts_avro.avsc``, following the record layout of
``../shared/specs/dts-avro.md``, and landed as ``.kafka.jsonl`` lines with ``value_b64``.
"""

import base64
import datetime as dt
import io
import json
import random
from decimal import Decimal
from pathlib import Path

import fastavro
import pytest
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.formats import canonical as C
from cdc_platform.formats import detect, dts_avro
from cdc_platform.formats.column_specs import ColumnSpec
from cdc_platform.ingest import landing
from cdc_platform.normalize import table_name
from cdc_platform.steps.current import current_rows
from cdc_platform.steps.replay import replay
from tests.conftest import SHARED

NS = "com.alibaba.dts.formats.avro."
DATE = "2026-01-01"
TS = 1696984408  # sourceTimestamp: epoch seconds
CUSTOMERS = "mydb.customers"
ORDERS = "mydb.orders"
CUSTOMER_FIELDS = [
    ("id", 3), ("name", 253), ("balance", 246), ("created", 12), ("updated", 7), ("birthday", 10),
    ("avatar", 252), ("score", 5), ("flags", 1), ("doc", 245), ("wake", 11),
]  # fmt: skip


# --- building DTS Avro messages ----------------------------------------------------------------


def record(op: str, offset: int = 0, **overrides) -> dict:
    """A Record as DTS writes it for MySQL; positions and ids grow with ``offset``."""
    rec = {
        "version": 0,
        "id": 1000 + offset,
        "sourceTimestamp": TS + offset,
        "sourcePosition": f"{4000 + offset * 100}@78",
        "safeSourcePosition": f"{4000 + offset * 100}@78",
        "sourceTxid": "0",
        "source": {"sourceType": "MySQL", "version": "8.0.28"},
        "operation": op,
        "objectName": CUSTOMERS,
        "processTimestamps": None,
        "tags": {"pk_uk_info": '{"PRIMARY":["id"]}', "GTID": f"3e11fa47-71ca:{offset}"},
        "fields": None,
        "beforeImages": None,
        "afterImages": None,
        "bornTimestamp": TS + offset,
    }
    rec.update(overrides)
    return rec


def encode(rec: dict, legacy: bool = False) -> bytes:
    """Schemaless Avro binary; ``legacy``: the pre-2020 writer without ``bornTimestamp``."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, dts_avro.parsed_schema(not legacy), rec)
    return buf.getvalue()


def integer(v: int, precision: int = 4) -> tuple:
    return (NS + "Integer", {"precision": precision, "value": str(v)})


def chars(s: str, charset: str = "utf8mb4") -> tuple:
    return (NS + "Character", {"charset": charset, "value": s.encode()})


def decimal(s: str, precision: int, scale: int) -> tuple:
    return (NS + "Decimal", {"value": s, "precision": precision, "scale": scale})


def datetime_(**parts) -> tuple:
    return (NS + "DateTime", parts)


def customer(cid: int, name: str, balance: str = "12.50") -> list:
    """An image of mydb.customers in CUSTOMER_FIELDS order."""
    return [
        integer(cid),
        chars(name),
        decimal(balance, 10, 2),
        datetime_(year=2023, month=10, day=11, hour=8, minute=33, second=28, millis=250000),
        (NS + "Timestamp", {"timestamp": TS, "millis": 123456}),
        datetime_(year=1990, month=2, day=28),
        (NS + "BinaryObject", {"type": "BLOB", "value": b"\x00\xffpng"}),
        (NS + "Float", {"value": 0.1, "precision": 22, "scale": 0}),
        integer(1, 1),
        (NS + "TextObject", {"type": "JSON", "value": '{"vip": true}'}),
        datetime_(hour=-838, minute=59, second=59),
    ]


def row_change(op: str, offset: int, before=None, after=None, fields=None, **overrides) -> dict:
    fields = fields or CUSTOMER_FIELDS
    return record(
        op,
        offset,
        fields=[{"name": n, "dataTypeNumber": code} for n, code in fields],
        beforeImages=before,
        afterImages=after,
        **overrides,
    )


def order(oid: int, offset: int) -> dict:
    return row_change(
        "INSERT", offset, after=[integer(oid), chars(f"o{oid}")],
        fields=[("order_id", 3), ("code", 253)], objectName=ORDERS,
        tags={"pk_uk_info": '{"PRIMARY":["order_id"]}'},
    )  # fmt: skip


def kafka_line(offset: int, value: bytes | None) -> str:
    """A ``.kafka.jsonl`` envelope: binary values travel as ``value_b64``."""
    env = {"topic": "dts", "partition": 0, "offset": offset, "timestamp": 1700000000000 + offset}
    if value is None:
        env["value"] = None
    else:
        env["value_b64"] = base64.b64encode(value).decode()
    return json.dumps(env)


def write_messages(path: Path, values: list[bytes | None]) -> Path:
    path.write_text("".join(kafka_line(i, v) + "\n" for i, v in enumerate(values)))
    return path


def random_bytes(seed: int, n: int) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.randrange(256) for _ in range(n))


# --- the schema is the spec's, loaded as package data ------------------------------------------


def test_packaged_schema_is_the_spec_schema():
    spec = SHARED / "specs" / "dts-avro.avsc"
    packaged = Path(dts_avro.__file__).with_name(dts_avro.SCHEMA_RESOURCE)
    assert packaged.read_bytes() == spec.read_bytes()
    assert dts_avro.schema_json() == json.loads(spec.read_text())
    names = [f["name"] for f in dts_avro.schema_json()["fields"]]
    assert names[0] == "version" and names[-1] == "bornTimestamp"


# --- decoding: both writer generations, and never raising --------------------------------------


def test_decodes_both_writer_generations():
    rec = row_change("INSERT", 1, after=customer(1, "ann"))
    new, legacy = dts_avro.decode(encode(rec)), dts_avro.decode(encode(rec, legacy=True))
    assert new["bornTimestamp"] == TS + 1
    assert legacy["bornTimestamp"] is None
    assert {k: v for k, v in new.items() if k != "bornTimestamp"} == {
        k: v for k, v in legacy.items() if k != "bornTimestamp"
    }


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"", "invalid DTS Avro: truncated record"),
        (encode(record("INSERT"))[:25], "invalid DTS Avro: truncated record"),
        (encode(record("HEARTBEAT", objectName=None)) + b"\x00\x00", "invalid DTS Avro: "),
        (random_bytes(1, 64), "invalid DTS Avro: "),
        (random_bytes(2, 300), "invalid DTS Avro: "),
        (b'{"op": "c"}', "invalid DTS Avro: "),
    ],
)
def test_bad_bytes_are_errors_with_a_reason_never_exceptions(value, reason):
    parsed = dts_avro.parse_value(value)
    assert parsed["kind"] == C.KIND_ERROR
    assert parsed["reason"].startswith(reason)


def test_unknown_enum_index_is_an_error():
    raw = bytearray(encode(record("HEARTBEAT", objectName=None)))
    # header: version 0, id, sourceTimestamp (5 bytes), 3 strings, sourceType, version string, op
    at = raw.index(b"8.0.28") + len(b"8.0.28")
    assert raw[at] == 2 * 8  # HEARTBEAT is symbol 8 (zig-zag 16)
    raw[at] = 2 * 40
    parsed = dts_avro.parse_value(bytes(raw))
    assert parsed["kind"] == C.KIND_ERROR
    assert parsed["reason"].startswith("invalid DTS Avro: enum or union index out of range")


# --- values -> wire text -> types ---------------------------------------------------------------


def test_values_render_as_text_the_column_decoders_type():
    parsed = dts_avro.parse_value(encode(row_change("INSERT", 0, after=customer(7, "zoë"))))
    assert parsed["kind"] == C.KIND_CHANGE and parsed["op"] == C.INSERT
    assert parsed["after_image"] == {
        "id": "7",
        "name": "zoë",
        "balance": "12.50",
        # DATETIME: the wall clock read as UTC, in epoch microseconds (fraction is micros)
        "created": str(int(dt.datetime(2023, 10, 11, 8, 33, 28, 250000, dt.UTC).timestamp() * 1e6)),
        "updated": f"{TS}123456",  # TIMESTAMP: epoch seconds + microseconds
        "birthday": "1990-02-28",
        "avatar": base64.b64encode(b"\x00\xffpng").decode(),
        "score": "0.1",
        "flags": "1",
        "doc": '{"vip": true}',
        "wake": "-838:59:59",  # TIME: text (negative and beyond 24 h in MySQL)
    }
    assert parsed["key_columns"] == ["id"]
    assert parsed["after_partial"] is False
    specs = dts_avro.column_specs(parsed["value_schema"])
    assert specs == {
        "id": ColumnSpec("int"),
        "name": ColumnSpec("string"),
        "balance": ColumnSpec("decimal(38,2)"),
        "created": ColumnSpec("timestamp", "epoch_micros"),
        "updated": ColumnSpec("timestamp", "epoch_micros"),
        "birthday": ColumnSpec("date"),
        "avatar": ColumnSpec("binary", "base64"),
        "score": ColumnSpec("double"),
        "flags": ColumnSpec("tinyint"),
        "doc": ColumnSpec("string"),
        "wake": ColumnSpec("string"),
    }


def test_other_sources_charsets_zones_and_special_values():
    fields = [("n", 2), ("ts", 180), ("tz", 181), ("raw", 23), ("cs", 1), ("f", 101), ("big", 1700)]
    oracle = row_change(
        "INSERT",
        0,
        after=[
            decimal("-3.14159", 38, 5),
            datetime_(year=2024, month=1, day=2, hour=3, minute=4, second=5, millis=123456789),
            (NS + "TimestampWithTimeZone",
             {"value": {"year": 2024, "month": 1, "day": 2, "hour": 8, "minute": 0, "second": 0,
                        "millis": None}, "timezone": "+08:00"}),
            (NS + "BinaryObject", {"type": "RAW", "value": b"\x01\x02"}),
            (NS + "Character", {"charset": "gbk", "value": "中文".encode("gbk")}),
            (NS + "Float", {"value": float("nan"), "precision": 0, "scale": 0}),
            None,
        ],
        fields=fields, objectName="ORCL.HR.EMP", source={"sourceType": "Oracle", "version": "19c"},
        sourcePosition="12345", tags={},
    )  # fmt: skip
    parsed = dts_avro.parse_value(encode(oracle))
    assert (parsed["database"], parsed["schema"], parsed["table"]) == ("ORCL", "HR", "EMP")
    assert parsed["source_sequence"] == "id:00000000000000001000"  # no binlog position
    assert parsed["key_columns"] is None
    assert parsed["tx_id"] is None  # sourceTxid "0" and no GTID tag
    micros = int(dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC).timestamp()) * 10**6 + 123456
    assert parsed["after_image"] == {
        "n": "-3.14159",
        "ts": str(micros),  # Oracle's fraction is nanoseconds
        "tz": str(int(dt.datetime(2024, 1, 2, 0, 0, tzinfo=dt.UTC).timestamp()) * 10**6),
        "raw": "AQI=",
        "cs": "中文",
        "f": "NaN",
        "big": None,
    }
    specs = dts_avro.column_specs(parsed["value_schema"])
    assert specs["n"] == ColumnSpec("decimal(38,5)")
    assert specs["ts"] == specs["tz"] == ColumnSpec("timestamp", "epoch_micros")
    assert specs["raw"] == ColumnSpec("binary", "base64")
    assert specs["cs"] == ColumnSpec("string") and specs["f"] == ColumnSpec("double")
    assert "big" not in specs  # code 1700 is not an Oracle code and the value is null: undecided

    pg = row_change(
        "INSERT", 0,
        after=[integer(1, 8), (NS + "TextObject", {"type": "BOOL", "value": "t"}),
               chars("\x00\x01", "binary"), "NONE"],  # EmptyObject: written by its symbol
        fields=[("id", 20), ("ok", 16), ("bin", 1043), ("gone", 25)], objectName="db.public.t",
        source={"sourceType": "PostgreSQL", "version": "14"},
    )  # fmt: skip
    parsed = dts_avro.parse_value(encode(pg))
    assert parsed["after_image"] == {"id": "1", "ok": "t", "bin": "AAE="}
    assert parsed["after_partial"] is True  # "gone" was not captured: keep its value
    specs = dts_avro.column_specs(parsed["value_schema"])
    assert specs == {
        "id": ColumnSpec("bigint"),
        "ok": ColumnSpec("boolean"),
        "bin": ColumnSpec("binary", "base64"),
    }


def test_operations_map_to_kinds():
    def parsed(rec: dict) -> dict:
        return dts_avro.parse_value(encode(rec))

    for op in ("BEGIN", "COMMIT", "ROLLBACK"):
        p = parsed(record(op, objectName=None))
        assert (p["kind"], p["reason"]) == (C.KIND_CONTROL, f"transaction {op}")
    assert parsed(record("HEARTBEAT", objectName=None))["reason"] == "heartbeat"
    assert parsed(record("NOOP", objectName=None))["kind"] == C.KIND_CONTROL
    ddl = parsed(record("DDL", objectName="mydb", afterImages="ALTER TABLE t ADD c INT"))
    assert (ddl["kind"], ddl["ddl"], ddl["database"]) == (
        C.KIND_DDL,
        "ALTER TABLE t ADD c INT",
        "mydb",
    )
    trunc = parsed(record("DDL", objectName="mydb", afterImages="truncate table `orders`;"))
    assert (trunc["kind"], trunc["op"]) == (C.KIND_CHANGE, C.TRUNCATE)
    assert (trunc["database"], trunc["table"]) == ("mydb", "orders")
    init = parsed(row_change("INIT", 0, after=customer(1, "a")))
    assert init["op"] == C.READ
    no_after = parsed(row_change("UPDATE", 0, before=customer(1, "a")))
    assert no_after["kind"] == C.KIND_ERROR and "without an after image" in no_after["reason"]
    short = row_change("INSERT", 0, after=customer(1, "a")[:3])
    assert "3 values for 11 fields" in parsed(short)["reason"]
    drds = parsed(
        row_change("INSERT", 0, after=customer(1, "a"), objectName="app_db_0005.orders_11",
                   tags={"l_db_name": "app_db", "l_tb_name": "customers"})
    )  # fmt: skip
    assert (drds["database"], drds["table"]) == ("app_db", "customers")
    escaped = parsed(row_change("INSERT", 0, after=customer(1, "a"), objectName="my\\u002Edb.t"))
    assert (escaped["database"], escaped["table"]) == ("my.db", "t")


# --- parse() in Spark: raw columns kept, exactly the parsed-record columns added ----------------


def test_parse_keeps_raw_columns_and_adds_the_parsed_schema(spark, tmp_path):
    path = write_messages(
        tmp_path / "m.kafka.jsonl",
        [encode(row_change("INSERT", 0, after=customer(1, "a"))), b"\x01garbage", None],
    )
    raw = spark.createDataFrame(landing.read_file(path, DATE, "dts"))
    parsed = dts_avro.parse(raw, {})
    assert parsed.schema.fieldNames() == raw.columns + C.PARSED_SCHEMA.fieldNames()
    assert [f.dataType for f in parsed.schema.fields[len(raw.columns) :]] == [
        f.dataType for f in C.PARSED_SCHEMA.fields
    ]
    rows = parsed.orderBy("offset").toArrow().to_pylist()
    assert [r["kind"] for r in rows] == [C.KIND_CHANGE, C.KIND_ERROR, C.KIND_CONTROL]
    assert rows[0]["value"] == raw.orderBy("offset").first()["value"]
    assert rows[0]["event_time"] == dt.datetime(2023, 10, 11, 0, 33, 28, tzinfo=dt.UTC)
    assert rows[0]["source_format"] == "dts-avro" and rows[0]["image_encoding"] == "json"
    assert rows[1]["reason"].startswith("invalid DTS Avro: ")
    assert rows[2]["reason"] == "kafka tombstone"


# --- detection ----------------------------------------------------------------------------------


def test_claims_dts_avro_bytes_and_never_json(spark):
    values = [
        ("insert", encode(row_change("INSERT", 0, after=customer(1, "a")))),
        ("legacy", encode(record("HEARTBEAT", objectName=None, version=170844600), legacy=True)),
        ("ddl", encode(record("DDL", objectName="mydb", afterImages="DROP TABLE t"))),
        ("debezium", b'{"op":"c","source":{"table":"t"},"after":{"id":1}}'),
        ("shareplex", b'{"meta":{"op":"ins","table":"A.B"},"data":{"ID":"1"}}'),
        ("json_array", b'[{"op":"c"}]'),
        ("text", b"a license header line, not a message"),
        ("empty", b""),
    ] + [(f"random{i}", random_bytes(100 + i, 10 + 7 * i)) for i in range(40)]
    df = spark.createDataFrame(values, "name string, value binary")
    # As format detection calls it: the value as a string, keys null unless a JSON object.
    text = F.col("value").cast("string")
    keys = F.when(F.col("value").isNotNull(), F.json_object_keys(text))
    rows = df.select(
        "name",
        dts_avro.claims(keys, text, F.lit(None)).alias("as_text"),
        dts_avro.claims(keys, F.col("value"), F.lit(None)).alias("as_binary"),
        detect.claimants(keys, text).alias("claimants"),
    ).collect()
    claimed = {r["name"] for r in rows if r["as_text"]}
    assert claimed == {r["name"] for r in rows if r["as_binary"]} == {"insert", "legacy", "ddl"}
    # no other format claims DTS Avro bytes, so `format: auto` routes them here alone
    assert all(r["claimants"] == ["dts-avro"] for r in rows if r["name"] in claimed)


# --- end to end ---------------------------------------------------------------------------------


def _messages() -> list[bytes | None]:
    """One partition of a DTS topic: transactions, heartbeats, DDL, a truncate, bad bytes."""
    upd_before, upd_after = customer(1, "ann", "12.50"), customer(1, "ann b.", "99.00")
    good_insert = encode(row_change("INSERT", 3, after=customer(3, "cy")))
    return [
        encode(record("BEGIN", 0, objectName=None, fields=None)),
        encode(row_change("INSERT", 1, after=customer(1, "ann"))),
        encode(row_change("INSERT", 2, after=customer(2, "bo"))),
        good_insert,
        encode(record("COMMIT", 4, objectName=None)),
        encode(record("HEARTBEAT", 5, objectName=None)),
        encode(row_change("UPDATE", 6, before=upd_before, after=upd_after)),
        encode(row_change("DELETE", 7, before=customer(2, "bo"))),
        encode(record("DDL", 8, objectName="mydb", afterImages="ALTER TABLE customers ADD x INT")),
        good_insert[: len(good_insert) // 2],  # truncated
        random_bytes(42, 120),  # not Avro at all
        encode(order(1, 11)),
        encode(order(2, 12)),
        encode(record("DDL", 13, objectName="mydb", afterImages="TRUNCATE TABLE `orders`")),
        encode(order(3, 14)),
        # two updates of row 3 arriving out of order: the binlog position decides
        encode(row_change("UPDATE", 16, before=customer(3, "cy"), after=customer(3, "cy new"))),
        encode(row_change("UPDATE", 15, before=customer(3, "cy"), after=customer(3, "cy old"))),
        # a full-load row, older than everything else, and a pre-2020 writer's insert
        encode(row_change("INIT", -30, after=customer(4, "dee"))),
        encode(row_change("INSERT", 18, after=customer(5, "ed")), legacy=True),
        encode(record("ROLLBACK", 19, objectName=None)),
        None,  # a Kafka tombstone
    ]


def test_replay_reaches_the_final_state(spark, warehouse, tmp_path):
    path = write_messages(tmp_path / "dts.kafka.jsonl", _messages())
    summary, result = replay(
        spark, warehouse, [path], SourceConfig(name="t", format="dts-avro"), DATE
    )

    assert summary["tables"][CUSTOMERS] == {"inserted": 5, "updated": 3, "deleted": 1, "rows": 4}
    assert summary["tables"][ORDERS]["rows"] == 1
    assert summary["quarantined"] == 2
    assert (result.control, result.ddl) == (5, 1)  # BEGIN COMMIT HEARTBEAT ROLLBACK tombstone
    assert result.tables[table_name(CUSTOMERS)].key == ["id"]  # from pk_uk_info

    rows = current_rows(spark, warehouse, "t", table_name(CUSTOMERS))
    current = {r["id"]: r for r in rows.toArrow().to_pylist()}
    assert sorted(current) == [1, 3, 4, 5]
    assert (current[1]["name"], current[1]["balance"]) == ("ann b.", Decimal("99.00"))
    assert current[3]["name"] == "cy new"  # the later position wins, not the later arrival
    assert current[1] | {"name": None, "balance": None} == {
        "id": 1,
        "name": None,
        "balance": None,
        "created": dt.datetime(2023, 10, 11, 8, 33, 28, 250000, tzinfo=dt.UTC),
        "updated": dt.datetime.fromtimestamp(TS, dt.UTC) + dt.timedelta(microseconds=123456),
        "birthday": dt.date(1990, 2, 28),
        "avatar": b"\x00\xffpng",
        "score": 0.1,
        "flags": 1,
        "doc": '{"vip": true}',
        "wake": "-838:59:59",
    }
    orders = current_rows(spark, warehouse, "t", table_name(ORDERS))
    assert [r["order_id"] for r in orders.collect()] == [3]  # truncated before order 3

    changelog = lake.read(
        spark, lake.TableRef(lake.CHANGELOG, "t", "mydb__customers").uri(warehouse)
    )
    first = changelog.where(F.col("after.id") == 1).orderBy("sequence").toArrow().to_pylist()[0]
    assert first["op"] == "c" and first["source_format"] == "dts-avro"
    assert first["event_time"] == dt.datetime(2023, 10, 11, 0, 33, 29, tzinfo=dt.UTC)
    assert first["tx_id"] == "3e11fa47-71ca:1"
    assert first["sequence"].startswith("binlog:0000000078.00000000000000004100.")

    quarantine = lake.read(spark, lake.TableRef(lake.QUARANTINE, "t").uri(warehouse))
    bad = quarantine.orderBy("offset").collect()
    assert [r["offset"] for r in bad] == [9, 10]
    assert all(r["reason"].startswith("invalid DTS Avro: ") for r in bad)
    assert bad[0]["reason"].startswith("invalid DTS Avro: truncated record")
    assert bad[1]["value"] == random_bytes(42, 120)  # raw bytes kept
