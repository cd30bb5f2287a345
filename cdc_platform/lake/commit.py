"""The commit protocol: Spark's executors write the data files (``lake.data_files``), the
driver commits them to the Delta log with delta-rs, in one atomic commit with what describes
them: removes of the files they replace, our ``cdc.state`` metadata, and the transaction ids
(``txn``) that make reruns skip what is done.

A commit is made against the version its inputs were read at; when another writer committed
since, delta-rs's conflict check fails it (it removed a file we remove, or set a transaction
id we set) rather than lose or double an update, and the written files are discarded. A
blind append (no file removed) commits over another writer's, so a step that counts from the
table's state holds a ``Pin``: its commits carry a transaction id of their own.

Schema changes go first, in commits of their own: a new column (nested ones too) is added to
the table's schema; a wider type (int -> bigint, more decimal digits) rewrites the table with
it. Both leave the rows as they are, so a crash after them loses nothing.
"""

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Schema, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type, to_arrow_schema

from cdc_platform.formats.column_specs import common_type
from cdc_platform.lake import data_files, deletion_vectors, delta_log, storage
from cdc_platform.lake.deletion_vectors import Descriptor
from cdc_platform.lake.tables import (
    PARTITION_COLUMN,
    STATE_KEY,
    TABLE_PROPERTIES,
    TableState,
    add_actions,
    exists,
    open_table,
    read,
    snapshot,
)

# Delta transaction identifier of every table a normalize step writes: its version is the raw
# table version the output reflects, so an appending rerun after a crash skips what is done.
NORMALIZED_APP = "cdc.normalize"
# Delta transaction identifier of every commit made under a ``Pin``: delta-rs's conflict check
# fails a commit when a winning commit since its read version carries an id it carries too, so
# two pinned writers of one table can never both commit from the same version.
PINNED_APP = "cdc.pinned"


class TableMoved(CommitFailedError):
    """Another writer committed to a table since a step read what it decides from (``Pin``):
    the step commits nothing more and runs again (a transient failure, as a lost race is)."""


@dataclass
class Pin:
    """The version of a table a step read its state at (its live-row counts, what it applied),
    moved on by the step's own commits only. Each write of the step checks it before reading,
    and commits against it with ``PINNED_APP``: a commit of anyone else in between fails the
    step with ``TableMoved``, instead of letting it record counts taken from a stale version."""

    uri: str
    version: int

    def check(self, version: int) -> None:
        if version != self.version:
            raise TableMoved(
                f"{self.uri} moved from version {self.version} to {version} under this step"
            )


def properties(
    state: TableState | None = None, txns: dict[str, int] | None = None, pinned: bool = False
) -> CommitProperties | None:
    """Commit properties: ``state`` as ``cdc.state``, and transaction ids (``PINNED_APP`` too,
    when ``pinned``)."""
    custom = {STATE_KEY: state.to_json()} if state is not None else None
    txns = {**(txns or {}), **({PINNED_APP: 0} if pinned else {})}
    transactions = [Transaction(app, v) for app, v in sorted(txns.items())]
    if not custom and not transactions:
        return None
    return CommitProperties(custom_metadata=custom, app_transactions=transactions or None)


