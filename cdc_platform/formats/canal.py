"""Canal flat-message JSON, as open-source Canal and Alibaba DTS ("Canal Json") write it.

One message is one binlog rows event of one table: ``data`` (and ``old``) are arrays, so a message
holding several rows yields one parsed record per row (``posexplode``). Values are JSON strings
(numbers, as Flink's canal-json writes them, keep their exact text), typed by the message's
``mysqlType`` (``column_specs``; binary values, which Canal writes as ISO-8859-1 text, are
re-encoded as base64 so they decode to their bytes); ``pkNames`` names the key. ``type`` is
INSERT, UPDATE, DELETE, or INIT for DTS full-load rows (a snapshot read, ``r``). DDL messages
(``isDdl``, ``sql``) are counted, never applied, except ``TRUNCATE``, which truncates its table.

Two conventions of ``data``/``old`` (option ``canal.convention``):

- ``current`` (open-source Canal; DTS instances created or restarted since 2022-03-20): ``data``
  holds the new rows (a DELETE's row too), ``old`` the previous values of the changed columns only
  (present with null = the old value was NULL, absent = unchanged);
- ``legacy`` (DTS instances created before 2022-03-20): ``old`` holds the new values (all columns
  by default) and ``data`` the previous ones; a DELETE's row is in ``old`` (``data`` null).
  INSERT, INIT and DELETE rows are read from whichever array holds them (the convention's first).

Either way the after image is the full new row and the before image of an update is the new row
overlaid with the previous values, so ``after_partial`` is false.

Order: a Canal message carries no log position. ``es`` (the binlog event's time, whole seconds)
and ``id`` (open-source Canal's batch id; DTS's cache offset) do not follow commit order, and the
corpus shows it: a DDL with id 13 and an earlier ``es`` precedes the DELETE with id 12; two
different messages share id 6 and two share id 9 (an UPDATE then a DELETE of row 111, identical
``es``/``ts``); the last INSERT carries an earlier ``es`` than the messages before it. A binlog
timestamp is when a statement started, so it can go backwards between transactions. What Canal
and DTS do guarantee is the topic order (rows in binlog order, a key always in one partition), so
``source_sequence`` is the message's topic position (partition and offset, or landing file and
line: the tie-break ``normalize`` appends too) followed by the row's index in the message.

Why not ``es``, ``id``, row index: with a shared ``es`` and ``id`` (one batch, one second) the row
index decides before the position, so row 1 of an UPDATE sorts after row 0 of a later DELETE of
the same row and the row comes back. Why not the row index alone: the same across all messages
(in every corpus file 102 and 103 come back: 102 is row 1 of the multi-row UPDATE and row 0 of
the later DELETE). Position then index keeps every corpus file's final state.
"""

import json
import re

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_platform.formats import canonical as C
from cdc_platform.formats import json_records as J
from cdc_platform.formats.column_specs import ColumnSpec
from cdc_platform.formats.contract import Options

NAME = "canal"
OPTIONS: Options = {"canal.convention": ("current", "legacy")}

_OPS = {"INSERT": C.INSERT, "INIT": C.READ, "UPDATE": C.UPDATE, "DELETE": C.DELETE}
# Canal event types that change a table's definition (DTS writes "DDL"); TRUNCATE is a change.
_DDL_TYPES = ("DDL", "CREATE", "ALTER", "ERASE", "RENAME", "CINDEX", "DINDEX", "QUERY")
_CONTROL_TYPES = ("GTID", "XACOMMIT", "XAROLLBACK", "MHEARTBEAT", "HEARTBEAT", "BEGIN", "COMMIT")
_ROWS = "array<map<string,string>>"
_BINARY_TYPE = r"^\s*((tiny|medium|long)?blob|(var)?binary)\b"
# Where the images sit, for a new table's column order (formats.contract.Format.IMAGE_PATHS).
IMAGE_PATHS = (("data", 0), ("old", 0), ("mysqlType",))
TOKEN_PATHS = ()  # values are text (mysqlType types them)
CLAIM_PATHS: dict[str, str] = {}  # the claim reads top-level keys only
_TEMP = (J.VARIANT, "_mysql_type", "_type", "_object", "_new", "_prev", "_sql",
         "_is_ddl", "_table", "_kind", "_reason", "_truncate", "_database", "_pk", "_ms", "_gtid",
         "_rows", "_pos", "_row")  # fmt: skip


