"""All Delta Lake I/O, with delta-rs (``deltalake``): the JVM Delta jars are not available here.

Spark reads a table's current snapshot from the Parquet files delta-rs lists; writes go from Arrow
to delta-rs. The asset key path ``[layer, source, table]`` is the table's path under the warehouse.
Keep this module the only place that touches Delta, so a delta-spark engine can replace it.
"""

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, WriterProperties, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

from cdc_platform.formats.column_specs import common_type

RAW = "raw"
CHANGELOG = "changelog"
CURRENT = "current"
QUARANTINE = "quarantine"
DDL = "ddl"
HISTORY = "history"
CONTROL = "control"
LAYERS = (RAW, CHANGELOG, CURRENT, QUARANTINE, HISTORY, DDL, CONTROL)
PARTITION_COLUMN = "ingest_date"
# Our bookkeeping rides in the commit metadata of the writes it describes (delta-rs rejects
# unknown table properties), so state and data change in one atomic commit.
STATE_KEY = "cdc.state"
# Merge source columns: true rows replace the target row whatever the sequences (REBUILT), or
# delete it (DROP: nothing of the key is left in the change log).
REBUILT = "__rebuilt"
DROP = "__drop"
# Several row groups per file: Spark splits a Parquet file into tasks by row group. Snappy: half
# the bytes of uncompressed Parquet (delta-rs's default once writer properties are given) for
# about the same CPU; ZSTD gives a third of the bytes but costs a full rewrite 30% more CPU.
WRITER = WriterProperties(max_row_group_size=64 * 1024, compression="SNAPPY")
# Current tables are written sorted by key in files of about this size (compressed), and
# delta-rs's MERGE writes the files it rewrites at this size too (the table property): a merge
# then reads and rewrites only the files whose key range (min/max statistics) holds a key of its
# batch.
CURRENT_FILE_SIZE = 16 * 2**20
_LAYOUT = {"delta.targetFileSize": str(CURRENT_FILE_SIZE)}
# At most this many key ranges in the predicate that limits a MERGE's scan.
_MAX_KEY_RANGES = 64


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
    present = set(df.columns)  # once: on Spark Connect each call is a round trip
    for field in schema.fields:
        if field.name in partition_columns:
            df = df.withColumn(field.name, F.col(field.name).cast(field.dataType))
        elif field.name not in present:
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
    uri: str,
    data: pa.Table,
    dates: list[str],
    metadata: dict[str, str] | None = None,
    raw_version: int | None = None,
) -> int:
    """Replace the ``ingest_date`` partitions ``dates`` with ``data``: reruns are idempotent.
    ``raw_version``: the raw table version the data was derived from, recorded in the same
    commit as the ``cdc.normalize`` transaction (see ``normalized_raw_version``)."""
    props = _props(metadata, raw_version)
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


# Delta transaction identifier of every table a normalize step writes: its version is the raw
# table version the output reflects, so an appending rerun after a crash skips what is done.
NORMALIZED_APP = "cdc.normalize"


def _props(metadata: dict[str, str] | None, raw_version: int | None) -> CommitProperties | None:
    txns = [Transaction(NORMALIZED_APP, raw_version)] if raw_version is not None else None
    if not metadata and not txns:
        return None
    return CommitProperties(custom_metadata=metadata, app_transactions=txns)


def normalized_raw_version(uri: str) -> int | None:
    """The raw version a normalize output reflects (None: none recorded, or no table)."""
    return DeltaTable(uri).transaction_version(NORMALIZED_APP) if exists(uri) else None


def append_normalized(
    uri: str, data: pa.Table, raw_version: int, metadata: dict[str, str] | None = None
) -> int | None:
    """Append ``data`` derived from raw up to ``raw_version``, unless the table already reflects
    that version (a rerun after a crash between outputs): None then. The commit is made against
    the version read, so a racing run that appended the same batch makes this one fail."""
    props = _props(metadata, raw_version)
    if not exists(uri):
        write_deltalake(
            uri, data, partition_by=[PARTITION_COLUMN], mode="append",
            commit_properties=props, writer_properties=WRITER,
        )  # fmt: skip
        return DeltaTable(uri).version()
    dt = DeltaTable(uri)
    done = dt.transaction_version(NORMALIZED_APP)
    if done is not None and done >= raw_version:
        return None
    _widen(uri, data.schema)
    write_deltalake(
        DeltaTable(uri, version=dt.version()), data, mode="append", schema_mode="merge",
        commit_properties=props, writer_properties=WRITER,
    )  # fmt: skip
    return DeltaTable(uri).version()


