"""Where the tables are and what they hold: paths, Spark reads, and facts of a snapshot taken
from the Delta log (versions, files, statistics, our commit metadata), with no data read.
The newest snapshot of each table is kept per thread and brought up to date (``snapshot``).

The asset key path ``[layer, source, table]`` is the table's path under the warehouse.
"""

import json
import os
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

from cdc_platform.lake import arrow_files, delta_log, storage
from cdc_platform.lake import deletion_vectors as DV
from cdc_platform.lake.deletion_vectors import Descriptor

RAW = "raw"
CHANGELOG = "changelog"
CURRENT = "current"
QUARANTINE = "quarantine"
DDL = "ddl"
HISTORY = "history"
CONTROL = "control"
LAYERS = (RAW, CHANGELOG, CURRENT, QUARANTINE, HISTORY, DDL, CONTROL)
# Model tables live at <warehouse>/models/<name>, like their asset keys ["models", <name>].
MODELS = "models"
PARTITION_COLUMN = "ingest_date"
# Our bookkeeping rides in the commit metadata of the writes it describes (delta-rs rejects
# unknown table properties), so state and data change in one atomic commit.
STATE_KEY = "cdc.state"
# The properties of every table we create. Loading a snapshot replays the log's commits since
# its last checkpoint (about 0.3 ms each) and a micro-batch reads about 180 snapshots: at
# delta-rs's default interval of 100 commits that grew to 3 s a micro-batch before each
# checkpoint. 10 is Delta Lake's own default.
TABLE_PROPERTIES = {"delta.checkpointInterval": "10"}
# Rows per row group of a raw data file. Spark splits a file into tasks by row group, and a
# micro-batch's raw is one file of a few MB: at 64Ki rows a batch of 100,000 records had two
# row groups of unequal size, so at best one task read two thirds of it while a core idled.
RAW_ROW_GROUP_ROWS = 16 * 1024
# The column ``read(..., with_file=True)`` adds: the data file each row comes from.
FILE_COLUMN = DV.FILE
# The column ``read(..., with_position=True)`` adds: the row's position in its file.
ROW_COLUMN = DV.ROW


class TableRef(NamedTuple):
    """A table's identity: its layer, its source and, in the per-table layers (change log,
    current, history, DDL), its name. Its key path is both the Dagster asset key and the
    table's folder under the warehouse."""

    layer: str
    source: str
    table: str | None = None

    @property
    def key_path(self) -> list[str]:
        return [self.layer, self.source] + ([] if self.table is None else [self.table])

    def uri(self, warehouse: str) -> str:
        return storage.join(str(warehouse), *self.key_path)


def folders(location: str) -> list[str]:
    """The folders directly below ``location`` (none when it does not exist), by name."""
    fs, path = storage.filesystem(location)
    listed = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    names = (i.base_name for i in listed if i.type == pafs.FileType.Directory)
    return sorted(storage.join(location, n) for n in names)


def tables_under(warehouse: str, layer: str, source: str) -> list[str]:
    """URIs of the Delta tables of one source in one layer, by name."""
    return [u for u in folders(storage.join(str(warehouse), layer, source)) if exists(u)]


def open_table(uri: str, version: int | None = None) -> DeltaTable:
    """The table at ``uri`` (at ``version``; None: the newest) through the lake's storage."""
    return DeltaTable(uri, version=version, storage_options=storage.delta_options(uri))


def changelog_tables(warehouse: str, source: str) -> dict[str, str]:
    """The tables normalization has routed for ``source`` so far: change-log table name -> the
    qualified name its messages carry (``db[.schema].table``)."""
    found = {}
    for uri in tables_under(warehouse, CHANGELOG, source):
        name = storage.name(uri)
        found[name] = state(uri).qualified or name
    return found