def commit(
    uri: str,
    adds: list[AddAction],
    removes: list[RemoveAction] | None = None,
    *,
    schema: pa.Schema | None = None,
    partition_by: list[str] | None = None,
    read_version: int | None = None,
    props: CommitProperties | None = None,
    replace: bool = False,
    pin: Pin | None = None,
    marked: dict[str, Descriptor] | None = None,
) -> int:
    """Commit written files: create the table (``schema``), or add (and remove) files against
    ``read_version`` (the newest when None), or ``replace`` every file and the schema. The
    written files are deleted when the commit fails. Returns the new version.

    ``marked``: files (paths relative to the table, decoded) given a new deletion vector, the
    table made able to hold them if it is not yet. A table with deletion vectors is committed to
    by ``delta_log`` (delta-rs's actions cannot carry them), every remove with its file's DV.

    ``pin``: a commit of the step holding it, against its version (``props`` made with
    ``pinned``); the pin moves to the version committed."""
    if pin is not None:
        pin.check(read_version)
    try:
        if not exists(uri) or replace:
            create_table_with_add_actions(
                uri, Schema.from_arrow(schema), adds, mode="overwrite" if replace else "error",
                partition_by=partition_by or None, configuration=TABLE_PROPERTIES,
                storage_options=storage.delta_options(uri), commit_properties=props,
            )  # fmt: skip
        else:
            dt = open_table(uri, read_version)
            if marked or deletion_vectors.FEATURE in (dt.protocol().reader_features or []):
                _commit_keeping_dvs(uri, dt, adds, removes or [], marked or {}, props)
            else:
                dt.create_write_transaction(
                    [*(removes or []), *adds], mode="append", schema=dt.schema(),
                    partition_by=dt.metadata().partition_columns, commit_properties=props,
                )  # fmt: skip
    except BaseException:
        data_files.discard(uri, adds)
        raise
    if pin is not None:
        # Ours is the next version: any pinned commit since the read would have failed it. A
        # commit of another kind in between leaves the pin behind, and the next check fails.
        pin.version = read_version + 1
    return snapshot(uri).version()


def _commit_keeping_dvs(
    uri: str,
    dt: DeltaTable,
    adds: list[AddAction],
    removes: list[RemoveAction],
    marked: dict[str, Descriptor],
    props: CommitProperties | None,
) -> None:
    """``commit``'s commit through ``delta_log``: each file of ``marked`` removed with its old
    DV and added with its new one (only removed when every row is marked)."""
    r = delta_log.replay(uri, dt.version())
    live = {unquote(p): a for p, a in r.adds.items()}
    now = int(time.time() * 1000)
    actions = delta_log.enabling(r) if marked else []
    actions += [delta_log.remove_of(live[unquote(x.path)], now) for x in removes]
    for path, dv in sorted(marked.items()):
        add = live[path]
        actions.append(delta_log.remove_of(add, now))
        physical = json.loads(add.get("stats") or "{}").get("numRecords")
        if physical is None or dv.cardinality < physical:  # else the file has no row left
            actions.append(delta_log.with_deletion_vector(add, dv))
    for a in adds:
        actions.append(
            {"add": {
                "path": a.path, "partitionValues": a.partition_values, "size": a.size,
                "modificationTime": a.modification_time, "dataChange": a.data_change,
                "stats": a.stats,
            }}
        )  # fmt: skip
    custom = props.custom_metadata if props else None
    txns = {t.app_id: t.version for t in (props.app_transactions or [])} if props else None
    operation = "MERGE" if marked else "WRITE"
    delta_log.commit(uri, dt.version(), actions, operation=operation, custom=custom, txns=txns)


def record_state(uri: str, state: TableState, pin: Pin | None = None) -> int:
    """A commit of ``state`` alone (a step that changed no row still records what it read)."""
    read_version = None if pin is None else pin.version
    props = properties(state, pinned=pin is not None)
    return commit(uri, [], read_version=read_version, props=props, pin=pin)


# --- schemas ---


def nullable(schema: pa.Schema | pa.DataType) -> Any:
    """Every field nullable, nested ones too: a table declares no NOT NULL constraint."""
    if isinstance(schema, pa.Schema):
        return pa.schema([f.with_nullable(True).with_type(nullable(f.type)) for f in schema])
    if pa.types.is_struct(schema):
        return pa.struct([f.with_nullable(True).with_type(nullable(f.type)) for f in schema])
    return schema


def arrow_of(df: DataFrame | T.StructType) -> pa.Schema:
    """The Delta-ready Arrow schema of a DataFrame, or of a Spark schema (timestamps in UTC
    microseconds)."""
    schema = df if isinstance(df, T.StructType) else df.schema
    return nullable(to_arrow_schema(schema, timezone="UTC"))