def delete_landing_rows(uri: str, names_by_date: dict[str, list[str]], raw_version: int) -> int:
    """Delete the rows of these landing files (date -> ``file`` names) from a normalize output
    that does not reflect ``raw_version`` yet: the rows of re-ingested files go before their
    new rows are appended. Skipped by an output that reflects it (a rerun after a crash must
    not delete what the crashed run appended). Returns rows deleted."""
    if not names_by_date or not exists(uri):
        return 0
    dt = DeltaTable(uri)
    done = dt.transaction_version(NORMALIZED_APP)
    if (done is not None and done >= raw_version) or "file" not in pa.schema(dt.schema()).names:
        return 0

    def listed(values: list[str]) -> str:
        return ", ".join("'" + v.replace("'", "''") + "'" for v in values)

    predicate = " OR ".join(
        f"({PARTITION_COLUMN} = '{date}' AND file IN ({listed(names)}))"
        for date, names in sorted(names_by_date.items())
    )
    return int(dt.delete(predicate).get("num_deleted_rows", 0))


def files_between(uri: str, after: int | None, upto: int) -> list[str]:
    """Files of version ``upto`` that version ``after`` did not have (all when ``after`` is
    None). Raw is append-only for Kafka sources, so these are the batches in between."""
    files_upto = files(uri, upto)
    if after is None:
        return files_upto
    before = set(files(uri, after))
    return [f for f in files_upto if f not in before]


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


def replace(uri: str, data: pa.Table, state: dict[str, Any], key: list[str] | None = None) -> int:
    """Replace the whole table (a new version: time travel still reaches the old one).

    With ``key`` (a current table), the rows are written sorted by it, in the current layout."""
    props = CommitProperties(custom_metadata={STATE_KEY: json.dumps(state)})
    layout: dict[str, Any] = {"writer_properties": WRITER}
    if key:
        data = data.sort_by([(k, "ascending") for k in key])
        layout = {
            "writer_properties": WRITER,
            "configuration": _LAYOUT,
            "target_file_size": CURRENT_FILE_SIZE,
        }
        _keep_layout(uri)
    write_deltalake(
        uri, data, mode="overwrite", schema_mode="overwrite", commit_properties=props, **layout
    )
    return DeltaTable(uri).version()


def _keep_layout(uri: str) -> None:
    """Give a current table written before the layout existed its file-size property."""
    if exists(uri):
        dt = DeltaTable(uri)
        if dt.metadata().configuration.get("delta.targetFileSize") != str(CURRENT_FILE_SIZE):
            dt.alter.set_table_properties(_LAYOUT)


def _key_ranges(uri: str, data: pa.Table, key: list[str]) -> str | None:
    """A predicate on the target's first key column that every target row matching a key of
    ``data`` satisfies, narrow enough for delta-rs to skip, by their min/max statistics, the files
    that hold none of those keys (its own early filter skips no file when the MERGE source is
    streamed, the default). Integer keys: one range per group of files holding batch keys;
    string keys: the batch's min to max; other types: None. The bounds are batch keys, so the
    predicate holds for every matching row whatever the statistics say."""
    col, values = key[0], data[key[0]].drop_null()
    if len(values) == 0:
        return None
    target = f"t.{_quote(col)}"
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        lo, hi = ("'" + v.as_py().replace("'", "''") + "'" for v in pc.min_max(values).values())
        return f"{target} BETWEEN {lo} AND {hi}"
    if not pa.types.is_integer(values.type):
        return None
    keys = np.unique(values.to_numpy())
    ranges = [(keys[0], keys[-1])]
    stats = pa.table(DeltaTable(uri).get_add_actions(flatten=True))
    lows, highs = (f"{m}.{col}" for m in ("min", "max"))
    if {lows, highs} <= set(stats.column_names) and not (
        stats[lows].null_count or stats[highs].null_count
    ):
        # The batch keys inside each file's [min, max]: one range per file that has any.
        first = np.searchsorted(keys, stats[lows].to_numpy(), "left")
        last = np.searchsorted(keys, stats[highs].to_numpy(), "right") - 1
        hit = first <= last
        found = sorted(zip(keys[first[hit]], keys[last[hit]], strict=True))
        if found:
            ranges = [found[0]]
            for lo, hi in found[1:]:  # overlapping files, overlapping ranges: join them
                if lo <= ranges[-1][1]:
                    ranges[-1] = (ranges[-1][0], max(ranges[-1][1], hi))
                else:
                    ranges.append((lo, hi))
        # (no file holds a batch key: all keys are new; the one range overlaps no file)
    if len(ranges) > _MAX_KEY_RANGES:  # join neighbours across all but the widest gaps
        gaps = np.array([b[0] - a[1] for a, b in zip(ranges[:-1], ranges[1:], strict=True)])
        cuts = set(np.argsort(gaps)[len(gaps) - (_MAX_KEY_RANGES - 1) :].tolist())
        joined = [ranges[0]]
        for i, (lo, hi) in enumerate(ranges[1:]):
            if i in cuts:
                joined.append((lo, hi))
            else:
                joined[-1] = (joined[-1][0], hi)
        ranges = joined
    return "(" + " OR ".join(f"{target} BETWEEN {lo} AND {hi}" for lo, hi in ranges) + ")"


