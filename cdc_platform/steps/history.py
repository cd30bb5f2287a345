"""History step: change log -> SCD type 2 history, recomputing the keys the change log's new or
removed files touch."""

from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

from deltalake.exceptions import CommitFailedError
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_platform import lake
from cdc_platform.catalog import TableConfig
from cdc_platform.spark import history
from cdc_platform.spark.session import PERSIST_LEVEL
from cdc_platform.timings import phase

_ATTEMPTS = 3


@dataclass
class HistoryResult:
    uri: str  # the history table's
    versions_written: int  # history rows inserted or changed
    versions_removed: int  # history rows deleted (a recomputed key no longer has them)
    rows: int  # rows in the history table
    version: int | None  # the history table's Delta version
    changelog_version: int | None  # the change-log version the history reflects


def update_history(
    spark: SparkSession,
    warehouse: str,
    source: str,
    table: TableConfig,
    full_refresh: bool = False,
) -> HistoryResult:
    """Bring ``history/<source>/<table>`` (SCD type 2) up to date with the change log.

    The keys that the change-log files added or removed since the last run touch get their whole
    history recomputed from the whole change log, and their rows replaced in one commit that also
    records the change-log version: reruns, late and shuffled partitions all converge on the
    history of one in-order replay. When every added change is newer than every change applied
    (``newest_sequence`` in the state, from file statistics) and none was removed, as in live
    operation, their open versions stand in for the old changes (``_extended``): a run then
    reads its batch and those keys' history rows, not the whole change log. When the change
    log's truncates change (one came or went), or with ``full_refresh``, every key is
    recomputed. The history's state counts the truncates, updated from the changed files alone.
    """
    for attempt in range(_ATTEMPTS):
        try:
            return _update(spark, warehouse, source, table, full_refresh)
        except (CommitFailedError, _Moved):  # another commit came first, or a column was added
            if attempt == _ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


class _Moved(Exception):
    """The history table moved while a run read it: the run starts anew."""


def _update(
    spark: SparkSession, warehouse: str, source: str, table: TableConfig, full_refresh: bool
) -> HistoryResult:
    cl_uri = lake.TableRef(lake.CHANGELOG, source, table.name).uri(warehouse)
    h_uri = lake.TableRef(lake.HISTORY, source, table.name).uri(warehouse)
    cl_version = lake.version(cl_uri)
    if cl_version is None:
        return HistoryResult(h_uri, 0, 0, lake.row_count(h_uri), lake.version(h_uri), None)
    key = lake.state(cl_uri).key
    state = lake.TableState() if full_refresh else lake.state(h_uri)
    applied = state.changelog_version
    if applied == cl_version:
        return HistoryResult(h_uri, 0, 0, lake.row_count(h_uri), lake.version(h_uri), cl_version)
    tracked = table.tracked_columns([c for c in lake.image_types(cl_uri) if c not in key])
    changes = _changes_since(spark, cl_uri, applied, state)
    if changes is None:  # first run, full refresh, or old files vacuumed: count them all
        counts = Counter()
        if lake.may_hold_truncates(cl_uri, key):
            counts = history.truncate_counts(lake.read(spark, cl_uri))
    else:
        counts = _recorded_truncates(state)
        if changes.gone is not None or lake.may_hold_truncates(cl_uri, key, changes.added_files):
            counts.update(history.truncate_counts(changes.added, changes.gone))
    truncates = history.truncates_of(counts)
    bounds = lake.stat_range(cl_uri, "sequence")
    new_state = lake.TableState(
        key=key,
        changelog_version=cl_version,
        truncates=[[seq, us, n] for (seq, us), n in sorted(counts.items()) if n > 0],
        newest_sequence=bounds[1] if bounds else None,
    )
    if changes is None or truncates != history.truncates_of(_recorded_truncates(state)):
        changelog = lake.read(spark, cl_uri)
        # Every key is recomputed (a truncate that came or went can change any key).
        rows = history.history_rows(
            changelog, key, tracked, table.ignore_null_updates, truncates=truncates
        ).persist(PERSIST_LEVEL)
        try:
            written = rows.count()
            removed = lake.row_count(h_uri)
            # Sorted by key, as a merge's rewrites keep it: a key's rows are in few files.
            lake.replace(rows, h_uri, new_state, key=key, rows=written)
        finally:
            rows.unpersist()
        return HistoryResult(h_uri, written, removed, written, lake.version(h_uri), cl_version)
    added, gone = changes.added, changes.gone
    touched = added if gone is None else added.unionByName(gone)
    affected = history.touched_keys(touched, key)
    # The touched keys' rows, with their files, read by every step below: only the files whose
    # key range may hold one are read, so a run costs what its batch touches, not the history.
    columns = [c for c in lake.arrow_schema(h_uri).names if c not in key]
    keys = affected.select("key.*")
    span = lake.key_span(cl_uri, changes.added_files, key[0]) if gone is None else None
    known = lake.candidates(spark, h_uri, keys, key, span)
    few = lake.row_count(cl_uri, changes.added_files) <= lake.BROADCAST_ROWS and gone is None
    old = lake.rows_of_keys(spark, h_uri, keys, key, columns, known, few)
    if lake.version(h_uri) != known.version:
        # Read at a later version than the files were found at: what the rewrite removes and
        # commits against must be the version read.
        raise _Moved(h_uri)
    old = old.persist(PERSIST_LEVEL)
    compared = None
    try:
        old_rows = old.drop(lake.FILE_COLUMN)
        if _in_order(cl_uri, changes, state):
            # Every new change is newer than every change applied: the keys' open versions
            # stand in for their old changes, and the whole change log is not read.
            new = _extended(old_rows, added, key, tracked, table.ignore_null_updates, truncates)
        else:
            changelog = lake.read(spark, cl_uri)
            new = history.history_rows(
                changelog, key, tracked, table.ignore_null_updates, affected, truncates
            )
        compared = _compared(new, old, key).persist(PERSIST_LEVEL)
        with phase("history.differences"):
            per_file = _per_file(compared)
        written, removed = per_file.added, per_file.gone
        with phase("history.replace"):
            if written or removed:
                # Only the keys with a difference are rewritten.
                changed = F.col("__changed") & (F.col("__side") == _NEW)
                rows = compared.where(changed).select(*key, history.START_AT, "__values.*")
                changed_keys = compared.where(F.col("__changed") & F.col("__first")).select(*key)
                lake.rewrite_keys(
                    spark, h_uri, rows, changed_keys, per_file.held, key, new_state,
                    per_file.versions, known.version, per_file.keys <= lake.BROADCAST_ROWS,
                    compact=True, on_read=table.merge_mode == "merge-on-read",
                )  # fmt: skip
            else:
                lake.record_state(h_uri, new_state)
    finally:
        if compared is not None:
            compared.unpersist()
        old.unpersist()
    return HistoryResult(
        h_uri, written, removed, lake.row_count(h_uri), lake.version(h_uri), cl_version
    )