def _arrow_type(sql_type: str) -> pa.DataType:
    """Arrow type of a type widening can produce (see ``column_specs.common_type``)."""
    if m := re.fullmatch(r"decimal\((\d+),(\d+)\)", sql_type):
        return pa.decimal128(int(m[1]), int(m[2]))
    named = {"smallint": pa.int16(), "int": pa.int32(), "bigint": pa.int64()}
    return {**named, "double": pa.float64(), "timestamp": pa.timestamp("us", tz="UTC")}[sql_type]


def _fields(t: pa.Schema | pa.DataType) -> list[pa.Field]:
    return list(t) if isinstance(t, pa.Schema) or pa.types.is_struct(t) else []


def _evolved(table: Any, incoming: Any, *, widen: bool, add: bool) -> Any:
    """``table`` with each column widened to hold ``incoming``'s type (``widen``), and with
    ``incoming``'s columns it lacks appended (``add``), nested in structs too."""
    if isinstance(table, pa.Schema) or pa.types.is_struct(table):
        theirs = {f.name: f.type for f in _fields(incoming)}
        ours = {f.name for f in table}
        fields = [
            f.with_type(_evolved(f.type, theirs[f.name], widen=widen, add=add))
            if f.name in theirs
            else f
            for f in table
        ]
        if add:
            fields += [f for f in _fields(incoming) if f.name not in ours]
        return pa.schema(fields) if isinstance(table, pa.Schema) else pa.struct(fields)
    if not widen or table == incoming or pa.types.is_struct(incoming):
        return table
    try:
        old, new = from_arrow_type(table).simpleString(), from_arrow_type(incoming).simpleString()
    except (TypeError, ValueError):  # a type Spark has no name for is never widened
        return table
    common = common_type(old, new)
    return table if common in (None, old) else _arrow_type(common)


def evolve(spark: SparkSession, uri: str, incoming: pa.Schema, pin: Pin | None = None) -> pa.Schema:
    """Make the table's schema hold ``incoming`` (see the module's doc); returns the schema the
    written files must have. A table that does not exist yet takes ``incoming``. ``pin``: the
    table is at its version, and moves it with each schema commit."""
    if not exists(uri):
        return nullable(incoming)
    dt = open_table(uri)
    if pin is not None:
        pin.check(dt.version())
    schema = pa.schema(dt.schema())
    widened = _evolved(schema, incoming, widen=True, add=False)
    if not widened.equals(schema):
        _rewrite_as(spark, uri, dt, nullable(widened))
        schema = widened
        if pin is not None:  # committed against the pinned version, or failed
            pin.version += 1
    merged = nullable(_evolved(schema, incoming, widen=False, add=True))
    if not merged.equals(schema):
        # A commit of the schema alone: delta-rs merges it with no data file written (against
        # the newest version: another writer's commit before it leaves the pin behind).
        write_deltalake(
            uri, merged.empty_table(), mode="append", schema_mode="merge",
            storage_options=storage.delta_options(uri),
        )  # fmt: skip
        if pin is not None:
            pin.version += 1
    return merged


def _rewrite_as(spark: SparkSession, uri: str, dt: DeltaTable, schema: pa.Schema) -> None:
    """Rewrite every file of the table with the (wider) ``schema``, in one commit."""
    partition_by = dt.metadata().partition_columns
    adds = data_files.write(conform(read(spark, uri), schema), uri, partition_by)
    # An overwrite removes every file the snapshot has.
    dt.create_write_transaction(
        adds, mode="overwrite", schema=Schema.from_arrow(schema), partition_by=partition_by
    )


