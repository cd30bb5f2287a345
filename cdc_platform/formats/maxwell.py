"""Maxwell JSON (zendesk/maxwell): one row change per message.

``data`` is the full new row (for a delete: the deleted row), ``old`` the previous values of the
changed columns only, so the before image of an update is ``data`` overlaid with ``old`` and the
after image is always full. ``type`` is insert, update, delete, bootstrap-insert (a snapshot read,
``r``), bootstrap-start/-complete (control), or a DDL type (``table-create``, ``database-alter``,
...: counted, never applied; a TRUNCATE statement truncates its table). ``ts`` is in seconds.
``xid`` is the transaction; ``xoffset`` the row's place in it, absent on the last row, which has
``commit: true``. ``primary_key_columns`` names the key. Messages carry no column types.

Order: with ``output_binlog_position`` Maxwell writes ``position`` (``binlog.000003:1234``), the
binlog (commit) order: ``source_sequence`` is then that position and the row's ``xoffset``.
Without it the order is the topic position, which Maxwell writes in binlog order. ``xid`` is not
an order: it is the server's id of the transaction (taken when it starts, not when it commits, so
two transactions on one row can commit in the other order) and it restarts with mysqld and
differs between servers; ``ts`` has whole seconds. In the corpus both agree with file order.
"""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_platform.formats import canonical as C
from cdc_platform.formats import json_records as J
from cdc_platform.formats.column_specs import ColumnSpec
from cdc_platform.formats.contract import Options

NAME = "maxwell"
OPTIONS: Options = {}

_OPS = {"insert": C.INSERT, "update": C.UPDATE, "delete": C.DELETE, "bootstrap-insert": C.READ}
_CONTROL_TYPES = ("bootstrap-start", "bootstrap-complete")
_DDL = r"^(database|table|view)-(create|alter|drop|rename)$"
_IMAGE = "map<string,string>"
# Where the images sit, for a new table's column order (formats.contract.Format.IMAGE_PATHS).
IMAGE_PATHS = (("data",), ("old",))
TOKEN_PATHS = ("$.data", "$.old")
CLAIM_PATHS: dict[str, str] = {}  # the claim reads top-level keys only
# The last row of a transaction has commit=true and no xoffset: it sorts after the others.
_LAST = "9999999999"


def _binlog_position(position: Column) -> Column:
    """``mysql-bin.000003:1234`` -> fixed-width ``file number.offset`` (null if not that form)."""
    m = r"^.*?(\d+):(\d+)$"
    return F.when(
        position.rlike(m),
        F.concat(
            F.lpad(F.regexp_extract(position, m, 1), 10, "0"),
            F.lit("."),
            F.lpad(F.regexp_extract(position, m, 2), 20, "0"),
        ),
    )