def _binary_columns() -> Column:
    """The columns ``mysqlType`` declares binary (blob, binary, varbinary); null when its text
    names no such type, so most messages skip building the map."""
    types = J.field("$.mysqlType", "map<string,string>")
    binary = F.map_keys(F.map_filter(types, lambda _, t: F.lower(t).rlike(_BINARY_TYPE)))
    return F.when(F.lower(J.field("$.mysqlType")).rlike("blob|binary"), binary)


def _latin1_to_base64(rows: Column, binary: Column) -> Column:
    """Canal writes binary values as ISO-8859-1 text (one character per byte): re-encode them as
    base64, which ``column_specs`` decodes to the exact bytes. Text that is not ISO-8859-1 cannot
    be such a value; it is left as is and fails to decode (a type mismatch, quarantined)."""

    def row(r: Column) -> Column:
        return F.transform_values(
            r,
            lambda k, v: F.when(
                F.array_contains(binary, k) & v.rlike(r"^[\x00-\xff]*$"),
                F.base64(F.encode(v, "ISO-8859-1")),
            ).otherwise(v),
        )

    return F.when(F.coalesce(F.size(binary), F.lit(0)) > 0, F.transform(rows, row)).otherwise(rows)


def parse(raw: DataFrame, options: dict[str, str]) -> DataFrame:
    """Raw messages -> parsed records (``canonical.PARSED_SCHEMA``); never raises on bad input."""
    legacy = options.get("canal.convention", "current") == "legacy"
    df = J.read_exact(raw)  # exact numbers
    get = J.field
    binary = _binary_columns()
    data = _latin1_to_base64(get("$.data", _ROWS), binary)
    old = _latin1_to_base64(get("$.old", _ROWS), binary)
    df = df.select(
        "*",
        F.upper(F.trim(get("$.type"))).alias("_type"),
        get("$.mysqlType").alias("_mysql_type"),  # its JSON text
        J.is_object().alias("_object"),
        # Where the convention puts the new values and the previous ones.
        (old if legacy else data).alias("_new"),
        (data if legacy else old).alias("_prev"),
        get("$.sql").alias("_sql"),
        F.coalesce(get("$.isDdl", "boolean"), F.lit(False)).alias("_is_ddl"),
        F.nullif(get("$.table"), F.lit("")).alias("_table"),
    )
    new_name = "old" if legacy else "data"
    typ, table, is_ddl = F.col("_type"), F.col("_table"), F.col("_is_ddl")
    new, prev = F.col("_new"), F.col("_prev")
    truncate = (typ == "TRUNCATE") | (
        is_ddl & F.coalesce(F.col("_sql").rlike(r"(?i)^\s*truncate\s"), F.lit(False))
    )
    dml = ~is_ddl & typ.isin(*_OPS)
    # An update explodes its new rows; INSERT/INIT/DELETE carry one image each: where the
    # convention puts it, else in the other array (a DTS legacy DELETE's row is in `old`).
    rows = F.when(typ == "UPDATE", new).otherwise(F.coalesce(new, prev))
    given = get("$.data").isNotNull() | get("$.old").isNotNull()  # JSON null: not given
    reason = (
        F.when(~F.col("_object"), F.lit(J.NOT_AN_OBJECT))
        .when(truncate & table.isNull(), F.lit("TRUNCATE without a table"))
        .when(truncate | is_ddl | typ.isin(*_DDL_TYPES, *_CONTROL_TYPES), F.lit(None))
        .when(typ.isNull(), F.lit("not a Canal message: no 'type' field"))
        .when(~dml, F.concat(F.lit("unknown Canal type '"), get("$.type"), F.lit("'")))
        .when(table.isNull(), F.lit("no table: table unknown"))
        .when(
            rows.isNull() & (typ == "UPDATE"),
            F.lit(f"UPDATE without new values in '{new_name}'"),
        )
        .when(rows.isNull() & given, F.lit("'data'/'old' are not arrays of JSON objects"))
        .when(rows.isNull(), F.concat(typ, F.lit(" without rows in 'data' or 'old'")))
    )
    kind = (
        F.when(F.col("value").isNull(), F.lit(C.KIND_CONTROL))
        .when(reason.isNotNull(), F.lit(C.KIND_ERROR))
        .when(truncate | dml, F.lit(C.KIND_CHANGE))
        .when(typ.isin(*_CONTROL_TYPES) & ~is_ddl, F.lit(C.KIND_CONTROL))
        .otherwise(F.lit(C.KIND_DDL))
    )
    df = df.select(
        "*",
        kind.alias("_kind"),
        reason.alias("_reason"),
        truncate.alias("_truncate"),
        get("$.database").alias("_database"),
        get("$.pkNames", "array<string>").alias("_pk"),
        F.coalesce(
            F.when(get("$.es", "bigint") > 0, get("$.es", "bigint")), get("$.ts", "bigint")
        ).alias("_ms"),
        F.nullif(get("$.gtid"), F.lit("")).alias("_gtid"),
        # One output row per row of a DML message; exactly one for any other message.
        F.when((kind == C.KIND_CHANGE) & ~truncate, rows).alias("_rows"),
    )
    df = df.select("*", F.posexplode_outer("_rows").alias("_pos", "_row"))
    return _records(df, legacy)