def conform(df: DataFrame, schema: pa.Schema) -> DataFrame:
    """``df`` with the columns of ``schema``, by name, in its order and types (absent ones
    null), nested struct fields too: the files of a table all look alike."""
    target = from_arrow_schema(schema)
    have = {f.name: f.dataType for f in df.schema.fields}
    return df.select(
        *[
            _conformed(F.col(f"`{f.name}`"), have[f.name], f.dataType).alias(f.name)
            if f.name in have
            else F.lit(None).cast(f.dataType).alias(f.name)
            for f in target.fields
        ]
    )


def _same(a: T.DataType, b: T.DataType) -> bool:
    """Equal types, nullability aside."""
    if isinstance(a, T.StructType) and isinstance(b, T.StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name == y.name and _same(x.dataType, y.dataType)
            for x, y in zip(a.fields, b.fields, strict=True)
        )
    return a.simpleString() == b.simpleString()


def _conformed(col: Column, have: T.DataType, want: T.DataType) -> Column:
    if _same(have, want):
        return col
    if isinstance(have, T.StructType) and isinstance(want, T.StructType):
        theirs = {f.name: f.dataType for f in have.fields}
        fields = [
            _conformed(col[f.name], theirs[f.name], f.dataType).alias(f.name)
            if f.name in theirs
            else F.lit(None).cast(f.dataType).alias(f.name)
            for f in want.fields
        ]
        return F.when(col.isNotNull(), F.struct(*fields))
    return col.cast(want)


# --- writes ---


def append(
    df: DataFrame,
    uri: str,
    *,
    partition_by: list[str] | None = None,
    read_version: int | None = None,
    props: CommitProperties | None = None,
    verify: Callable[[], None] | None = None,
    empty: bool = False,
) -> int:
    """Append ``df``'s rows (a new table is partitioned by ``partition_by``). ``verify``: called
    after the write, before the commit (``written``). ``empty``: the caller knows ``df`` has
    no rows: nothing is written (a new table is created empty), with no Spark job."""
    schema = evolve(df.sparkSession, uri, arrow_of(df))
    if exists(uri):
        partition_by = snapshot(uri).metadata().partition_columns
    adds = [] if empty else written(conform(df, schema), uri, partition_by, verify)
    return commit(
        uri, adds, schema=schema, partition_by=partition_by, read_version=read_version,
        props=props,
    )  # fmt: skip


def overwrite_partitions(
    df: DataFrame,
    uri: str,
    dates: list[str],
    state: TableState | None = None,
    raw_version: int | None = None,
    *,
    empty: bool = False,
    verify: Callable[[], None] | None = None,
) -> int:
    """Replace the ``ingest_date`` partitions ``dates`` with ``df``'s rows: reruns are
    idempotent. ``raw_version``: the raw table version the data was derived from, recorded in
    the same commit as the ``cdc.normalize`` transaction (see ``normalized_raw_version``).
    ``empty``: the caller knows ``df`` has no rows; the commit then only removes, with no Spark
    job. ``verify``: as ``written``'s."""
    txns = {NORMALIZED_APP: raw_version} if raw_version is not None else None
    props = properties(state, txns)
    schema = evolve(df.sparkSession, uri, arrow_of(df))
    dt = snapshot(uri) if exists(uri) else None
    read_version = None if dt is None else dt.version()
    removes = []
    if dt is not None:
        actions = add_actions(dt)
        column = f"partition.{PARTITION_COLUMN}"
        wanted = set(dates)
        if actions.num_rows:
            paths = {
                p
                for p, d in zip(
                    actions["path"].to_pylist(), actions[column].to_pylist(), strict=True
                )
                if d is not None and str(d) in wanted
            }
            removes = data_files.removes(actions, paths)
    adds = [] if empty else written(conform(df, schema), uri, [PARTITION_COLUMN], verify)
    return commit(
        uri, adds, removes, schema=schema, partition_by=[PARTITION_COLUMN],
        read_version=read_version, props=props,
    )  # fmt: skip


