"""DataHub Tuple records written by DataWorks real-time sync, landed as JSON objects of fields.

A record is one row image: the meta columns ``_sequence_id_`` (digits, shared by the two halves
of an update), ``_operation_type_`` (``I``/``U``/``D``), ``_excute_time_`` (sic: when the change
happened; 13-digit epoch milliseconds in the documentation's example), ``_source_table_``,
``_before_image_`` and ``_after_image_`` (``Y``/``N``), then the table's own columns, which form
the image. ``I`` -> ``c`` (an after image), ``D`` -> ``d`` (a before image); an update is two ``U``
records, the before image (``_before_image_ = Y``) and the after image (``_after_image_ = Y``),
paired over the batch on (table, ``_sequence_id_``) exactly as DataWorks' two-message updates
(``dataworks.pair_halves``): the consumed before half becomes a control record, a before half whose
after half is not in the batch is quarantined, an after half alone applies with no before image.

Tuple topics carry no DDL, heartbeats, column types or key names: types and the primary key come
from configuration (a table without a primary key is keyed by DataWorks' synthetic
``#alibaba_rds_row_id#`` when its records carry it). A Tuple topic holds one table, so a record
without ``_source_table_`` belongs to its topic's name. ``_source_table_`` may be qualified:
``db.table`` or ``db.schema.table``. Ordering is ``_sequence_id_``, on the DataWorks scale
(``dataworks.sequence_of``). ``_excute_time_`` values of 10^14 and more are microseconds (DataHub
TIMESTAMP fields), smaller ones milliseconds; text is read as an ISO timestamp.
"""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_platform.formats import canonical as C
from cdc_platform.formats import json_records as J
from cdc_platform.formats.column_specs import ColumnSpec
from cdc_platform.formats.contract import Options
from cdc_platform.formats.dataworks import (
    FULL_LOAD_SEQUENCE,
    pair_halves,
    row_id_key,
    sequence_of,
)

NAME = "datahub-tuple"
OPTIONS: Options = {}
IMAGE_PATHS = ()  # the parsed images keep the wire column order
TOKEN_PATHS = ()  # typed by the table schema
CLAIM_PATHS: dict[str, str] = {}  # the claim reads top-level keys only

SEQUENCE_ID = "_sequence_id_"
OPERATION = "_operation_type_"
EXECUTE_TIME = "_excute_time_"  # sic
SOURCE_TABLE = "_source_table_"
BEFORE_IMAGE = "_before_image_"
AFTER_IMAGE = "_after_image_"
META_COLUMNS = (SEQUENCE_ID, OPERATION, EXECUTE_TIME, SOURCE_TABLE, BEFORE_IMAGE, AFTER_IMAGE)
_OPS = {"I": C.INSERT, "U": C.UPDATE, "D": C.DELETE}
_MICROS_FROM = 10**14  # epoch ms reach 10^14 in the year 5138; epoch µs passed it in 1973


def _event_time(value: Column) -> Column:
    n = value.try_cast("bigint")
    return (
        F.when(n >= _MICROS_FROM, F.timestamp_micros(n))
        .when(n > 0, F.timestamp_millis(n))
        .when(n.isNull(), F.try_to_timestamp(value))
    )


def _image(record: Column) -> Column:
    """The table's own columns of a record: the row image."""
    return F.map_filter(record, lambda k, _: ~k.isin(*META_COLUMNS))


def _table_parts(qualified: Column, fallback: Column) -> tuple[Column, Column, Column]:
    """(database, schema, table) of ``db.table``, ``db.schema.table`` or ``table``."""
    name = F.when(F.trim(qualified) != "", F.trim(qualified))
    parts = F.split(name, r"\.")
    n = F.size(parts)
    database = F.when(n >= 2, parts[0])
    schema = F.when(n >= 3, F.array_join(F.slice(parts, 2, n - 2), "."))
    table = F.coalesce(F.element_at(parts, -1), fallback)
    return database, schema, table