@dataclass(frozen=True)
class TableState:
    """Our bookkeeping, recorded by the commit that changes a table (as ``cdc.state``); each
    layer fills its own fields."""

    key: list[str] | None = None  # change log, current, history: the primary key
    qualified: str | None = None  # change log: the table's name in its messages
    changelog_version: int | None = None  # current, history: the change-log version applied
    truncated_before: str | None = None  # current: the newest applied truncate's sequence
    rows: list[int] | None = None  # current: [live rows, tombstones]
    # history: the change log's truncates, [sequence, event time (epoch us), copies]
    truncates: list[list[Any]] | None = None
    # history: the newest change-log sequence applied, when every file had bounds for it
    newest_sequence: str | None = None
    model: str | None = None  # models: the model's name, its code version, its inputs' marks
    code_version: str | None = None
    inputs: dict[str, Any] | None = None

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None})

    @classmethod
    def from_json(cls, text: str) -> "TableState":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in json.loads(text).items() if k in names})


class ChangelogFacts(NamedTuple):
    """What normalization needs to know of a change-log table it appends to."""

    key: list[str]
    types: dict[str, str]  # image column -> Spark SQL type


def changelog_facts(warehouse: str, source: str) -> dict[str, ChangelogFacts]:
    """Key and image column types of ``source``'s change-log tables, by qualified name."""
    return {
        st.qualified: ChangelogFacts(st.key, image_types(uri))
        for uri in tables_under(warehouse, CHANGELOG, source)
        if (st := state(uri)).key is not None
    }


class _Snapshots(threading.local):
    """Per thread: the newest snapshot read of each table, with the stat of its commit file;
    the ``KEPT`` tables read last (a process that reads many, such as the tests, holds few)."""

    KEPT = 64

    def __init__(self) -> None:
        self.held: OrderedDict[str, tuple[DeltaTable, tuple]] = OrderedDict()

    def keep(self, uri: str, dt: DeltaTable, seen: tuple) -> None:
        self.held[uri] = (dt, seen)
        self.held.move_to_end(uri)
        while len(self.held) > self.KEPT:
            self.held.popitem(last=False)


_SNAPSHOTS = _Snapshots()


def _commit_stamp(uri: str, version: int) -> tuple:
    """What tells one commit file of the table from another of the same name (a table made
    anew): inode, modification time and size on disk; modification time and size in a store.
    OSError when the file is gone."""
    path = storage.join(uri, "_delta_log", f"{version:020d}.json")
    if not storage.is_remote(uri):
        st = os.stat(path)
        return st.st_ino, st.st_mtime_ns, st.st_size
    fs, key = storage.filesystem(path)
    info = fs.get_file_info(key)
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(path)
    return info.mtime_ns, info.size


def _still(uri: str, dt: DeltaTable, seen: tuple) -> bool:
    """Whether ``dt``'s commit is still in the table's log (not a table made anew since)."""
    try:
        return _commit_stamp(uri, dt.version()) == seen
    except OSError:
        return False


def snapshot(uri: str) -> DeltaTable:
    """The table's newest snapshot, for facts read from it at once. The one this thread read
    last, brought up to date with the commits since (``update_incremental`` reads just those:
    about 0.4 ms, where loading the last checkpoint and replaying the commits after it takes
    4-35 ms, and a micro-batch reads about 180 snapshots); loaded anew when its table was made
    anew since. Never held across another read of the table, nor committed against: the next
    read moves it."""
    held = _SNAPSHOTS.held.get(uri)
    dt = None
    if held is not None and _still(uri, *held):
        dt = held[0]
        try:
            dt.update_incremental()
        except Exception:  # the commits since are gone (log cleanup): load it anew
            dt = None
    if dt is None:
        dt = open_table(uri)
    try:
        _SNAPSHOTS.keep(uri, dt, _commit_stamp(uri, dt.version()))
    except OSError:
        _SNAPSHOTS.held.pop(uri, None)
    return dt


def _at(uri: str, version: int | None) -> DeltaTable:
    """The table at ``version`` (None: the newest), from the snapshot when it is that one."""
    dt = snapshot(uri)
    return dt if version is None or version == dt.version() else open_table(uri, version)