def _records(df: DataFrame, legacy: bool) -> DataFrame:
    """Exploded messages -> one parsed record per row (per message for all but DML)."""
    typ, row, pos = F.col("_type"), F.col("_row"), F.col("_pos")
    prev = F.when(typ == "UPDATE", F.get(F.col("_prev"), F.coalesce(pos, F.lit(0))))
    is_row = (F.col("_kind") == C.KIND_CHANGE) & ~F.col("_truncate")
    reason = F.when(F.col("_kind") == C.KIND_ERROR, F.col("_reason")).when(
        is_row & row.isNull(),
        F.when(
            pos.isNull(), F.concat(typ, F.lit(" without rows: the row array is empty"))
        ).otherwise(F.concat(F.lit("row "), pos.cast("string"), F.lit(" of the message is null"))),
    )
    # A row-level problem turns the record into an error (materialized: used many times below).
    df = df.withColumn("_reason", reason).withColumn(
        "_kind",
        F.when(F.col("_reason").isNotNull(), F.lit(C.KIND_ERROR)).otherwise(F.col("_kind")),
    )
    kind, reason = F.col("_kind"), F.col("_reason")
    change = kind == C.KIND_CHANGE
    op = F.when(F.col("_truncate"), F.lit(C.TRUNCATE))
    for name, code in _OPS.items():
        op = op.when(typ == name, F.lit(code))
    # The new row of an update is complete in the current convention; in the legacy one `old`
    # may list only the changed columns, so the previous row fills the others.
    after_update = J.overlay(prev, row) if legacy else row
    before = F.when(typ == "DELETE", row).when(typ == "UPDATE", J.overlay(row, prev))
    after = F.when(typ.isin("INSERT", "INIT"), row).when(typ == "UPDATE", after_update)
    row_index = F.lpad(F.coalesce(pos, F.lit(0)).cast("string"), 10, "0")
    return df.select(
        *[c for c in df.columns if c not in _TEMP],
        kind.alias("kind"),
        F.when(kind == C.KIND_ERROR, reason)
        .when(F.col("value").isNull(), F.lit("kafka tombstone"))
        .when(kind == C.KIND_CONTROL, F.concat(F.lit("canal "), typ))
        .alias("reason"),
        F.when(change, op).alias("op"),
        F.col("_database").alias("database"),
        F.lit(None).cast("string").alias("schema"),
        F.col("_table").alias("table"),
        F.col("_pk").alias("key_columns"),
        F.when(change & ~F.col("_truncate"), before).cast(C.IMAGE).alias("before_image"),
        F.when(change & ~F.col("_truncate"), after).cast(C.IMAGE).alias("after_image"),
        F.lit(False).alias("after_partial"),
        F.when(change, F.col("_mysql_type")).alias("value_schema"),
        F.lit("json").alias("image_encoding"),
        F.concat(F.lit("pos:"), C.raw_position(), F.lit(":"), row_index).alias("source_sequence"),
        F.timestamp_millis(F.col("_ms")).alias("event_time"),
        F.col("_gtid").alias("tx_id"),
        F.when((kind == C.KIND_DDL) | (change & F.col("_truncate")), F.col("_sql")).alias("ddl"),
        F.lit(NAME).alias("source_format"),
    )


