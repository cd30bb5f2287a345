"""Debezium JSON change events, and Lindorm change subscription (Debezium Format V2.0).

Handles the value with and without the JsonConverter ``schema`` envelope, the Kafka key (its
fields name the primary key), Kafka tombstones, ops c/u/d/r/t, heartbeat, transaction-metadata and
schema-change messages. Lindorm differs only in ``source.namespace`` (its schema) and, for HBase
tables, base64 values with a ``ROW`` key column (``image_encoding = "hbase"``).
"""

import base64
import json

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_platform.formats import canonical as C
from cdc_platform.formats import json_records as J
from cdc_platform.formats.column_specs import ColumnSpec, connect_field_spec
from cdc_platform.formats.contract import Options

NAME = "debezium"
# unavailable.value.placeholder: Debezium's connector option of that name (None: any value).
OPTIONS: Options = {
    "lindorm.hbase": ("auto", "true", "false"),
    "unavailable.value.placeholder": None,
}
PLACEHOLDER = "__debezium_unavailable_value"
IMAGE_PATHS = ()  # the parsed images keep the wire column order
TOKEN_PATHS = ("$.payload.after", "$.after", "$.payload.before", "$.before")
CLAIM_PATHS = {"$.payload.op": J.TEXT, "$.payload.ddl": J.FIRST, "$.payload.status": J.PRESENT}

_S = T.StringType()
_SOURCE = T.StructType(
    [
        T.StructField(name, _S)
        for name in (
            "connector", "db", "schema", "namespace", "table", "ts_ms", "snapshot", "lsn", "txId",
            "file", "pos", "row", "gtid", "change_lsn", "commit_lsn", "scn", "commit_scn",
        )
    ]
)  # fmt: skip
_ENVELOPE_FIELDS = [
    T.StructField("before", C.IMAGE),
    T.StructField("after", C.IMAGE),
    T.StructField("op", _S),
    T.StructField("ts_ms", _S),
    T.StructField("source", _SOURCE),
    T.StructField("transaction", T.StructType([T.StructField("id", _S)])),
    # heartbeat / transaction metadata / schema-change topics
    T.StructField("status", _S),
    T.StructField("id", _S),
    T.StructField("ddl", _S),
    T.StructField("databaseName", _S),
    T.StructField("schemaName", _S),
]
_ENVELOPE = T.StructType(_ENVELOPE_FIELDS)
# The top level is either the envelope itself or {"schema": ..., "payload": envelope}.
_TOP = T.StructType(
    [
        T.StructField("schema", _S),
        T.StructField("payload", _ENVELOPE),
    ]
    + _ENVELOPE_FIELDS
)
_KEY = T.StructType([T.StructField("payload", C.IMAGE), T.StructField("schema", _S)])


def _pad(col: Column, width: int) -> Column:
    return F.lpad(col, width, "0")


def _source_sequence(src: Column, ts_ms: Column) -> Column:
    """Each connector's own log position, as a fixed-width string that sorts in commit order."""
    mysql = F.concat_ws(
        ".",
        _pad(F.regexp_extract(src.file, r"(\d+)$", 1), 10),
        _pad(src.pos, 20),
        _pad(src.row, 10),
    )
    return (
        F.when(src.lsn.isNotNull(), F.concat(F.lit("lsn:"), _pad(src.lsn, 20)))
        .when(
            src.commit_lsn.isNotNull() | src.change_lsn.isNotNull(),
            F.concat_ws("/", F.lit("lsn"), src.commit_lsn, src.change_lsn),
        )
        .when(src.file.isNotNull() & src.pos.isNotNull(), F.concat(F.lit("binlog:"), mysql))
        .when(src.scn.isNotNull(), F.concat(F.lit("scn:"), _pad(src.scn, 20)))
        .otherwise(F.concat(F.lit("ts:"), _pad(ts_ms, 20)))
    )


def _image_keys_contain(image: Column, column: str) -> Column:
    return F.coalesce(F.array_contains(F.map_keys(image), column), F.lit(False))


def _unavailable_forms(placeholder: str) -> list[str]:
    """How an unchanged TOASTed value arrives: the placeholder as text, as the bytes of a
    binary column (base64 or hex, per binary.handling.mode), or inside an array."""
    raw = placeholder.encode()
    return [placeholder, base64.b64encode(raw).decode(), raw.hex(), json.dumps([placeholder])]


