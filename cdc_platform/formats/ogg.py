"""Oracle GoldenGate JSON (the Kafka handler's JSON formatter): one row change per message.

``op_type`` is I, U, D or T (truncate); ``before``/``after`` are full row images (an update
carries both when the trail has before images; a delete only ``before``). ``table`` is
``SCHEMA.TABLE`` (``CATALOG.SCHEMA.TABLE`` for a pluggable database), ``primary_keys`` names the
key, ``op_ts`` (``yyyy-MM-dd HH:mm:ss.ffffff``) is when the operation ran at the source,
``current_ts`` when GoldenGate wrote it. Anything else (``tokens``, a stray Debezium-style
``source`` object) is ignored. Messages carry no column types.

Order: ``pos`` is the trail position (sequence number and RBA, zero-padded), which is commit order;
``op_ts`` is not (in the corpus ``pos ...157`` has an earlier ``op_ts`` than ``...156``). So
``source_sequence`` is ``pos``; a message without one falls back to the raw position alone.
"""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_platform.formats import canonical as C
from cdc_platform.formats import json_records as J
from cdc_platform.formats.column_specs import ColumnSpec
from cdc_platform.formats.contract import Options

NAME = "ogg"
OPTIONS: Options = {}

_OPS = {"I": C.INSERT, "U": C.UPDATE, "D": C.DELETE, "T": C.TRUNCATE}
_IMAGE = "map<string,string>"
# Where the images sit, for a new table's column order (formats.contract.Format.IMAGE_PATHS).
IMAGE_PATHS = (("after",), ("before",))
TOKEN_PATHS = ("$.after", "$.before")
CLAIM_PATHS: dict[str, str] = {}  # the claim reads top-level keys only
_OP_TS = "yyyy-MM-dd HH:mm:ss.SSSSSS"


def _timestamp(text: Column) -> Column:
    """GoldenGate's ``2020-05-13 15:40:06.000000`` (or ISO ``2020-05-13T13:39:35.766000``)."""
    return F.coalesce(F.try_to_timestamp(text, F.lit(_OP_TS)), F.try_to_timestamp(text))


def parse(raw: DataFrame, options: dict[str, str]) -> DataFrame:
    """Raw messages -> parsed records (``canonical.PARSED_SCHEMA``); never raises on bad input."""
    df = J.read_exact(raw)  # exact numbers
    get = J.field
    df = df.select(
        *raw.columns,
        J.VARIANT,
        J.is_object().alias("_object"),
        F.upper(F.trim(get("$.op_type"))).alias("_op_type"),
        get("$.before", _IMAGE).alias("_before"),
        get("$.after", _IMAGE).alias("_after"),
        F.split(get("$.table"), r"\.").alias("_parts"),
        get("$.pos").alias("_pos"),
    )
    op_type, before, after = F.col("_op_type"), F.col("_before"), F.col("_after")
    parts = F.col("_parts")
    n = F.size(parts)
    table = F.when(n >= 1, F.nullif(F.get(parts, n - 1), F.lit("")))
    op = F.lit(None).cast("string")
    for code, canonical in _OPS.items():
        op = F.when(op_type == code, F.lit(canonical)).otherwise(op)
    reason = (
        F.when(~F.col("_object"), F.lit(J.NOT_AN_OBJECT))
        .when(op_type.isNull(), F.lit("not a GoldenGate message: no 'op_type' field"))
        .when(op.isNull(), F.concat(F.lit("unknown GoldenGate op_type '"), op_type, F.lit("'")))
        .when(table.isNull(), F.lit("no table: table unknown"))
        .when(
            op.isin(C.INSERT, C.UPDATE) & after.isNull(),
            F.concat(F.lit("op_type "), op_type, F.lit(" without an after image")),
        )
        .when(
            (op == C.DELETE) & before.isNull(),
            F.lit("delete without a before image: the row cannot be identified"),
        )
    )
    kind = (
        F.when(F.col("value").isNull(), F.lit(C.KIND_CONTROL))
        .when(reason.isNotNull(), F.lit(C.KIND_ERROR))
        .otherwise(F.lit(C.KIND_CHANGE))
    )
    change = kind == C.KIND_CHANGE
    pos = F.col("_pos")
    return df.select(
        *raw.columns,
        kind.alias("kind"),
        F.when(kind == C.KIND_ERROR, reason)
        .when(F.col("value").isNull(), F.lit("kafka tombstone"))
        .alias("reason"),
        F.when(change, op).alias("op"),
        F.when(n >= 3, F.array_join(F.slice(parts, 1, n - 2), ".")).alias("database"),
        F.when(n >= 2, F.get(parts, n - 2)).alias("schema"),
        table.alias("table"),
        get("$.primary_keys", "array<string>").alias("key_columns"),
        F.when(change & op.isin(C.UPDATE, C.DELETE), before).cast(C.IMAGE).alias("before_image"),
        F.when(change & op.isin(C.INSERT, C.UPDATE, C.READ), after)
        .cast(C.IMAGE)
        .alias("after_image"),
        F.lit(False).alias("after_partial"),
        F.lit(None).cast("string").alias("value_schema"),
        F.lit("json").alias("image_encoding"),
        F.when(pos.rlike(r"^\d{1,32}$"), F.concat(F.lit("pos:"), F.lpad(pos, 32, "0")))
        .when(pos.isNotNull() & (pos != ""), F.concat(F.lit("pos:"), pos))
        .alias("source_sequence"),
        F.coalesce(_timestamp(get("$.op_ts")), _timestamp(get("$.current_ts"))).alias("event_time"),
        F.coalesce(get("$.xid"), get("$.csn")).alias("tx_id"),
        F.lit(None).cast("string").alias("ddl"),
        F.lit(NAME).alias("source_format"),
    )


def column_specs(value_schema: str) -> dict[str, ColumnSpec]:
    """GoldenGate JSON carries no column types: configure ``column_types`` (else strings)."""
    return {}


def claims(keys: Column, value: Column, probe: Column) -> Column:
    """A GoldenGate operation: ``op_type`` and ``table`` with an image (or a trail ``pos``)."""

    has = J.key_test(keys)
    return has("op_type") & has("table") & (has("after") | has("before") | has("pos"))