def parse(raw: DataFrame, options: dict[str, str]) -> DataFrame:
    """Raw messages -> parsed records (``canonical.PARSED_SCHEMA``); never raises on bad input."""
    rec = F.col("_rec")
    df = raw.withColumn("_rec", F.from_json(J.text(), C.IMAGE))
    op = rec[OPERATION]
    seq_id = rec[SEQUENCE_ID]
    before_flag = F.coalesce(rec[BEFORE_IMAGE] == "Y", F.lit(False))
    after_flag = F.coalesce(rec[AFTER_IMAGE] == "Y", F.lit(False))
    database, schema, table = _table_parts(rec[SOURCE_TABLE], F.col("topic"))
    df = df.withColumn("_seq", sequence_of(seq_id))

    is_update = op == "U"
    before_half = F.coalesce(is_update & before_flag & ~after_flag, F.lit(False))
    after_half = F.coalesce(is_update & after_flag, F.lit(False))
    usable = (F.col("_seq") != FULL_LOAD_SEQUENCE) & table.isNotNull()  # not full-load ids
    df = pair_halves(
        df,
        before_half & usable,
        after_half & usable,
        [database, schema, table, F.col("_seq")],
        "_rec",
    )
    # Staged after the pairing (the shuffle carries the record once): read three times below.
    df = df.withColumn("_image", _image(rec))
    image = F.col("_image")

    seq_text = F.coalesce(seq_id, F.lit("null"))
    reason = (
        F.when(rec.isNull(), F.lit("invalid JSON: not a JSON object"))
        .when(op.isNull(), F.lit(f"not a DataHub Tuple record: no {OPERATION}"))
        .when(
            ~op.isin(*_OPS),
            F.concat(F.lit(f"unknown DataHub Tuple {OPERATION} '"), op, F.lit("'")),
        )
        .when(table.isNull(), F.lit(f"no {SOURCE_TABLE} and no topic: the table is unknown"))
        .when(
            F.col("_seq").isNull(),
            F.concat(
                F.lit(f"{SEQUENCE_ID} '"), seq_text,
                F.lit("' is not an integer of at most 20 digits: the change cannot be ordered"),
            ),
        )
        .when(
            (op == "I") & ~after_flag,
            F.lit(f"insert record without an after image ({AFTER_IMAGE} is not Y)"),
        )
        .when(
            (op == "D") & ~before_flag,
            F.lit(f"delete record without a before image ({BEFORE_IMAGE} is not Y)"),
        )
        .when(
            is_update & ~before_half & ~after_half,
            F.lit(f"update record that is neither a before nor an after image ({BEFORE_IMAGE},"
                  f" {AFTER_IMAGE})"),
        )
        .when(
            before_half & ~F.col("_pair_after"),
            F.concat(
                F.lit(f"unpaired update: the before image ({SEQUENCE_ID} "), seq_text,
                F.lit(") without its after image in this batch; a before image alone cannot be"
                      " applied"),
            ),
        )
    )  # fmt: skip
    # Staged columns: referenced several times below, computed once (not inlined per use).
    df = df.withColumn("_error", F.when(F.col("value").isNotNull(), reason))
    is_error = F.col("_error").isNotNull()
    control = F.col("value").isNull() | (~is_error & before_half)
    control_reason = F.when(F.col("value").isNull(), F.lit("kafka tombstone")).otherwise(
        F.concat(
            F.lit(f"update before image paired with its after image ({SEQUENCE_ID} "),
            seq_text,
            F.lit("): the update record carries it"),
        )
    )
    df = df.withColumn(
        "_kind",
        F.when(control, F.lit(C.KIND_CONTROL))
        .when(is_error, F.lit(C.KIND_ERROR))
        .otherwise(F.lit(C.KIND_CHANGE)),
    )
    kind = F.col("_kind")
    ops = F.create_map(*[F.lit(x) for kv in _OPS.items() for x in kv])
    return df.select(
        *raw.columns,
        kind.alias("kind"),
        F.when(kind == C.KIND_ERROR, F.col("_error"))
        .when(kind == C.KIND_CONTROL, control_reason)
        .alias("reason"),
        F.when(kind == C.KIND_CHANGE, ops[op]).alias("op"),
        database.alias("database"),
        schema.alias("schema"),
        table.alias("table"),
        row_id_key(image, ("#alibaba_rds_row_id#",)).alias("key_columns"),
        F.when(op == "D", image)
        .when(after_half, _image(F.col("_pair_record")))
        .alias("before_image"),
        F.when((op == "I") | after_half, image).alias("after_image"),
        F.lit(False).alias("after_partial"),
        F.lit(None).cast(T.StringType()).alias("value_schema"),
        F.lit("json").alias("image_encoding"),
        F.col("_seq").alias("source_sequence"),
        _event_time(rec[EXECUTE_TIME]).alias("event_time"),
        F.lit(None).cast(T.StringType()).alias("tx_id"),
        F.lit(None).cast(T.StringType()).alias("ddl"),
        F.lit(NAME).alias("source_format"),
    )


def column_specs(value_schema: str) -> dict[str, ColumnSpec]:
    """Tuple records carry no column types: they come from configuration."""
    return {}


def claims(keys: Column, value: Column, probe: Column) -> Column:
    """A JSON object with the DataHub Tuple meta columns."""
    has = J.key_test(keys)
    return has(OPERATION) & has(SEQUENCE_ID)