def parse(raw: DataFrame, options: dict[str, str]) -> DataFrame:
    """Raw messages -> parsed records (``canonical.PARSED_SCHEMA``); never raises on bad input."""
    hbase_option = options.get("lindorm.hbase", "auto")
    df = raw.withColumn("_top", J.read_struct(_TOP))
    bare = F.struct(*[F.col(f"_top.{f.name}").alias(f.name) for f in _ENVELOPE_FIELDS])
    env = F.when(F.col("_top.payload").isNotNull(), F.col("_top.payload")).otherwise(bare)
    key = F.from_json(F.col("key").cast("string"), _KEY)
    # An expression, not a column: parsed only where read (a delete without a before image, and
    # ``key_columns``, which only planning reads), not for every message of a write.
    key_image = F.coalesce(key.payload, F.from_json(F.col("key").cast("string"), C.IMAGE))
    df = df.withColumn("_env", env)

    e = F.col("_env")
    src = e.source
    ts_ms = F.coalesce(F.when(src.ts_ms.cast("long") > 0, src.ts_ms), e.ts_ms)
    op = e.op
    # A delete without a before image can still be applied when the Kafka key names the row.
    before = F.when(op == C.DELETE, F.coalesce(e.before, key_image)).otherwise(e.before)
    # Postgres sends unchanged TOASTed columns as a placeholder: drop them from the image, which
    # then only carries the other columns (the merge keeps the previous values).
    placeholder = options.get("unavailable.value.placeholder", PLACEHOLDER)
    unavailable = F.array(*[F.lit(v) for v in _unavailable_forms(placeholder)])
    after = F.map_filter(
        e.after, lambda _, v: ~F.coalesce(F.array_contains(unavailable, v), F.lit(False))
    )
    after_partial = F.coalesce(F.size(after) < F.size(e.after), F.lit(False))
    is_hbase = {
        "true": F.lit(True),
        "false": F.lit(False),
        "auto": _image_keys_contain(F.coalesce(after, before), "ROW"),
    }[hbase_option]
    value_schema = F.when(
        F.col("_top.payload").isNotNull() & (F.col("_top.schema") != "{}"), F.col("_top.schema")
    )

    corrupt = F.col("value").isNotNull() & (J.corrupt(F.col("_top")) | F.col("_env").isNull())
    reason = (
        F.when(corrupt, F.lit(J.NOT_AN_OBJECT))
        .when(op.isNull(), F.lit("not a Debezium change event: no 'op' field"))
        .when(~op.isin(*C.OPS), F.concat(F.lit("unknown Debezium op '"), op, F.lit("'")))
        .when(src.isNull() | src.table.isNull(), F.lit("no source.table: table unknown"))
        .when(
            op.isin(C.INSERT, C.READ, C.UPDATE) & after.isNull(),
            F.concat(F.lit("op '"), op, F.lit("' without an after image")),
        )
        .when(
            (op == C.DELETE) & before.isNull(),
            F.lit("delete without before image or message key: the row cannot be identified"),
        )
    )
    control = F.col("value").isNull() | (
        op.isNull()
        & ~corrupt
        & (
            e.status.isin("BEGIN", "END")  # transaction metadata topic
            | (e.ts_ms.isNotNull() & src.isNull() & e.ddl.isNull())  # heartbeat
        )
    )
    is_ddl = op.isNull() & ~corrupt & e.ddl.isNotNull()
    kind = (
        F.when(control, F.lit(C.KIND_CONTROL))
        .when(is_ddl, F.lit(C.KIND_DDL))
        .when(reason.isNotNull(), F.lit(C.KIND_ERROR))
        .otherwise(F.lit(C.KIND_CHANGE))
    )
    control_reason = (
        F.when(F.col("value").isNull(), F.lit("kafka tombstone"))
        .when(e.status.isNotNull(), F.concat(F.lit("transaction "), e.status))
        .otherwise(F.lit("heartbeat"))
    )
    parsed = df.select(
        "*",
        kind.alias("kind"),
        F.when(kind == C.KIND_ERROR, reason)
        .when(kind == C.KIND_CONTROL, control_reason)
        .alias("reason"),
        op.alias("op"),
        F.coalesce(src.db, e.databaseName).alias("database"),
        F.coalesce(src.schema, src.namespace, e.schemaName).alias("schema"),
        src.table.alias("table"),
        F.when(is_hbase, F.array(F.lit("ROW")))
        .otherwise(F.map_keys(key_image))
        .alias("key_columns"),
        before.alias("before_image"),
        after.alias("after_image"),
        after_partial.alias("after_partial"),
        value_schema.alias("value_schema"),
        F.when(is_hbase, F.lit("hbase")).otherwise(F.lit("json")).alias("image_encoding"),
        _source_sequence(src, ts_ms).alias("source_sequence"),
        F.timestamp_millis(ts_ms.cast("long")).alias("event_time"),
        F.coalesce(e.transaction.id, src.txId, src.gtid, src.commit_lsn).alias("tx_id"),
        e.ddl.alias("ddl"),
        F.when(F.coalesce(src.namespace, F.lit("")) != "", F.lit("lindorm"))
        .otherwise(F.lit(NAME))
        .alias("source_format"),
    )
    return parsed.drop("_top", "_env")


def column_specs(value_schema: str) -> dict[str, ColumnSpec]:
    """Column types from a JsonConverter envelope schema (the ``after``, else ``before`` struct)."""
    schema = json.loads(value_schema)
    images = {f.get("field"): f for f in schema.get("fields", []) if isinstance(f, dict)}
    image = images.get("after") or images.get("before") or {}
    return {
        field["field"]: connect_field_spec(field)
        for field in image.get("fields", [])
        if isinstance(field, dict) and "field" in field
    }


def claims(keys: Column, value: Column, probe: Column) -> Column:
    """A Debezium envelope (bare or under ``payload``), heartbeat or transaction marker."""

    has = J.key_test(keys)
    enveloped = (
        has("schema")
        & has("payload")
        & (
            (F.length(J.probed(probe, "$.payload.op")) == 1)
            # Debezium's schema-change ddl is a string; DataWorks' is an object {text, ddlMeta}
            | F.coalesce(~J.probed(probe, "$.payload.ddl").startswith("{"), F.lit(False))
            | J.probed(probe, "$.payload.status").isNotNull()
        )
    )
    bare = has("op") & has("source") & (has("before") | has("after"))
    heartbeat = (F.size(keys) == 1) & has("ts_ms")
    tx_marker = has("status") & has("id") & has("event_count")
    return enveloped | bare | heartbeat | tx_marker