class _Changes(NamedTuple):
    added: DataFrame  # the change-log rows of the files added since the applied version
    gone: DataFrame | None  # of the files removed since (None: none)
    added_files: list[str]


def _changes_since(
    spark: SparkSession, cl_uri: str, applied: int | None, state: lake.TableState
) -> _Changes | None:
    """The change-log files added since version ``applied`` and those removed, read; None when
    that cannot be told (first run, vacuumed versions or files) or the history has no count of
    its truncates to update (recorded by an older release)."""
    if applied is None or not isinstance(state.truncates, list):
        return None
    added = lake.files_added_since(cl_uri, applied)
    removed = lake.files_removed_since(cl_uri, applied)
    if added is None or removed is None:
        return None
    gone = lake.read(spark, cl_uri, only_files=removed) if removed else None
    return _Changes(lake.read(spark, cl_uri, only_files=added), gone, added)


def _in_order(cl_uri: str, changes: _Changes, state: lake.TableState) -> bool:
    """Whether every added change is newer than every change applied before (from the files'
    statistics), and none was removed."""
    if changes.gone is not None or state.newest_sequence is None or not changes.added_files:
        return False
    bounds = lake.stat_range(cl_uri, "sequence", changes.added_files)
    return bounds is not None and bounds[0] > state.newest_sequence


def _extended(
    old: DataFrame,
    added: DataFrame,
    key: list[str],
    tracked: list[str],
    ignore_null_updates: bool,
    truncates: list[tuple[str, int | None]],
) -> DataFrame:
    """The whole history of the keys ``added`` touches when every change in it is newer than
    their ``old`` history rows: the closed versions as they are; the open, live ones and the
    new ones from the open versions (``history.seed_events``) and the new changes; an open
    delete closed by the key's first new version. Every event ``added`` gives is of a key it
    touches, so its events need no filter by those keys."""
    seeds = history.seed_events(old, added, key)
    tail = history.history_rows(
        added, key, tracked, ignore_null_updates, truncates=truncates, seeds=seeds
    )
    old = old.select(*_typed_as(old, tail.schema.fields))
    is_current, is_deleted = F.col(history.IS_CURRENT), F.col(history.IS_DELETED)
    rows = (
        old.where(~is_current | is_deleted)
        .withColumn("__open_delete", is_current)
        .unionByName(tail.withColumn("__open_delete", F.lit(False)))
    )
    # An open delete is closed by the key's next version, if the new changes opened one.
    following = Window.partitionBy(*key).orderBy(history.START_AT)
    next_at = F.lead(history.START_AT).over(following)
    next_time = F.lead(history.START_TIME).over(following)
    open_delete = F.col("__open_delete")
    return rows.withColumns(
        {
            history.END_AT: F.when(open_delete, next_at).otherwise(F.col(history.END_AT)),
            history.END_TIME: F.when(open_delete, next_time).otherwise(F.col(history.END_TIME)),
            history.IS_CURRENT: F.when(open_delete, next_at.isNull()).otherwise(is_current),
        }
    ).drop("__open_delete")