def files_added_since(uri: str, since_version: int) -> list[str] | None:
    """Files in the snapshot that were not in version ``since_version`` (None: that version is
    gone, e.g. vacuumed; the caller then reads everything)."""
    try:
        return files_between(uri, since_version, version(uri))
    except Exception:  # delta-rs raises its own error types for a missing version
        return None


def files_removed_since(uri: str, since_version: int) -> list[str] | None:
    """Files version ``since_version`` had that the snapshot no longer has (a replaced
    partition's), still on disk so their rows can be read; None when that version or one of
    those files is gone (vacuumed)."""
    try:
        before = files(uri, since_version)
    except Exception:  # delta-rs raises its own error types for a missing version
        return None
    now = set(files(uri))
    removed = [f for f in before if f not in now]
    if any("://" not in f and not Path(f).exists() for f in removed):
        return None
    return removed


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def upsert_newer(
    uri: str, data: pa.Table, key: list[str], sequence: str, partial: str, state: dict[str, Any]
) -> dict[str, int]:
    """MERGE rows into ``uri`` by ``key`` where their ``sequence`` is newer; record ``state``.

    The sequence condition makes the merge idempotent and order-insensitive: replaying a batch,
    or a late, older batch, leaves newer rows untouched. A row whose ``partial`` column lists
    columns updates only those (and the ``__`` bookkeeping); the rest keep their values. A row
    whose ``REBUILT`` column is true replaces its key's row whatever the sequences; one whose
    ``DROP`` column is true deletes it.
    """
    if DROP in data.column_names and not exists(uri):
        data = data.filter(pc.invert(data[DROP]))
    extra = [c for c in (partial, REBUILT, DROP) if c in data.column_names]
    props = CommitProperties(custom_metadata={STATE_KEY: json.dumps(state)})
    if not exists(uri):
        write_deltalake(
            uri,
            data.drop_columns(extra).sort_by([(k, "ascending") for k in key]),
            mode="append",
            commit_properties=props,
            writer_properties=WRITER,
            configuration=_LAYOUT,
            target_file_size=CURRENT_FILE_SIZE,
        )
        return {"num_target_rows_inserted": data.num_rows, "num_target_rows_updated": 0}
    _widen(uri, data.schema)
    data = _target_nullability(uri, data)
    target = set(arrow_schema(uri).names)
    _keep_layout(uri)
    on = " AND ".join(f"t.{_quote(k)} = s.{_quote(k)}" for k in key)
    if ranges := _key_ranges(uri, data, key):
        on += f" AND {ranges}"
    newer = f"s.{_quote(sequence)} > t.{_quote(sequence)}"
    if REBUILT in data.column_names:
        newer = f"({newer} OR s.{_quote(REBUILT)})"
    p = f"s.{_quote(partial)}"

    def carried(col: str) -> str:
        if col.startswith("__"):
            return f"s.{_quote(col)}"
        kept = f" ELSE t.{_quote(col)}" if col in target else ""
        return f"CASE WHEN array_contains({p}, '{col}') THEN s.{_quote(col)}{kept} END"

    columns = [c for c in data.column_names if c not in extra]
    # A full image sets every user column: one the batch lacks altogether (dropped at the
    # source) becomes null rather than keeping a stale value.
    full = {c: f"s.{_quote(c)}" for c in columns}
    full |= {c: "NULL" for c in target if c not in full and not c.startswith("__")}
    before, merge = _merge(uri, data, on, props)
    if DROP in data.column_names:
        dropped = f"s.{_quote(DROP)}"
        merge = merge.when_matched_delete(predicate=dropped)
        newer = f"NOT {dropped} AND {newer}"
    insert = {"predicate": f"NOT {dropped}"} if DROP in data.column_names else {}
    metrics = (
        merge.when_matched_update(full, predicate=f"{newer} AND {p} IS NULL")
        .when_matched_update(
            {c: carried(c) for c in columns}, predicate=f"{newer} AND {p} IS NOT NULL"
        )
        .when_not_matched_insert_all(except_cols=extra, **insert)
        .execute()
    )
    _record_state_if_no_commit(uri, before, props)
    return metrics


