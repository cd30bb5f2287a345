"""The columns of normalization's outputs besides the change log: the quarantine, the DDL log and
the control log, each selected from the parsed messages."""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_platform.formats import canonical as C

QUARANTINE_COLUMNS = (
    "ingest_date", "topic", "partition", "offset", "timestamp", "key", "value", "file", "line",
    "reason", "source_format", "qualified_table",
)  # fmt: skip


def to_quarantine(rows: DataFrame) -> DataFrame:
    return rows.select(*QUARANTINE_COLUMNS)


def ddl_records(parsed: DataFrame) -> DataFrame:
    """The DDL log rows of a parsed batch: statement, where it applies, when, and whence."""
    return parsed.where(F.col("kind") == C.KIND_DDL).select(
        "qualified_table", "database", "schema", "table", F.col("ddl").alias("statement"),
        "op", "sequence", "event_time", "source_format",
        "topic", "partition", "offset", "file", "line", "ingest_date",
    )  # fmt: skip


def control_records(parsed: DataFrame) -> DataFrame:
    """The control log rows of a parsed batch: heartbeats, transaction markers, tombstones.
    Their event times tell how far the source has got even when no row changes."""
    return parsed.where(F.col("kind") == C.KIND_CONTROL).select(
        "op", "database", "schema", "table", "sequence", "event_time", "tx_id", "source_format",
        "topic", "partition", "offset", "file", "line", "ingest_date",
    )  # fmt: skip


def image_columns() -> Column:
    """The columns a change's images name (before's and after's)."""
    none = F.array().cast("array<string>")
    return F.array_union(
        F.coalesce(F.map_keys("after_image"), none), F.coalesce(F.map_keys("before_image"), none)
    )