def normalized_raw_version(uri: str) -> int | None:
    """The raw version a normalize output reflects (None: none recorded, or no table)."""
    return snapshot(uri).transaction_version(NORMALIZED_APP) if exists(uri) else None


def append_normalized(
    df: DataFrame,
    uri: str,
    raw_version: int,
    state: TableState | None = None,
    *,
    empty: bool = False,
    verify: Callable[[], None] | None = None,
) -> int | None:
    """Append ``df``'s rows derived from raw up to ``raw_version``, unless the table already
    reflects that version (a rerun after a crash between outputs): None then. The commit is
    made against the version read, so a racing run that appended the same batch makes this
    one fail. ``empty``: the caller knows ``df`` has no rows; the commit then records the raw
    version alone (a new table is created empty), with no Spark job. ``verify``: as
    ``written``'s."""
    read_version = None
    if exists(uri):
        dt = snapshot(uri)
        done = dt.transaction_version(NORMALIZED_APP)
        if done is not None and done >= raw_version:
            return None
        read_version = dt.version()
    props = properties(state, {NORMALIZED_APP: raw_version})
    if empty and read_version is not None:
        return commit(uri, [], read_version=read_version, props=props)
    return append(
        df, uri, partition_by=[PARTITION_COLUMN], read_version=read_version, props=props,
        verify=verify, empty=empty,
    )  # fmt: skip


def written(
    df: DataFrame,
    uri: str,
    partition_by: list[str] | None,
    verify: Callable[[], None] | None = None,
) -> list[AddAction]:
    """``df`` written into the table's folder (``data_files.write``), not committed yet. Then
    ``verify`` is called: when it raises (what was written must not be committed), the files
    are deleted and the error goes on."""
    adds = data_files.write(df, uri, partition_by)
    if verify is not None:
        try:
            verify()
        except BaseException:
            data_files.discard(uri, adds)
            raise
    return adds


# A current table's files hold about this many rows, sorted by key, so a merge rewrites only
# the files whose key range (min/max statistics) holds a key it changes.
ROWS_PER_FILE = 500_000


def replace(
    df: DataFrame,
    uri: str,
    state: TableState,
    key: list[str] | None = None,
    partition_by: list[str] | None = None,
    rows: int | None = None,
) -> int:
    """Replace the whole table, schema and partitioning included (a new version: time travel
    still reaches the old one). With ``key`` (a current table) the rows are written sorted by
    it, ``rows`` (when known) sizing the files."""
    schema = arrow_of(df)
    out = conform(df, schema)
    if key:
        out = sorted_by_key(out, key, rows)
    adds = data_files.write(out, uri, partition_by, ROWS_PER_FILE if key else None)
    return commit(
        uri, adds, schema=schema, partition_by=partition_by, props=properties(state),
        replace=exists(uri),
    )  # fmt: skip


def sorted_by_key(df: DataFrame, key: list[str], rows: int | None) -> DataFrame:
    """``df`` range-partitioned and sorted by ``key``: each file holds one key range. Rows for
    one file are sorted in one task, with no shuffle (a Spark job of its own): every caller's
    ``df`` is persisted, so the task reads it as computed."""
    parts = max(1, -(-rows // ROWS_PER_FILE)) if rows is not None else None
    if parts == 1:
        return df.coalesce(1).sortWithinPartitions(*key)
    ranged = df.repartitionByRange(parts, *key) if parts else df.repartitionByRange(*key)
    return ranged.sortWithinPartitions(*key)


def upgrade_properties(uri: str) -> bool:
    """Give a table that an older release created our ``TABLE_PROPERTIES`` (its checkpoint
    interval); True when it lacked them. A commit of its own: a step holding a ``Pin`` on the
    table meanwhile fails with ``TableMoved`` and runs again."""
    dt = open_table(uri)
    have = dt.metadata().configuration
    missing = {k: v for k, v in TABLE_PROPERTIES.items() if have.get(k) != v}
    if missing:
        dt.alter.set_table_properties(missing)
    return bool(missing)
