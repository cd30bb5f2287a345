"""All Delta Lake I/O, with delta-rs (``deltalake``): the JVM Delta jars are not available here.

Spark reads a table's current snapshot from the Parquet files delta-rs lists; writes go from Arrow
to delta-rs. The asset key path ``[layer, source, table]`` is the table's path under the warehouse.
Keep this module the only place that touches Delta, so a delta-spark engine can replace it.
"""

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, WriterProperties, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

from cdc_platform.formats.column_specs import common_type

RAW = "raw"
CHANGELOG = "changelog"
CURRENT = "current"
QUARANTINE = "quarantine"
HISTORY = "history"
LAYERS = (RAW, CHANGELOG, CURRENT, QUARANTINE, HISTORY)
PARTITION_COLUMN = "ingest_date"
# Our bookkeeping rides in the commit metadata of the writes it describes (delta-rs rejects
# unknown table properties), so state and data change in one atomic commit.
STATE_KEY = "cdc.state"
# Several row groups per file: Spark splits a Parquet file into tasks by row group.
WRITER = WriterProperties(max_row_group_size=64 * 1024)


def key_path(layer: str, source: str, table: str | None = None) -> list[str]:
    """The asset key path of a table, which is also its path under the warehouse."""
    return [layer, source] if table is None else [layer, source, table]


def table_uri(warehouse: Path, layer: str, source: str, table: str | None = None) -> str:
    return str(Path(warehouse, *key_path(layer, source, table)))


def tables_under(warehouse: Path, layer: str, source: str) -> list[str]:
    """URIs of the Delta tables of one source in one layer, by name."""
    folder = Path(warehouse, layer, source)
    if not folder.is_dir():
        return []
    return sorted(str(p) for p in folder.iterdir() if exists(str(p)))


def exists(uri: str) -> bool:
    return DeltaTable.is_deltatable(uri)


def version(uri: str) -> int | None:
    return DeltaTable(uri).version() if exists(uri) else None


def files(uri: str, at_version: int | None = None) -> list[str]:
    if not exists(uri):
        return []
    return DeltaTable(uri, version=at_version).file_uris()


def arrow_schema(uri: str) -> pa.Schema:
    return pa.schema(DeltaTable(uri).schema())


def read(spark: SparkSession, uri: str, only_files: list[str] | None = None) -> DataFrame | None:
    """The table's snapshot (or just ``only_files`` of it) as a Spark DataFrame; None if absent."""
    if not exists(uri):
        return None
    dt = DeltaTable(uri)
    schema = from_arrow_schema(pa.schema(dt.schema()))
    paths = dt.file_uris() if only_files is None else only_files
    if not paths:
        return spark.createDataFrame([], schema)
    partition_columns = dt.metadata().partition_columns
    df = spark.read.option("basePath", uri).option("mergeSchema", "true").parquet(*paths)
    # Partition values live in the paths; cast them back and restore the table's column order
    # (files written before a schema change lack the newer columns).
    for field in schema.fields:
        if field.name in partition_columns:
            df = df.withColumn(field.name, F.col(field.name).cast(field.dataType))
        elif field.name not in df.columns:
            df = df.withColumn(field.name, F.lit(None).cast(field.dataType))
    return df.select(*[F.col(f"`{f.name}`") for f in schema.fields])


def _arrow_type(sql_type: str) -> pa.DataType:
    """Arrow type of a type widening can produce (see ``column_specs.common_type``)."""
    if m := re.fullmatch(r"decimal\((\d+),(\d+)\)", sql_type):
        return pa.decimal128(int(m[1]), int(m[2]))
    named = {"smallint": pa.int16(), "int": pa.int32(), "bigint": pa.int64()}
    return {**named, "double": pa.float64(), "timestamp": pa.timestamp("us", tz="UTC")}[sql_type]


def _widened(table: pa.DataType | pa.Schema, incoming: pa.DataType | pa.Schema):
    """``table`` with each column (nested in structs too) widened to hold ``incoming``'s type."""
    if isinstance(table, pa.Schema) or pa.types.is_struct(table):
        names = (
            {f.name: f.type for f in incoming}
            if isinstance(incoming, (pa.Schema, pa.StructType))
            else {}
        )
        fields = [
            f.with_type(_widened(f.type, names[f.name])) if f.name in names else f for f in table
        ]
        return pa.schema(fields) if isinstance(table, pa.Schema) else pa.struct(fields)
    if table == incoming or pa.types.is_struct(incoming):
        return table
    try:
        old, new = from_arrow_type(table).simpleString(), from_arrow_type(incoming).simpleString()
    except (TypeError, ValueError):  # a type Spark has no name for is never widened
        return table
    common = common_type(old, new)
    return table if common in (None, old) else _arrow_type(common)


def _widen(uri: str, incoming: pa.Schema) -> None:
    """delta-rs casts written data to the table's types, narrowing silently: when the incoming
    type is wider (int -> bigint, more decimal digits), rewrite the table with it first."""
    if not exists(uri):
        return
    dt = DeltaTable(uri)
    schema = pa.schema(dt.schema())
    target = _widened(schema, incoming)
    if target.equals(schema):
        return
    write_deltalake(
        uri,
        dt.to_pyarrow_table().cast(target),
        mode="overwrite",
        schema_mode="overwrite",
        partition_by=dt.metadata().partition_columns or None,
        writer_properties=WRITER,
    )


