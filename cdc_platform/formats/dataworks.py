"""DataWorks real-time sync JSON: Kafka topics, and DataHub Blob topics (the same JSON).

One message is ``{"schema": {"dataColumn": [{name, type}], "primaryKey": [...], "source": {dbType,
dbName, schemaName, tableName}}, "payload": {"before"|"after": {"dataColumn": {col: value}},
"sequenceId", "scn", "op", "timestamp": {eventTime, systemTime, checkpointTime}, "ddl": {text,
ddlMeta}}, "version"}``. ``op`` is case-sensitive:

- ``INSERT`` -> ``c``, ``DELETE`` -> ``d``, ``TRUNCATE`` -> ``t``, ``UPDATE_AFTER`` -> ``u``;
- an update is either one ``UPDATE_AFTER`` carrying both images, or two messages, ``UPDATE_BEFOR``
  (sic; ``UPDATE_BEFORE`` is accepted too) then ``UPDATE_AFTER``, sharing their ``sequenceId``.
  The halves are paired over the batch with a window on (table, sequenceId): the update record
  takes its before image from the ``UPDATE_BEFOR`` and everything else from the ``UPDATE_AFTER``;
  the consumed ``UPDATE_BEFOR`` becomes a control record. An ``UPDATE_BEFOR`` whose partner is not
  in the batch is quarantined (the ``UPDATE_AFTER`` alone, in a later batch, still applies: its
  after image is the full row);
- ``MHEARTBEAT``, ``TRANSACTION_BEGIN``/``END``, ``GTID``, ``XACOMMIT``, ``XAROLLBACK``: control;
- ``CREATE``, ``ALTER``, ``ERASE``, ``QUERY``, ``RENAME``, ``CINDEX``, ``DINDEX``: DDL, with
  ``ddl.text``.

Ordering: ``sequenceId`` is DataWorks' own order for merging full-load and incremental data
("用于增全量数据合并的数据排序"), a decimal string. Full-load messages carry ``-1``; they sort
before every incremental change (``0:`` + zeros, versus ``1:`` + the id zero-padded to 20 digits),
so a snapshot row never overrides a change captured after it, and full-load rows among themselves
keep their raw order. A row change without an integer ``sequenceId`` cannot be ordered and is
quarantined. Oracle's ``scn`` is kept as ``tx_id``, not in the sequence: it is absent from full-load
rows and non-Oracle sources, whereas ``sequenceId`` orders all of them on one scale.

Event time: ``timestamp.eventTime``, or ``systemTime`` when eventTime is ``-1`` (full load) or
absent. Key: ``schema.primaryKey``; tables without one are keyed by the synthetic
``#alibaba_rds_row_id#`` column, else Oracle's ``rowid``. Column types come from
``schema.dataColumn`` (``column_specs``); ``DATE`` is a 13-digit epoch-millisecond value, typed as
``timestamp`` (exact: Spark timestamps hold microseconds).
"""

import json

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_platform.formats import canonical as C
from cdc_platform.formats import json_records as J
from cdc_platform.formats.column_specs import STRING, ColumnSpec
from cdc_platform.formats.contract import Options

NAME = "dataworks"
OPTIONS: Options = {}
IMAGE_PATHS = ()  # the parsed images keep the wire column order
TOKEN_PATHS = ()  # typed by dataColumn
CLAIM_PATHS = {
    "$.payload.sequenceId": J.PRESENT,
    "$.schema.dataColumn": J.PRESENT,
    "$.payload.op": J.TEXT,
}

_S = T.StringType()
_IMAGE = T.StructType([T.StructField("dataColumn", C.IMAGE)])
_PAYLOAD = T.StructType(
    [
        T.StructField("before", _IMAGE),
        T.StructField("after", _IMAGE),
        T.StructField("sequenceId", _S),
        T.StructField("scn", _S),
        T.StructField("op", _S),
        T.StructField(
            "timestamp",
            T.StructType(
                [T.StructField(n, _S) for n in ("eventTime", "systemTime", "checkpointTime")]
            ),
        ),
        T.StructField("ddl", T.StructType([T.StructField("text", _S)])),
    ]
)
_SCHEMA = T.StructType(
    [
        T.StructField("dataColumn", _S),  # kept as JSON text: the value_schema
        T.StructField("primaryKey", T.ArrayType(_S)),
        T.StructField(
            "source",
            T.StructType(
                [T.StructField(n, _S) for n in ("dbType", "dbName", "schemaName", "tableName")]
            ),
        ),
    ]
)
_TOP = T.StructType(
    [
        T.StructField("schema", _SCHEMA),
        T.StructField("payload", _PAYLOAD),
    ]
)