def exists(uri: str) -> bool:
    held = _SNAPSHOTS.held.get(uri)
    if held is not None and _still(uri, *held):
        return True
    return DeltaTable.is_deltatable(uri, storage_options=storage.delta_options(uri))


def version(uri: str) -> int | None:
    return snapshot(uri).version() if exists(uri) else None


def files(uri: str, at_version: int | None = None) -> list[str]:
    if not exists(uri):
        return []
    return _at(uri, at_version).file_uris()


def arrow_schema(uri: str) -> pa.Schema:
    return pa.schema(snapshot(uri).schema())


def add_actions(dt: DeltaTable) -> pa.Table:
    """The snapshot's data files: ``path`` (relative), ``size_bytes``, ``num_records``,
    ``partition.<col>``, ``min.<col>``/``max.<col>`` statistics."""
    return pa.table(dt.get_add_actions(flatten=True))


def local_path(name: str) -> str:
    """A data file's name as ``files`` gives it (a local absolute path, or its URI in a store)
    from any name of it (a ``file://`` URI)."""
    return name if storage.is_remote(name) else os.path.abspath(name.removeprefix("file://"))


def absolute_path(uri: str, relative: str) -> str:
    """A data file's name as ``files`` gives it from its path in the log (relative to the
    table)."""
    if storage.is_remote(uri):
        return storage.join(uri, unquote(relative))
    return os.path.join(os.path.abspath(uri), unquote(relative))


def deletion_vectors_of(uri: str, dt: DeltaTable | None = None) -> dict[str, Descriptor]:
    """The deletion vectors of the table's snapshot (or of ``dt``): each file that has one, by
    its path relative to the table (decoded), -> its descriptor. Empty for a table without
    the feature, with no read of the log."""
    dt = snapshot(uri) if dt is None else dt
    if DV.FEATURE not in (dt.protocol().reader_features or []):
        return {}
    found = delta_log.replay(uri, dt.version()).deletion_vectors()
    return {unquote(p): d for p, d in found.items()}


def read(
    spark: SparkSession,
    uri: str,
    only_files: list[str] | None = None,
    with_file: bool = False,
    with_position: bool = False,
    columns: list[str] | None = None,
) -> DataFrame | None:
    """The table's snapshot (or just ``only_files`` of it) as a Spark DataFrame, its live rows
    (those no deletion vector marks); None if absent. ``with_file``: also ``FILE_COLUMN``, the
    path (relative to the table) each row comes from; ``with_position``: also ``ROW_COLUMN``,
    the row's position in that file (what a deletion vector marks). ``columns``: only those of
    the table's columns (Arrow reads, unlike Spark's, read only what they are given)."""
    if not exists(uri):
        return None
    dt = snapshot(uri)
    arrow = pa.schema(dt.schema())
    if columns is not None:
        arrow = pa.schema([f for f in arrow if f.name in set(columns)])
    paths = dt.file_uris() if only_files is None else only_files
    if not paths:
        empty = spark.createDataFrame([], from_arrow_schema(arrow))
        extra = [FILE_COLUMN] * with_file + [ROW_COLUMN] * with_position
        types = {FILE_COLUMN: "string", ROW_COLUMN: "bigint"}
        return empty.select("*", *[F.lit(None).cast(types[c]).alias(c) for c in extra])
    files = _Files(uri, dt, arrow, with_file, with_position)
    dvs = deletion_vectors_of(uri, dt)
    if dvs:
        names = {p: storage.relative(local_path(p), uri) for p in paths}
        marked = [p for p in paths if names[p] in dvs]
        plain = [p for p in paths if names[p] not in dvs]
        if marked:
            out = files.through_arrow(spark, marked, [dvs[names[p]] for p in marked])
            return out.unionByName(files.read(spark, plain)) if plain else out
    return files.read(spark, paths)