def _recorded_truncates(state: lake.TableState) -> Counter[tuple[str, int | None]]:
    return Counter({(seq, us): n for seq, us, n in state.truncates or []})


_NEW, _OLD = 0, 1  # ``_compared``'s sides


def _compared(new: DataFrame, old: DataFrame, key: list[str]) -> DataFrame:
    """The touched keys' ``new`` history rows and ``old`` ones (with their ``FILE_COLUMN``), in
    one frame (``__side``: ``_NEW`` or ``_OLD``; ``__values``: the columns besides the key and
    the start), each row flagged: ``__added``, a new row no old row of its key and start equals
    (a new version, or one whose values changed); ``__gone``, an old row whose start no new row
    of its key has; ``__changed``, its key has one or the other; ``__first``, its key's first
    row. Windows over the key, one shuffle: a new row's old counterpart is the next row."""
    ids = [*key, history.START_AT]
    values = [f for f in new.schema.fields if f.name not in ids]
    no_file = F.lit(None).cast("string").alias(lake.FILE_COLUMN)
    both = new.select(
        *ids, F.struct(*[F.col(f"`{f.name}`") for f in values]).alias("__values"),
        F.lit(_NEW).alias("__side"), no_file,
    ).unionByName(old.select(
        *ids, F.struct(*_typed_as(old, values)).alias("__values"),
        F.lit(_OLD).alias("__side"), lake.FILE_COLUMN,
    ))  # fmt: skip
    by_key = Window.partitionBy(*key)
    ordered = by_key.orderBy(history.START_AT, "__side")
    row = F.struct(F.col("__side").alias("side"), F.col(history.START_AT).alias("at"), "__values")
    after, before = F.lead(row).over(ordered), F.lag(row).over(ordered)
    at, side = F.col(history.START_AT), F.col("__side")
    same = (
        (after["side"] == _OLD)
        & (after["at"] == at)
        & after["__values"].eqNullSafe(F.col("__values"))
    )
    kept = (before["side"] == _NEW) & (before["at"] == at)
    flagged = both.select(
        "*",
        ((side == _NEW) & ~F.coalesce(same, F.lit(False))).alias("__added"),
        ((side == _OLD) & ~F.coalesce(kept, F.lit(False))).alias("__gone"),
        (F.row_number().over(ordered) == 1).alias("__first"),
    )
    return flagged.withColumn("__changed", F.max(F.col("__added") | F.col("__gone")).over(by_key))


class _PerFile(NamedTuple):
    added: int  # new rows no old row equals: versions written
    gone: int  # old rows no new row replaces: versions removed
    versions: int  # new rows of the changed keys: rows written
    keys: int  # changed keys
    held: dict[str, int]  # per file holding rows of changed keys, how many


def _per_file(compared: DataFrame) -> _PerFile:
    """``_compared``'s counts, from one aggregate with a row per file (and one for new rows)."""
    changed, side = F.col("__changed"), F.col("__side")
    rows = (
        compared.groupBy(lake.FILE_COLUMN)
        .agg(
            F.count_if("__added").alias("added"),
            F.count_if("__gone").alias("gone"),
            F.count_if(changed & (side == _NEW)).alias("versions"),
            F.count_if(changed & F.col("__first")).alias("keys"),
            F.count_if(changed & (side == _OLD)).alias("held"),
        )
        .collect()
    )
    return _PerFile(
        *(sum(r[c] for r in rows) for c in ("added", "gone", "versions", "keys")),
        {r[lake.FILE_COLUMN]: r["held"] for r in rows if r["held"]},
    )


def _typed_as(old: DataFrame, fields: list[T.StructField]) -> list[Column]:
    """``old``'s columns as ``fields`` name and type them, absent ones null: history rows
    written before a column was added or widened, comparable with the new rows."""
    have = set(old.columns)
    return [
        (F.col(f"`{f.name}`") if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)
        for f in fields
    ]