# op -> canonical op, for the messages that change rows.
CHANGE_OPS = {
    "INSERT": C.INSERT,
    "UPDATE_AFTER": C.UPDATE,
    "DELETE": C.DELETE,
    "TRUNCATE": C.TRUNCATE,
}
UPDATE_BEFORE_OPS = ("UPDATE_BEFOR", "UPDATE_BEFORE")  # the documented typo, and the spelling
CONTROL_OPS = {
    "MHEARTBEAT": "heartbeat",
    "TRANSACTION_BEGIN": "transaction begin",
    "TRANSACTION_END": "transaction end",
    "GTID": "GTID event",
    "XACOMMIT": "XA commit",
    "XAROLLBACK": "XA rollback",
}
DDL_OPS = ("CREATE", "ALTER", "ERASE", "QUERY", "RENAME", "CINDEX", "DINDEX")
# Synthetic key columns of tables without a primary key, in order of preference.
ROW_ID_COLUMNS = ("#alibaba_rds_row_id#", "rowid")

SEQUENCE_WIDTH = 20  # a long's 19 digits, and one to spare
FULL_LOAD_SEQUENCE = "0:" + "0" * SEQUENCE_WIDTH
_TYPES = {
    "BOOLEAN": ColumnSpec("boolean"),
    "DOUBLE": ColumnSpec("double"),
    "LONG": ColumnSpec("bigint"),
    "STRING": STRING,
    "BYTES": ColumnSpec("binary", "base64"),
    "DATE": ColumnSpec("timestamp", "epoch_millis"),
}


# --- helpers shared with datahub_tuple (the same DataWorks sync writes both) -----------------


def sequence_of(sequence_id: Column) -> Column:
    """A DataWorks sequence id as a fixed-width string; null when it is not an integer.

    Incremental ids (non-negative) -> ``1:`` + 20 digits; full-load ``-1`` (any negative id) ->
    ``0:`` + zeros, before every incremental change.
    """
    s = F.trim(sequence_id)
    return F.when(
        s.rlike(rf"^[0-9]{{1,{SEQUENCE_WIDTH}}}$"),
        F.concat(F.lit("1:"), F.lpad(s, SEQUENCE_WIDTH, "0")),
    ).when(s.rlike(r"^-[0-9]+$"), F.lit(FULL_LOAD_SEQUENCE))


def coordinates(df: DataFrame) -> list[str]:
    """The raw-coordinate columns present (they identify a message exactly)."""
    return [c for c in C.RAW_COORDINATES if c in df.columns] or ["value"]


def pair_halves(
    df: DataFrame,
    before_half: Column,
    after_half: Column,
    pair_key: list[Column],
    record: str,
) -> DataFrame:
    """Pair the two halves of updates sent as two messages, over the whole batch.

    Adds ``_pair_record`` (the ``record`` column of the pair's before half, the first by raw
    position if repeated; the caller takes its before image from it) and ``_pair_after`` (true
    when the pair has an after half). One window: halves are partitioned by ``pair_key``, every
    other message by its own raw coordinates, so the window never gathers unrelated messages (a
    full load shares one sequence id) into one partition.
    """
    df = df.withColumns({"_before_half": before_half, "_after_half": after_half})
    before, after = F.col("_before_half"), F.col("_after_half")
    half = before | after
    coords = coordinates(df)
    group = [*[F.when(half, k) for k in pair_key], *[F.when(~half, F.col(c)) for c in coords]]
    # A hash of the group first: the window's sort then mostly compares one long.
    window = Window.partitionBy(F.xxhash64(*group), *group)
    position = F.when(before, F.struct(*[F.col(c) for c in coords]))
    # Both in one withColumns: one window, so one shuffle. The record itself, not an image taken
    # from it, so the shuffle does not carry the image twice.
    return df.withColumns(
        {
            "_pair_record": F.min_by(F.col(record), position).over(window),
            "_pair_after": F.coalesce(F.max(after).over(window), F.lit(False)),
        }
    ).drop("_before_half", "_after_half")