@dataclass(frozen=True)
class _Files:
    """How ``read`` reads data files of a snapshot: with which columns, and which of its own."""

    uri: str
    dt: DeltaTable
    schema: pa.Schema
    with_file: bool
    with_position: bool

    def read(self, spark: SparkSession, paths: list[str]) -> DataFrame:
        """``paths`` (no deletion vector marks a row of them) read whole."""
        if storage.is_remote(self.uri):
            return self.through_arrow(spark, paths)
        # Read with the table's schema, not one merged from the files' footers (a round trip
        # that opens them, half of a small read's time): a file written before a column was
        # added reads it as null, and the partition values in the paths get the schema's types.
        # Spark puts the partition columns last: the select restores the table's order.
        table = from_arrow_schema(pa.schema(self.dt.schema()))
        df = spark.read.schema(table).option("basePath", self.uri).parquet(*paths)
        columns = [F.col(f"`{f.name}`") for f in self.schema]
        if self.with_file:
            # Spark gives a file:// URI; the log holds paths relative to the table.
            root = "file:" + os.path.abspath(self.uri) + "/"
            relative = F.regexp_replace(F.col("_metadata.file_path"), "^file:(//)?", "file:")
            name = F.url_decode(F.replace(relative, F.lit(root), F.lit("")))
            columns.append(name.alias(FILE_COLUMN))
        if self.with_position:
            columns.append(F.col("_metadata.row_index").alias(ROW_COLUMN))
        return df.select(*columns)

    def through_arrow(
        self, spark: SparkSession, paths: list[str], deleted: list[Descriptor] | None = None
    ) -> DataFrame:
        """``paths`` read through pyarrow in the executors (``arrow_files``): a bucket's files,
        and files whose deletion vectors leave rows out."""
        names = [storage.relative(local_path(p), self.uri) for p in paths]
        actions = add_actions(self.dt).select(["path", "size_bytes"]).to_pylist()
        size = {unquote(a["path"]): a["size_bytes"] for a in actions}
        return arrow_files.read(
            spark, self.uri, names, self.schema, self.dt.metadata().partition_columns,
            FILE_COLUMN if self.with_file else None, sizes=[size.get(n, 0) for n in names],
            deleted=deleted, position_column=ROW_COLUMN if self.with_position else None,
        )  # fmt: skip


def read_arrow(uri: str, columns: list[str] | None = None) -> pa.Table | None:
    """The table's snapshot as Arrow, without Spark (small tables: tests, previews); None if
    absent."""
    if not exists(uri):
        return None
    dt = snapshot(uri)
    if DV.FEATURE not in (dt.protocol().reader_features or []):
        return dt.to_pyarrow_table(columns=columns)
    # delta-rs's own Arrow conversions refuse a table with deletion vectors; its query engine
    # applies them.
    chosen = ", ".join(quoted(c) for c in columns) if columns else "*"
    table = pa.table(QueryBuilder().register("t", dt).execute(f"SELECT {chosen} FROM t"))
    schema = pa.schema(dt.schema())
    return table.cast(pa.schema([schema.field(n) for n in table.column_names]))


def head(
    uri: str, only_files: list[str], rows: int, where: pc.Expression | None = None
) -> pa.Table:
    """The first ``rows`` rows (of those ``where`` holds) of the data files ``only_files`` (as
    ``files`` names them), in their order, read with Arrow and not Spark: a preview of what a
    commit wrote, a few rows of a few files, costs no Spark job. Read with the table's schema
    (a column a file lacks is null); partition values from the paths."""
    dt = snapshot(uri)
    schema = pa.schema(dt.schema())
    columns = set(dt.metadata().partition_columns)
    partitioning = ds.partitioning(
        pa.schema([f for f in schema if f.name in columns]), flavor="hive"
    )
    fs, base = storage.filesystem(uri)
    relative = [storage.relative(local_path(f), uri) for f in only_files]

    def dataset(names: list[str]) -> ds.Dataset:
        return ds.dataset(
            [f"{base}/{n}" for n in names], schema=schema, format="parquet", filesystem=fs,
            partitioning=partitioning, partition_base_dir=base,
        )  # fmt: skip

    dvs = deletion_vectors_of(uri, dt)
    if not any(n in dvs for n in relative):
        return dataset(relative).head(rows, filter=where)
    # File by file, each file's deleted rows left out before ``where``.
    found, left = [], rows
    for name in relative:
        table = dataset([name]).to_table()
        if name in dvs:
            deleted = DV.read(uri, dvs[name])
            table = table.filter(pa.array(DV.keep_mask(deleted, table.num_rows)))
        if where is not None:
            table = table.filter(where)
        found.append(table.slice(0, left))
        left -= found[-1].num_rows
        if left <= 0:
            break
    return pa.concat_tables(found) if found else schema.empty_table()