def overwrite_partitions(
    uri: str, data: pa.Table, dates: list[str], metadata: dict[str, str] | None = None
) -> int:
    """Replace the ``ingest_date`` partitions ``dates`` with ``data``: reruns are idempotent."""
    props = CommitProperties(custom_metadata=metadata) if metadata else None
    if not exists(uri):
        write_deltalake(
            uri,
            data,
            partition_by=[PARTITION_COLUMN],
            mode="append",
            commit_properties=props,
            writer_properties=WRITER,
        )
    else:
        _widen(uri, data.schema)
        listed = ", ".join(f"'{d}'" for d in sorted(set(dates)))
        write_deltalake(
            uri,
            data,
            mode="overwrite",
            schema_mode="merge",
            predicate=f"{PARTITION_COLUMN} IN ({listed})",
            commit_properties=props,
            writer_properties=WRITER,
        )
    return DeltaTable(uri).version()


def replace_where(uri: str, data: pa.Table, predicate: str) -> int:
    """Replace the rows matching ``predicate`` (a SQL predicate) with ``data``."""
    write_deltalake(
        uri,
        data,
        mode="overwrite",
        schema_mode="merge",
        predicate=predicate,
        writer_properties=WRITER,
    )
    return DeltaTable(uri).version()


def replace(uri: str, data: pa.Table, state: dict[str, Any]) -> int:
    """Replace the whole table (a new version: time travel still reaches the old one)."""
    props = CommitProperties(custom_metadata={STATE_KEY: json.dumps(state)})
    write_deltalake(
        uri,
        data,
        mode="overwrite",
        schema_mode="overwrite",
        commit_properties=props,
        writer_properties=WRITER,
    )
    return DeltaTable(uri).version()


def files_added_since(uri: str, since_version: int) -> list[str] | None:
    """Files in the snapshot that were not in version ``since_version`` (None: that version is
    gone, e.g. vacuumed; the caller then reads everything)."""
    try:
        before = set(DeltaTable(uri, version=since_version).file_uris())
    except Exception:  # delta-rs raises its own error types for a missing version
        return None
    return [f for f in DeltaTable(uri).file_uris() if f not in before]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def upsert_newer(
    uri: str, data: pa.Table, key: list[str], sequence: str, partial: str, state: dict[str, Any]
) -> dict[str, int]:
    """MERGE rows into ``uri`` by ``key`` where their ``sequence`` is newer; record ``state``.

    The sequence condition makes the merge idempotent and order-insensitive: replaying a batch,
    or a late, older batch, leaves newer rows untouched. A row whose ``partial`` column lists
    columns updates only those (and the ``__`` bookkeeping); the rest keep their values.
    """
    props = CommitProperties(custom_metadata={STATE_KEY: json.dumps(state)})
    if not exists(uri):
        write_deltalake(
            uri,
            data.drop_columns([partial]),
            mode="append",
            commit_properties=props,
            writer_properties=WRITER,
        )
        return {"num_target_rows_inserted": data.num_rows, "num_target_rows_updated": 0}
    _widen(uri, data.schema)
    target = set(arrow_schema(uri).names)
    on = " AND ".join(f"t.{_quote(k)} = s.{_quote(k)}" for k in key)
    newer = f"s.{_quote(sequence)} > t.{_quote(sequence)}"
    p = f"s.{_quote(partial)}"

    def carried(col: str) -> str:
        if col.startswith("__"):
            return f"s.{_quote(col)}"
        kept = f" ELSE t.{_quote(col)}" if col in target else ""
        return f"CASE WHEN array_contains({p}, '{col}') THEN s.{_quote(col)}{kept} END"

    columns = [c for c in data.column_names if c != partial]
    # A full image sets every user column: one the batch lacks altogether (dropped at the
    # source) becomes null rather than keeping a stale value.
    full = {c: f"s.{_quote(c)}" for c in columns}
    full |= {c: "NULL" for c in target if c not in full and not c.startswith("__")}
    return (
        DeltaTable(uri)
        .merge(
            data,
            on,
            source_alias="s",
            target_alias="t",
            merge_schema=True,
            commit_properties=props,
            writer_properties=WRITER,
        )
        .when_matched_update(full, predicate=f"{newer} AND {p} IS NULL")
        .when_matched_update(
            {c: carried(c) for c in columns}, predicate=f"{newer} AND {p} IS NOT NULL"
        )
        .when_not_matched_insert_all(except_cols=[partial])
        .execute()
    )


def delete_where(uri: str, predicate: str, state: dict[str, Any]) -> int:
    """Delete rows matching a SQL predicate (column names double-quoted); returns rows deleted."""
    props = CommitProperties(custom_metadata={STATE_KEY: json.dumps(state)})
    metrics = DeltaTable(uri).delete(predicate, commit_properties=props)
    return int(metrics.get("num_deleted_rows", 0))


def quoted(name: str) -> str:
    """A column name quoted for delta-rs predicates."""
    return _quote(name)


def state(uri: str) -> dict[str, Any]:
    """The newest ``cdc.state`` commit metadata of a table ({} if none)."""
    if not exists(uri):
        return {}
    for commit in DeltaTable(uri).history():
        if STATE_KEY in commit:
            return json.loads(commit[STATE_KEY])
    return {}


def image_types(uri: str) -> dict[str, str]:
    """Spark SQL types of a change-log table's image columns (its ``after`` struct)."""
    after = arrow_schema(uri).field("after").type
    return {f.name: from_arrow_type(f.type).simpleString() for f in after}


def describe(uri: str) -> dict[str, Any]:
    """Version, file count and Arrow schema of a table, for materialization metadata."""
    dt = DeltaTable(uri)
    return {"version": dt.version(), "files": len(dt.file_uris()), "schema": pa.schema(dt.schema())}