def event_millis(*candidates: Column) -> Column:
    """The first candidate that is a positive epoch-millisecond number."""
    ms = [c.try_cast("bigint") for c in candidates]
    return F.coalesce(*[F.when(m > 0, m) for m in ms])


def _contains(image: Column, column: str) -> Column:
    return F.coalesce(F.array_contains(F.map_keys(image), column), F.lit(False))


def row_id_key(image: Column, columns: tuple[str, ...] = ROW_ID_COLUMNS) -> Column:
    """``[column]`` for the first synthetic row-id column present in ``image``, else null."""
    key = F.lit(None).cast(T.ArrayType(_S))
    for col in reversed(columns):
        key = F.when(_contains(image, col), F.array(F.lit(col))).otherwise(key)
    return key


# --- the format ------------------------------------------------------------------------------


def parse(raw: DataFrame, options: dict[str, str]) -> DataFrame:
    """Raw messages -> parsed records (``canonical.PARSED_SCHEMA``); never raises on bad input."""
    top = J.read_struct(_TOP)
    p = F.col("_top.payload")
    src = F.col("_top.schema.source")
    op = p.op
    before = p.before.dataColumn
    after = p.after.dataColumn
    seq = sequence_of(p.sequenceId)
    df = raw.withColumn("_top", top).withColumn("_seq", seq)

    table = src.tableName
    # Halves pair on an incremental sequence id (full-load ids are all -1).
    usable = (
        table.isNotNull()
        & (F.col("_seq") != FULL_LOAD_SEQUENCE)
        & F.col("_top")[J.CORRUPT].isNull()
    )
    before_half = F.coalesce(
        op.isin(*UPDATE_BEFORE_OPS) & usable & before.isNotNull(), F.lit(False)
    )
    after_half = F.coalesce((op == "UPDATE_AFTER") & usable & after.isNotNull(), F.lit(False))
    df = pair_halves(
        df, before_half, after_half, [src.dbName, src.schemaName, table, F.col("_seq")], "_top"
    )

    is_before_op = op.isin(*UPDATE_BEFORE_OPS)
    row_op = op.isin(*CHANGE_OPS) | is_before_op
    seq_text = F.coalesce(p.sequenceId, F.lit("null"))
    reason = (
        J.unreadable_reason(
            J.corrupt(F.col("_top")),
            "not a DataWorks message: unexpected JSON structure (a field of the wrong type)",
        )
        .when(p.isNull() | op.isNull(), F.lit("not a DataWorks message: no payload.op"))
        .when(
            ~(row_op | op.isin(*CONTROL_OPS) | op.isin(*DDL_OPS)),
            F.concat(F.lit("unknown DataWorks op '"), op, F.lit("'")),
        )
        .when(row_op & table.isNull(), F.lit("no schema.source.tableName: the table is unknown"))
        .when(
            row_op & F.col("_seq").isNull(),
            F.concat(
                F.lit("sequenceId '"),
                seq_text,
                F.lit("' is not an integer of at most 20 digits: the change cannot be ordered"),
            ),
        )
        .when(
            op.isin("INSERT", "UPDATE_AFTER") & after.isNull(),
            F.concat(F.lit("op "), op, F.lit(" without an after image")),
        )
        .when(
            (op == "DELETE") & before.isNull(),
            F.lit("DELETE without a before image: the row cannot be identified"),
        )
        .when(
            is_before_op & before.isNull(),
            F.concat(F.lit("op "), op, F.lit(" without a before image")),
        )
        .when(
            is_before_op & ~F.col("_pair_after"),
            F.concat(
                F.lit("unpaired update: "),
                op,
                F.lit(" (sequenceId "),
                seq_text,
                F.lit(
                    ") without its UPDATE_AFTER in this batch; a before image alone cannot be"
                    " applied"
                ),
            ),
        )
    )
    # Staged columns: referenced several times below, computed once (not inlined per use).
    df = df.withColumn("_error", F.when(F.col("value").isNotNull(), reason))
    is_error = F.col("_error").isNotNull()
    control = F.col("value").isNull() | (~is_error & (op.isin(*CONTROL_OPS) | is_before_op))
    control_ops = F.create_map(*[F.lit(x) for kv in CONTROL_OPS.items() for x in kv])
    control_reason = (
        F.when(F.col("value").isNull(), F.lit("kafka tombstone"))
        .when(
            is_before_op,
            F.concat(
                op,
                F.lit(" paired with its UPDATE_AFTER (sequenceId "),
                seq_text,
                F.lit("): the update record carries its before image"),
            ),
        )
        .otherwise(F.concat(control_ops[op], F.lit(" ("), op, F.lit(")")))
    )
    df = df.withColumn(
        "_kind",
        F.when(control, F.lit(C.KIND_CONTROL))
        .when(is_error, F.lit(C.KIND_ERROR))
        .when(op.isin(*DDL_OPS), F.lit(C.KIND_DDL))
        .otherwise(F.lit(C.KIND_CHANGE)),
    )
    kind = F.col("_kind")
    change_ops = F.create_map(*[F.lit(x) for kv in CHANGE_OPS.items() for x in kv])
    primary_key = F.col("_top.schema.primaryKey")
    key_columns = F.when(F.size(primary_key) > 0, primary_key).otherwise(
        row_id_key(F.coalesce(after, before))
    )
    value_schema = F.col("_top.schema.dataColumn")
    parsed = df.select(
        *raw.columns,
        kind.alias("kind"),
        F.when(kind == C.KIND_ERROR, F.col("_error"))
        .when(kind == C.KIND_CONTROL, control_reason)
        .when(kind == C.KIND_DDL, F.concat(F.lit("DDL "), op))
        .alias("reason"),
        F.when(kind == C.KIND_CHANGE, change_ops[op]).alias("op"),
        src.dbName.alias("database"),
        src.schemaName.alias("schema"),
        table.alias("table"),
        key_columns.alias("key_columns"),
        F.when(
            op == "UPDATE_AFTER",
            F.coalesce(before, F.col("_pair_record.payload.before.dataColumn")),
        )
        .otherwise(before)
        .alias("before_image"),
        after.alias("after_image"),
        F.lit(False).alias("after_partial"),
        F.when(value_schema != "null", value_schema).alias("value_schema"),
        F.lit("json").alias("image_encoding"),
        F.col("_seq").alias("source_sequence"),
        F.timestamp_millis(event_millis(p.timestamp.eventTime, p.timestamp.systemTime)).alias(
            "event_time"
        ),
        p.scn.alias("tx_id"),
        F.when(kind == C.KIND_DDL, p.ddl.text).alias("ddl"),
        F.lit(NAME).alias("source_format"),
    )
    return parsed


def column_specs(value_schema: str) -> dict[str, ColumnSpec]:
    """Column types from ``schema.dataColumn`` (``[{"name", "type"}]``); unknown types: string."""
    columns = json.loads(value_schema)
    if not isinstance(columns, list):
        return {}
    return {
        c["name"]: _TYPES.get(str(c.get("type", "")).upper(), STRING)
        for c in columns
        if isinstance(c, dict) and isinstance(c.get("name"), str)
    }


def claims(keys: Column, value: Column, probe: Column) -> Column:
    """``schema`` and ``payload`` at the top, with a ``payload.sequenceId``, a
    ``schema.dataColumn`` or a DataWorks op (heartbeats carry neither of the first two)."""
    known_ops = [*CHANGE_OPS, *UPDATE_BEFORE_OPS, *CONTROL_OPS, *DDL_OPS]
    has = J.key_test(keys)
    return (
        has("schema")
        & has("payload")
        & (
            J.probed(probe, "$.payload.sequenceId").isNotNull()
            | J.probed(probe, "$.schema.dataColumn").isNotNull()
            | J.probed(probe, "$.payload.op").isin(*known_ops)
        )
    )
