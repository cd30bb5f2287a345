"""SharePlex JSON as written by Alibaba DTS (and SharePlex itself) to Kafka.

``{"meta": {time, userid, op, scn, rowid, trans, seq, size, table, idx, posttime}, "data": {...},
"key": {...}}``. ``meta.table`` is ``OWNER.TABLE`` (an Oracle schema and table; no database).

- ``ins``: ``data`` is the new row.
- ``upd``: ``data`` holds **only the changed columns** (new values) and ``key`` the row's
  identifying previous values. The before image is ``key``; the after image is ``key`` overlaid
  with ``data`` (unchanged key columns keep their values, so the row can be identified from it)
  and is partial (``after_partial``): the columns it lacks keep their previous values.
- ``del``: ``data`` is the deleted row (with ``key``, if any, overlaid): the before image.
- truncate -> op ``t``; a column drop -> kind ``ddl`` (SharePlex carries no SQL text for it: the
  ``ddl`` column holds the message); ``UPDATE BEFORE`` -> control (its ``UPDATE AFTER`` carries the
  change). Op spellings are matched case-insensitively with ``_``/``-``/spaces alike: the seed
  documents ``ins upd del`` in its examples and ``INSERT UPDATE DELETE TRUNCATE DROP COLUMN UPDATE
  BEFORE UPDATE AFTER`` in its field table; SharePlex's short forms ``trunc`` and ``dropcol`` are
  accepted too.

Key columns are the ``key`` object's columns (configure ``primary_key`` when SharePlex uses every
column as the key of a table without one). Values are JSON text; SharePlex carries no column types,
so they come from configuration (``column_specs`` is empty). Order: ``scn``, then ``trans``, then
``seq`` (from ``idx`` when absent), each zero-padded; ``event_time`` is ``meta.time`` (UTC).
"""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_platform.formats import canonical as C
from cdc_platform.formats import json_records as J
from cdc_platform.formats.column_specs import ColumnSpec
from cdc_platform.formats.contract import Options

NAME = "shareplex"
OPTIONS: Options = {}
IMAGE_PATHS = ()  # the parsed images keep the wire column order
TOKEN_PATHS = ()
CLAIM_PATHS = {"$.meta.op": J.PRESENT}

_S = T.StringType()
_META = T.StructType(
    [
        T.StructField(name, _S)
        for name in ("time", "userid", "op", "scn", "rowid", "trans", "seq", "size", "table",
                     "idx", "posttime")
    ]
)  # fmt: skip
_TOP = T.StructType(
    [
        T.StructField("meta", _META),
        T.StructField("data", C.IMAGE),
        T.StructField("key", C.IMAGE),
    ]
)

# Normalized spelling (lower case, runs of space/_/- as one space) -> canonical meaning.
_INSERT = ("ins", "insert")
_UPDATE = ("upd", "update", "update after", "upd after")
_DELETE = ("del", "delete")
_TRUNCATE = ("trunc", "truncate", "truncate table")
_DROP_COLUMN = ("drop column", "dropcol", "drop col")
_UPDATE_BEFORE = ("update before", "upd before")


def _digits(col: Column, width: int) -> Column:
    return F.lpad(F.coalesce(col, F.lit("")), width, "0")


def _source_sequence(meta: Column) -> Column:
    """scn, then the transaction id (each dotted part padded), then the operation's seq."""
    trans = F.array_join(
        F.transform(F.split(F.coalesce(meta.trans, F.lit("")), r"\."), lambda p: _digits(p, 12)),
        ".",
    )
    seq = F.coalesce(meta.seq, F.nullif(F.regexp_extract(meta.idx, r"^(\d+)/", 1), F.lit("")))
    tail = F.concat(F.lit("."), trans, F.lit("."), _digits(seq, 10))
    return F.when(meta.scn.isNotNull(), F.concat(F.lit("scn:"), _digits(meta.scn, 20), tail)).when(
        meta.time.isNotNull(), F.concat(F.lit("time:"), meta.time, tail)
    )


def _event_time(time: Column) -> Column:
    """``yyyy-MM-ddTHH:mm:ss[Z]``, UTC whether or not the zone is written."""
    zoned = time.rlike(r"(Z|[+-]\d{2}:?\d{2})$")
    return F.try_to_timestamp(F.when(zoned, time).otherwise(F.concat(time, F.lit("Z"))))