def state(uri: str) -> TableState:
    """The newest ``cdc.state`` commit metadata of a table (empty if none).

    Read from the newest commits back, a few at a time: the state rides in nearly every commit,
    and a table gains commits all day (a run adds some), so reading its whole history would
    cost more with every run."""
    if not exists(uri):
        return TableState()
    dt, limit = snapshot(uri), 4
    while True:
        commits = dt.history(limit)
        for commit in commits:
            if STATE_KEY in commit:
                return TableState.from_json(commit[STATE_KEY])
        if len(commits) < limit:
            return TableState()
        limit *= 16


def image_types(uri: str) -> dict[str, str]:
    """Spark SQL types of a change-log table's image columns (its ``after`` struct)."""
    after = arrow_schema(uri).field("after").type
    return {f.name: from_arrow_type(f.type).simpleString() for f in after}


def describe(uri: str) -> dict[str, Any]:
    """Version, file count and Arrow schema of a table, for materialization metadata."""
    dt = snapshot(uri)
    return {"version": dt.version(), "files": len(dt.file_uris()), "schema": pa.schema(dt.schema())}


def quoted(name: str) -> str:
    """A column name quoted for delta-rs predicates."""
    return '"' + name.replace('"', '""') + '"'


# --- what changed between versions ---


def files_between(uri: str, after: int | None, upto: int) -> list[str]:
    """Files of version ``upto`` that version ``after`` did not have (all when ``after`` is
    None). Raw is append-only for Kafka sources, so these are the batches in between."""
    files_upto = files(uri, upto)
    if after is None:
        return files_upto
    before = set(files(uri, after))
    return [f for f in files_upto if f not in before]


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
    if any(not storage.is_remote(f) and not os.path.exists(f) for f in removed):
        return None
    return removed


# --- statistics ---


def max_stat(uri: str, column: str, at_version: int | None = None) -> Any:
    """The largest value of ``column`` from the files' statistics (no data read); None when the
    table is absent or empty, or no file has statistics for it."""
    if not exists(uri):
        return None
    actions = add_actions(_at(uri, at_version))
    name = f"max.{column}"
    return pc.max(actions[name]).as_py() if name in actions.column_names else None


def _only(uri: str, actions: pa.Table, files: list[str]) -> pa.Table:
    """The add actions of ``files`` (as ``files`` names them)."""
    wanted = {local_path(f) for f in files}
    paths = [absolute_path(uri, p) for p in actions["path"].to_pylist()]
    return actions.filter(pa.array([p in wanted for p in paths], pa.bool_()))


def stat_range(uri: str, column: str, files: list[str] | None = None) -> tuple[Any, Any] | None:
    """The smallest and largest value of ``column`` over the snapshot's data files (or just
    ``files``, as ``files`` names them), from their statistics (no data read); None when the
    table is absent or empty, or one of those files has no bounds for it."""
    if not exists(uri):
        return None
    actions = add_actions(snapshot(uri))
    low, high = f"min.{column}", f"max.{column}"
    if not {low, high} <= set(actions.column_names):
        return None
    if files is not None:
        actions = _only(uri, actions, files)
    if actions.num_rows == 0 or actions[low].null_count or actions[high].null_count:
        return None
    return pc.min(actions[low]).as_py(), pc.max(actions[high]).as_py()


