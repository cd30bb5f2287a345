"""The canonical change record: the one shape every wire format is parsed into.

Parsing happens in two steps. A format module turns raw messages into *parsed records* whose row
images are still wire text (``map<string,string>``: column -> the value's JSON text, or the string
itself). ``cdc_platform.normalize`` then types those images per table into the *change log*
(typed ``before``/``after`` structs), which is the Delta table users see. Both column lists live
here so that every layer agrees on them.
"""

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

# Canonical operations (Debezium's letters, the lingua franca of CDC tools).
INSERT = "c"
UPDATE = "u"
DELETE = "d"
READ = "r"  # snapshot / initial-load row: an insert that never overwrites a newer change
TRUNCATE = "t"
OPS = (INSERT, UPDATE, DELETE, READ, TRUNCATE)

# What a parsed message is.
KIND_CHANGE = "change"  # a row change (or a truncate) of one table
KIND_CONTROL = "control"  # heartbeat, transaction marker, Kafka tombstone: changes no row
KIND_DDL = "ddl"  # schema change statement: kept, changes no row
KIND_ERROR = "error"  # cannot be parsed or applied: goes to quarantine with `reason`
# ``format: auto``'s reason for a message no format claims.
UNRECOGNISED = "no format recognises this message"
KINDS = (KIND_CHANGE, KIND_CONTROL, KIND_DDL, KIND_ERROR)

IMAGE = T.MapType(T.StringType(), T.StringType())

# Columns every format parser returns (raw coordinates are carried through unchanged).
PARSED_SCHEMA = T.StructType(
    [
        T.StructField("kind", T.StringType()),
        T.StructField("reason", T.StringType()),
        T.StructField("op", T.StringType()),
        T.StructField("database", T.StringType()),
        T.StructField("schema", T.StringType()),
        T.StructField("table", T.StringType()),
        T.StructField("key_columns", T.ArrayType(T.StringType())),
        T.StructField("before_image", IMAGE),
        T.StructField("after_image", IMAGE),
        # True when after_image holds only the changed columns (SharePlex updates): columns
        # absent from it keep their previous values. False: a full row image, absent = null.
        T.StructField("after_partial", T.BooleanType()),
        # Format-specific description of the image columns (e.g. the Kafka Connect schema), read
        # on the driver for the few distinct values of a batch to type the columns.
        T.StructField("value_schema", T.StringType()),
        # How image values are encoded: "json" (text as on the wire) or "hbase" (base64 bytes).
        T.StructField("image_encoding", T.StringType()),
        # The format's own total order, as a fixed-width string (the raw position is appended
        # later as the last tie-break).
        T.StructField("source_sequence", T.StringType()),
        T.StructField("event_time", T.TimestampType()),
        T.StructField("tx_id", T.StringType()),
        T.StructField("ddl", T.StringType()),
        T.StructField("source_format", T.StringType()),
    ]
)

# Raw coordinates: where a message came from. Together they identify it exactly.
RAW_COORDINATES = ("ingest_date", "topic", "partition", "offset", "file", "line")

# Metadata columns of the change log, after `before`/`after` (docs/semantics.md, "The canonical
# change record").
CHANGELOG_META = (
    "op",
    "database",
    "schema",
    "table",
    "sequence",
    "event_time",
    "tx_id",
    "source_format",
)

# Metadata columns of the current-state table (user columns come first).
SEQUENCE_COL = "__sequence"
OP_COL = "__op"
EVENT_TIME_COL = "__event_time"
DELETED_COL = "__deleted"
# True when the key's newest change carried only some columns (a partial image): the others
# come from older changes, so a late older change can still matter for that key.
PARTIAL_NEWEST_COL = "__partial"
CURRENT_META = (SEQUENCE_COL, OP_COL, EVENT_TIME_COL, DELETED_COL, PARTIAL_NEWEST_COL)


def raw_position() -> Column:
    """Where the message sits in its topic (or landing file): the last ordering tie-break."""
    return F.when(
        F.col("offset").isNotNull(),
        F.concat(
            F.lit("k"),
            F.lpad(F.coalesce(F.col("partition"), F.lit(0)).cast("string"), 6, "0"),
            F.lpad(F.col("offset").cast("string"), 20, "0"),
        ),
    ).otherwise(
        F.concat(
            F.lit("f"), F.col("file"), F.lit("#"), F.lpad(F.col("line").cast("string"), 12, "0")
        )
    )