_TYPE_NAME = re.compile(r"^\s*([a-z]+)")
_PARAMS = re.compile(r"\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)")
_SIGNED = {"tinyint": "tinyint", "smallint": "smallint", "mediumint": "int", "int": "int",
           "integer": "int", "bigint": "bigint"}  # fmt: skip
_UNSIGNED = {"tinyint": "smallint", "smallint": "int", "mediumint": "int", "int": "bigint",
             "integer": "bigint", "bigint": "decimal(20,0)"}  # fmt: skip
_SIMPLE = {
    "float": "float", "double": "double", "real": "double",
    "date": "date", "datetime": "timestamp", "timestamp": "timestamp", "year": "int",
    "blob": "binary", "tinyblob": "binary", "mediumblob": "binary", "longblob": "binary",
    "binary": "binary", "varbinary": "binary",
}  # fmt: skip


def mysql_type(text: str) -> str:
    """A MySQL column type as Canal writes it (``int(11)``, ``bigint unsigned``, ``VARCHAR(255)``,
    ``decimal(10,2)``) -> Spark SQL type. Unsigned integers widen to the next type that holds them;
    character, enum, set, json, time and bit types (and anything unknown) stay strings."""
    t = text.strip().lower()
    m = _TYPE_NAME.match(t)
    if not m:
        return "string"
    name = m.group(1)
    unsigned = re.search(r"\bunsigned\b", t) is not None
    if name in _SIGNED:
        return (_UNSIGNED if unsigned else _SIGNED)[name]
    if name in ("decimal", "numeric", "dec", "fixed"):
        p = _PARAMS.search(t)
        # DTS drops the precision ("decimal"): keep the exact text rather than guess a scale.
        if not p or int(p.group(1)) > 38:
            return "string"
        precision, scale = int(p.group(1)), int(p.group(2) or 0)
        return f"decimal({max(precision, scale, 1)},{scale})"
    return _SIMPLE.get(name, "string")


def column_specs(value_schema: str) -> dict[str, ColumnSpec]:
    """Column types from ``mysqlType`` (its JSON text: column -> MySQL type name). Binary values
    reach the image as base64 (``parse`` re-encodes Canal's ISO-8859-1 text)."""
    specs = {}
    for col, t in json.loads(value_schema).items():
        sql_type = mysql_type(t) if isinstance(t, str) else "string"
        specs[col] = ColumnSpec(sql_type, "base64" if sql_type == "binary" else "cast")
    return specs


def claims(keys: Column, value: Column, probe: Column) -> Column:
    """A Canal flat message (a DML message, or a DDL message such as DTS's, without ``data``)."""

    has = J.key_test(keys)
    dml = has("data") & has("type") & (has("pkNames") | has("isDdl") | has("mysqlType"))
    return dml | (has("isDdl") & has("sql") & has("type"))