def _target_nullability(uri: str, data: pa.Table) -> pa.Table:
    """``data`` with the target's NOT NULL columns declared non-null where they hold no null:
    delta-rs 1.6's MERGE with ``merge_schema`` writes null into such a column of the target rows
    it copies when the source declares the column nullable, then fails its own constraint."""
    required = {f.name for f in arrow_schema(uri) if not f.nullable}
    fields = [
        f.with_nullable(False)
        if f.name in required and f.nullable and data[f.name].null_count == 0
        else f
        for f in data.schema
    ]
    return data.cast(pa.schema(fields))


def _merge(uri: str, data: pa.Table, on: str, props: CommitProperties):
    """The table's version before, and a MERGE of ``data`` (alias s) into it (alias t) on
    ``on``. (Read the version first: executing the merge advances the DeltaTable.)"""
    dt = DeltaTable(uri)
    before = dt.version()
    merge = dt.merge(
        data,
        on,
        source_alias="s",
        target_alias="t",
        merge_schema=True,
        commit_properties=props,
        writer_properties=WRITER,
    )
    return before, merge


def _record_state_if_no_commit(uri: str, version_before: int, props: CommitProperties) -> None:
    """A MERGE that changes nothing makes no commit: record the state in an empty one."""
    if DeltaTable(uri).version() == version_before:
        write_deltalake(
            uri, arrow_schema(uri).empty_table(), mode="append", commit_properties=props
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


# --- history ---


def files_changed_since(uri: str, since_version: int) -> list[str] | None:
    """Files added since version ``since_version`` and files removed since then (still on disk,
    so their rows can be read); None when that version or a removed file is gone (vacuumed)."""
    try:
        before = set(DeltaTable(uri, version=since_version).file_uris())
    except Exception:  # delta-rs raises its own error types for a missing version
        return None
    now = set(DeltaTable(uri).file_uris())
    removed = before - now
    if any("://" not in f and not Path(f).exists() for f in removed):
        return None
    return sorted((now - before) | removed)


def max_stat(uri: str, column: str, at_version: int | None = None) -> Any:
    """The largest value of ``column`` from the files' statistics (no data read); None when the
    table is absent or empty, or no file has statistics for it."""
    if not exists(uri):
        return None
    actions = pa.table(DeltaTable(uri, version=at_version).get_add_actions(flatten=True))
    name = f"max.{column}"
    return pc.max(actions[name]).as_py() if name in actions.column_names else None


def row_count(uri: str) -> int:
    """Rows in the table's snapshot, from the file statistics (reads no data)."""
    if not exists(uri):
        return 0
    return int(sum(DeltaTable(uri).get_add_actions(flatten=True)["num_records"].to_pylist()))


def partition_row_counts(uri: str) -> dict[str, int]:
    """Rows per ``ingest_date`` partition of the table's snapshot (ISO date -> rows), from the
    file statistics (reads no data); empty when the table does not exist."""
    if not exists(uri):
        return {}
    actions = DeltaTable(uri).get_add_actions(flatten=True)
    dates = actions[f"partition.{PARTITION_COLUMN}"].to_pylist()
    counts: dict[str, int] = {}
    for date, rows in zip(dates, actions["num_records"].to_pylist(), strict=True):
        counts[str(date)] = counts.get(str(date), 0) + int(rows)
    return counts


def replace_versions(
    uri: str, data: pa.Table, key: list[str], start: str, drop: str, state: dict[str, Any]
) -> dict[str, int]:
    """Replace some keys' rows of a history table in one commit: MERGE on ``key`` + ``start``.
    A source row flagged ``drop`` deletes its match; the others update their match when a value
    differs, or are inserted. Records ``state``."""
    _widen(uri, data.schema)
    props = CommitProperties(custom_metadata={STATE_KEY: json.dumps(state)})
    on = " AND ".join(f"t.{_quote(c)} = s.{_quote(c)}" for c in [*key, start])
    columns = [c for c in data.column_names if c != drop]
    changed = "TRUE"
    if set(columns) <= set(arrow_schema(uri).names):
        changed = " OR ".join(f"(s.{_quote(c)} IS DISTINCT FROM t.{_quote(c)})" for c in columns)
    dropped = f"s.{_quote(drop)}"
    before, merge = _merge(uri, data, on, props)
    metrics = (
        merge.when_matched_delete(predicate=dropped)
        .when_matched_update_all(predicate=f"NOT {dropped} AND ({changed})", except_cols=[drop])
        .when_not_matched_insert_all(predicate=f"NOT {dropped}", except_cols=[drop])
        .execute()
    )
    _record_state_if_no_commit(uri, before, props)
    return metrics


# --- kafka ---

# Commit metadata of a Kafka batch: the offset ranges it covers, for people and monitors. The
# offsets ingestion resumes from are the txn actions below, part of the table state itself.
KAFKA_KEY = "cdc.kafka"


def kafka_app_id(topic: str, partition: int) -> str:
    """The Delta transaction identifier (``txn`` app id) of one topic-partition; its version is
    the next offset to read."""
    return f"cdc.kafka/{topic}/{partition}"


def kafka_offsets(
    uri: str, schema: pa.Schema, partitions: list[tuple[str, int]]
) -> tuple[int, dict[tuple[str, int], int]]:
    """The raw table's version and the next offset of each partition it has records of.

    Creates the (empty, ``ingest_date``-partitioned) table when absent, so every batch commits
    against a version it read: see ``append_kafka_batch``."""
    if not exists(uri):
        try:
            DeltaTable.create(uri, schema, mode="ignore", partition_by=[PARTITION_COLUMN])
        except Exception:  # a concurrent run created it first; delta-rs has no common base class
            if not exists(uri):
                raise
    dt = DeltaTable(uri)
    return dt.version(), _stored_offsets(dt, partitions)


def kafka_stored_offsets(uri: str, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The next offset of each partition the raw table has records of (read only)."""
    return _stored_offsets(DeltaTable(uri), partitions) if exists(uri) else {}


def _stored_offsets(
    dt: DeltaTable, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    found = {}
    for topic, partition in partitions:
        offset = dt.transaction_version(kafka_app_id(topic, partition))
        if offset is not None:
            found[(topic, partition)] = offset
    return found


def append_kafka_batch(
    uri: str,
    data: pa.Table,
    read_version: int,
    next_offsets: dict[tuple[str, int], int],
    metadata: dict[str, Any],
) -> int:
    """Append one batch and set each partition's next offset in the same commit.

    The commit is made against ``read_version``, the version the offsets were read from: when
    another run committed offsets of the same partitions since, Delta's conflict check on the
    transaction identifiers fails this commit instead of storing the records twice."""
    txns = [Transaction(kafka_app_id(t, p), o) for (t, p), o in sorted(next_offsets.items())]
    props = CommitProperties(
        custom_metadata={KAFKA_KEY: json.dumps(metadata)}, app_transactions=txns
    )
    write_deltalake(
        DeltaTable(uri, version=read_version),
        data,
        mode="append",
        schema_mode="merge",
        commit_properties=props,
        writer_properties=WRITER,
    )
    return DeltaTable(uri).version()


def kafka_batches(uri: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The ``cdc.kafka`` metadata of the table's Kafka batches, newest first, with ``version``."""
    if not exists(uri):
        return []
    return [
        {**json.loads(c[KAFKA_KEY]), "version": c["version"]}
        for c in DeltaTable(uri).history(limit)
        if KAFKA_KEY in c
    ]


def read_arrow(uri: str, columns: list[str] | None = None) -> pa.Table | None:
    """The table's snapshot as Arrow, without Spark (small tables: tests, previews); None if
    absent."""
    return DeltaTable(uri).to_pyarrow_table(columns=columns) if exists(uri) else None


# --- SQL models (cdc_platform/models) ---

# Model tables live at <warehouse>/models/<name>, like their asset keys ["models", <name>].
MODELS = "models"


def write_model(
    uri: str, data: pa.Table, state: dict[str, Any], partition_by: list[str] | None = None
) -> int:
    """Replace a model table, schema and partitioning included, recording ``state``."""
    props = CommitProperties(custom_metadata={STATE_KEY: json.dumps(state)})
    write_deltalake(
        uri,
        data,
        mode="overwrite",
        schema_mode="overwrite",
        partition_by=partition_by or None,
        commit_properties=props,
        writer_properties=WRITER,
    )
    return DeltaTable(uri).version()


def upsert_model(uri: str, data: pa.Table, key: list[str], state: dict[str, Any]) -> dict[str, int]:
    """MERGE ``data`` into a model table on ``key``: a matched row is replaced, a new key is
    inserted (new columns are added); records ``state`` even when nothing changed."""
    _widen(uri, data.schema)
    props = CommitProperties(custom_metadata={STATE_KEY: json.dumps(state)})
    on = " AND ".join(f"t.{_quote(k)} = s.{_quote(k)}" for k in key)
    before, merge = _merge(uri, data, on, props)
    metrics = merge.when_matched_update_all().when_not_matched_insert_all().execute()
    _record_state_if_no_commit(uri, before, props)
    return metrics