def parse(raw: DataFrame, options: dict[str, str]) -> DataFrame:
    """Raw messages -> parsed records (``canonical.PARSED_SCHEMA``); never raises on bad input."""
    df = J.read_exact(raw)  # exact numbers
    get = J.field
    df = df.select(
        "*",
        J.is_object().alias("_object"),
        F.lower(F.trim(get("$.type"))).alias("_type"),
        get("$.data", _IMAGE).alias("_data"),
        get("$.old", _IMAGE).alias("_old"),
        F.nullif(get("$.table"), F.lit("")).alias("_table"),
        get("$.sql").alias("_sql"),
        get("$.xoffset", "bigint").alias("_xoffset"),
        F.coalesce(get("$.commit", "boolean"), F.lit(False)).alias("_commit"),
        get("$.position").alias("_position"),
    )
    typ, data, table = F.col("_type"), F.col("_data"), F.col("_table")
    is_ddl = typ.rlike(_DDL)
    truncate = is_ddl & F.coalesce(F.col("_sql").rlike(r"(?i)^\s*truncate\s"), F.lit(False))
    dml = typ.isin(*_OPS)
    op = F.when(truncate, F.lit(C.TRUNCATE))
    for name, code in _OPS.items():
        op = op.when(typ == name, F.lit(code))
    reason = (
        F.when(~F.col("_object"), F.lit(J.NOT_AN_OBJECT))
        .when(truncate & table.isNull(), F.lit("TRUNCATE without a table"))
        .when(is_ddl | typ.isin(*_CONTROL_TYPES), F.lit(None))
        .when(typ.isNull(), F.lit("not a Maxwell message: no 'type' field"))
        .when(~dml, F.concat(F.lit("unknown Maxwell type '"), get("$.type"), F.lit("'")))
        .when(table.isNull(), F.lit("no table: table unknown"))
        .when(
            data.isNull(),
            F.concat(F.lit("Maxwell "), typ, F.lit(" without a 'data' object: no row image")),
        )
    )
    kind = (
        F.when(F.col("value").isNull(), F.lit(C.KIND_CONTROL))
        .when(reason.isNotNull(), F.lit(C.KIND_ERROR))
        .when(truncate | dml, F.lit(C.KIND_CHANGE))
        .when(typ.isin(*_CONTROL_TYPES), F.lit(C.KIND_CONTROL))
        .otherwise(F.lit(C.KIND_DDL))
    )
    row = dml & (kind == C.KIND_CHANGE)
    before = F.when(typ == "delete", data).when(typ == "update", J.overlay(data, F.col("_old")))
    after = F.when(typ != "delete", data)
    xoffset = F.coalesce(
        F.col("_xoffset").cast("string"), F.when(F.col("_commit"), F.lit(_LAST)), F.lit("0")
    )
    binlog = _binlog_position(F.col("_position"))
    order = F.coalesce(
        F.concat(F.lit("binlog:"), binlog), F.concat(F.lit("pos:"), C.raw_position())
    )
    seconds = get("$.ts", "bigint")
    return df.select(
        *raw.columns,
        kind.alias("kind"),
        F.when(kind == C.KIND_ERROR, reason)
        .when(F.col("value").isNull(), F.lit("kafka tombstone"))
        .when(kind == C.KIND_CONTROL, F.concat(F.lit("maxwell "), typ))
        .alias("reason"),
        F.when(kind == C.KIND_CHANGE, op).alias("op"),
        get("$.database").alias("database"),
        F.lit(None).cast("string").alias("schema"),
        table.alias("table"),
        get("$.primary_key_columns", "array<string>").alias("key_columns"),
        F.when(row, before).cast(C.IMAGE).alias("before_image"),
        F.when(row, after).cast(C.IMAGE).alias("after_image"),
        F.lit(False).alias("after_partial"),
        F.lit(None).cast("string").alias("value_schema"),
        F.lit("json").alias("image_encoding"),
        F.concat(order, F.lit(":"), F.lpad(xoffset, 10, "0")).alias("source_sequence"),
        F.timestamp_seconds(seconds).alias("event_time"),
        get("$.xid").alias("tx_id"),
        F.when((kind == C.KIND_DDL) | truncate, F.col("_sql")).alias("ddl"),
        F.lit(NAME).alias("source_format"),
    )


def column_specs(value_schema: str) -> dict[str, ColumnSpec]:
    """Maxwell messages carry no column types: configure ``column_types`` (else strings)."""
    return {}


def claims(keys: Column, value: Column, probe: Column) -> Column:
    """A Maxwell row message (or a Maxwell DDL message: ``type``, ``sql`` and ``def``)."""

    has = J.key_test(keys)
    row = (
        has("database")
        & has("table")
        & has("type")
        & has("data")
        & (has("ts") | has("xid"))
        # Canal's keys (Canal also has database, table, type, data and ts)
        & ~has("pkNames")
        & ~has("isDdl")
        & ~has("mysqlType")
    )
    return row | (has("type") & has("sql") & has("def"))