def key_span(uri: str, files: list[str], column: str) -> tuple[Any, Any] | None:
    """The smallest and largest value of key column ``column`` that change-log ``files`` (as
    ``files`` names them) touch: in ``key``, and in ``before`` (a key change moves away from the
    before image's key), from their statistics (no data read). None when a file has values of
    one of them without bounds, none of them has a value, or their bounds do not compare."""
    if not files:
        return None
    chosen = _only(uri, add_actions(snapshot(uri)), files)
    if chosen.num_rows < len({local_path(f) for f in files}):
        return None
    rows = chosen["num_records"].to_pylist()
    lows, highs = [], []
    for field in (f"key.{column}", f"before.{column}"):
        names = [f"min.{field}", f"max.{field}", f"null_count.{field}"]
        if not set(names) <= set(chosen.column_names):
            return None
        for n, lo, hi, nulls in zip(rows, *(chosen[c].to_pylist() for c in names), strict=True):
            if nulls is not None and nulls == n:
                continue  # no value of it in this file
            if lo is None or hi is None:
                return None
            lows.append(lo)
            highs.append(hi)
    try:
        return (min(lows), max(highs)) if lows else None
    except TypeError:  # files whose key has another type (the column's type changed)
        return None


def may_hold_nulls(uri: str, column: str, files: list[str] | None = None) -> bool:
    """Whether a data file of the snapshot (or of ``files``, as ``files`` names them) may hold
    a null in ``column`` (``a.b``: field ``b`` of struct ``a``): False only when every one's
    statistics count none. From the log alone."""
    if not exists(uri):
        return False
    actions = add_actions(snapshot(uri))
    nulls = f"null_count.{column}"
    if nulls not in actions.column_names:
        return actions.num_rows > 0
    counts = actions[nulls].to_pylist()
    if files is not None:
        wanted = {local_path(f) for f in files}
        paths = [absolute_path(uri, p) for p in actions["path"].to_pylist()]
        counts = [n for p, n in zip(paths, counts, strict=True) if p in wanted]
    return any(n is None or n > 0 for n in counts)


def may_hold_truncates(uri: str, key: list[str], files: list[str] | None = None) -> bool:
    """Whether files of change log ``uri`` (``may_hold_nulls``' ``files``) may hold a truncate:
    a truncate has no key, so files whose statistics count no null key hold none."""
    return may_hold_nulls(uri, f"key.{key[0]}", files)


def row_count(uri: str, only_files: list[str] | None = None) -> int:
    """Rows in the table's snapshot (or in ``only_files`` of it, as ``files`` names them), from
    the file statistics (reads no data)."""
    if not exists(uri):
        return 0
    dt = snapshot(uri)
    actions = add_actions(dt)
    counts = _live_counts(uri, dt, actions)
    if only_files is not None:
        wanted = {local_path(f) for f in only_files}
        paths = [absolute_path(uri, p) for p in actions["path"].to_pylist()]
        counts = [n for p, n in zip(paths, counts, strict=True) if p in wanted]
    return int(sum(counts))


def partition_row_counts(uri: str) -> dict[str, int]:
    """Rows per ``ingest_date`` partition of the table's snapshot (ISO date -> rows), from the
    file statistics (reads no data); empty when the table does not exist."""
    if not exists(uri):
        return {}
    dt = snapshot(uri)
    actions = add_actions(dt)
    dates = actions[f"partition.{PARTITION_COLUMN}"].to_pylist()
    counts: dict[str, int] = {}
    for date, rows in zip(dates, _live_counts(uri, dt, actions), strict=True):
        counts[str(date)] = counts.get(str(date), 0) + int(rows)
    return counts


def _live_counts(uri: str, dt: DeltaTable, actions: pa.Table) -> list[int]:
    """Each file's live rows (``actions``' order): its ``numRecords`` less its deletion
    vector's cardinality."""
    counts = [n or 0 for n in actions["num_records"].to_pylist()]
    dvs = deletion_vectors_of(uri, dt)
    if not dvs:
        return counts
    paths = [unquote(p) for p in actions["path"].to_pylist()]
    return [n - (dvs[p].cardinality if p in dvs else 0) for p, n in zip(paths, counts, strict=True)]