def parse(raw: DataFrame, options: dict[str, str]) -> DataFrame:
    """Raw messages -> parsed records (``canonical.PARSED_SCHEMA``); never raises on bad input."""
    text = J.text()
    df = raw.withColumn("_top", J.read_struct(_TOP))
    top = F.col("_top")
    meta, data, key = top.meta, top.data, top.key
    op_text = F.lower(F.regexp_replace(F.trim(meta.op), r"[\s_-]+", " "))
    op = (
        F.when(op_text.isin(*_INSERT), F.lit(C.INSERT))
        .when(op_text.isin(*_UPDATE), F.lit(C.UPDATE))
        .when(op_text.isin(*_DELETE), F.lit(C.DELETE))
        .when(op_text.isin(*_TRUNCATE), F.lit(C.TRUNCATE))
    )
    is_ddl = op_text.isin(*_DROP_COLUMN)
    is_control = op_text.isin(*_UPDATE_BEFORE)
    owner_table = meta.table
    has_owner = F.coalesce(owner_table.contains("."), F.lit(False))
    schema = F.when(has_owner, F.substring_index(owner_table, ".", 1))
    table = F.when(has_owner, F.regexp_extract(owner_table, r"^[^.]*\.(.*)$", 1))
    table = F.when(F.coalesce(owner_table, F.lit("")) != "", F.coalesce(table, owner_table))

    corrupt = F.col("value").isNotNull() & J.corrupt(top)
    reason = (
        J.unreadable_reason(
            corrupt, "not a SharePlex message: meta, data and key must be JSON objects"
        )
        .when(meta.op.isNull(), F.lit("not a SharePlex message: no meta.op"))
        .when(
            op.isNull() & ~is_ddl & ~is_control,
            F.concat(F.lit("unknown SharePlex op '"), meta.op, F.lit("'")),
        )
        .when(table.isNull(), F.lit("no meta.table: table unknown"))
        .when(
            op.isin(C.INSERT, C.UPDATE) & data.isNull(),
            F.concat(F.lit("op '"), meta.op, F.lit("' without data")),
        )
        .when(
            (op == C.DELETE) & data.isNull() & key.isNull(),
            F.lit("delete without data or key: the row cannot be identified"),
        )
    )
    kind = (
        F.when(F.col("value").isNull(), F.lit(C.KIND_CONTROL))
        .when(~corrupt & is_control, F.lit(C.KIND_CONTROL))
        .when(~corrupt & is_ddl, F.lit(C.KIND_DDL))
        .when(reason.isNotNull(), F.lit(C.KIND_ERROR))
        .otherwise(F.lit(C.KIND_CHANGE))
    )
    kind_reason = (
        F.when(kind == C.KIND_ERROR, reason)
        .when(F.col("value").isNull(), F.lit("kafka tombstone"))
        .when(kind == C.KIND_CONTROL, F.lit("update before image: its UPDATE AFTER is the change"))
        .when(kind == C.KIND_DDL, F.concat(F.lit("column drop on "), owner_table))
    )
    change = kind == C.KIND_CHANGE
    before = F.when(op == C.UPDATE, key).when(op == C.DELETE, J.overlay(data, key))
    after = F.when(op == C.INSERT, data).when(op == C.UPDATE, J.overlay(key, data))
    parsed = df.select(
        "*",
        kind.alias("kind"),
        kind_reason.alias("reason"),
        F.when(change | (kind == C.KIND_ERROR), op).alias("op"),
        F.lit(None).cast(_S).alias("database"),
        schema.alias("schema"),
        table.alias("table"),
        F.when(change & key.isNotNull(), F.map_keys(key)).alias("key_columns"),
        F.when(change, before).alias("before_image"),
        F.when(change, after).alias("after_image"),
        (change & (op == C.UPDATE)).alias("after_partial"),
        F.lit(None).cast(_S).alias("value_schema"),
        F.lit("json").alias("image_encoding"),
        _source_sequence(meta).alias("source_sequence"),
        _event_time(meta.time).alias("event_time"),
        meta.trans.alias("tx_id"),
        F.when(kind == C.KIND_DDL, text).alias("ddl"),
        F.lit(NAME).alias("source_format"),
    )
    return parsed.drop("_top")


def column_specs(value_schema: str) -> dict[str, ColumnSpec]:
    """SharePlex carries no column types: they come from configuration (else string)."""
    return {}


def claims(keys: Column, value: Column, probe: Column) -> Column:
    """A JSON object with ``meta`` and ``data`` or ``key``, whose ``meta`` has an ``op``."""

    has = J.key_test(keys)
    return has("meta") & (has("data") | has("key")) & J.probed(probe, "$.meta.op").isNotNull()
