"""History step: change log -> SCD type 2 history, recomputing the keys the change log's new or
removed files touch."""

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import TableConfig
from cdc_platform.spark import history
from cdc_platform.spark.session import PERSIST_LEVEL


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
    warehouse: Path,
    source: str,
    table: TableConfig,
    full_refresh: bool = False,
) -> HistoryResult:
    """Bring ``history/<source>/<table>`` (SCD type 2) up to date with the change log.

    The keys that the change-log files added or removed since the last run touch get their whole
    history recomputed from the whole change log, and their rows replaced in one commit that also
    records the change-log version: reruns, late and shuffled partitions all converge on the
    history of one in-order replay. When the change log's truncates change (one came or went),
    or with ``full_refresh``, every key is recomputed. The history's state counts the truncates,
    updated from the changed files alone.
    """

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
    changelog = lake.read(spark, cl_uri)
    columns = [f.name for f in changelog.schema["after"].dataType.fields]
    tracked = table.tracked_columns([c for c in columns if c not in key])
    changes = _changes_since(spark, cl_uri, applied, state)
    if changes is None:  # first run, full refresh, or old files vacuumed: count them all
        counts = history.truncate_counts(changelog)
    else:
        counts = _recorded_truncates(state)
        counts.update(history.truncate_counts(*changes))
    truncates = history.truncates_of(counts)
    new_state = lake.TableState(
        key=key,
        changelog_version=cl_version,
        truncates=[[seq, us, n] for (seq, us), n in sorted(counts.items()) if n > 0],
    )
    if changes is None or truncates != history.truncates_of(_recorded_truncates(state)):
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
    added, gone = changes
    touched = added if gone is None else added.unionByName(gone)
    affected = history.touched_keys(touched, key)
    new = history.history_rows(
        changelog, key, tracked, table.ignore_null_updates, affected, truncates
    ).persist(PERSIST_LEVEL)
    old = lake.read(spark, h_uri).join(affected.select("key.*"), key, "left_semi")
    try:
        # Per key: versions that are new or differ, versions (by key and start) that are gone,
        # and its versions now. Only the keys with a difference are rewritten.
        per_key = _differences(new, old, key).persist(PERSIST_LEVEL)
        try:
            totals = per_key.agg(F.sum("added"), F.sum("gone"), F.sum("versions")).first()
            written, removed, versions = (int(v or 0) for v in totals)
            changed_keys = per_key.select(*key)
            if written or removed:
                rows = new.join(changed_keys, key, "left_semi")
                lake.replace_keys(
                    spark, h_uri, rows, changed_keys, key, new_state, versions, compact=True
                )
            else:
                lake.record_state(h_uri, new_state)
        finally:
            per_key.unpersist()
    finally:
        new.unpersist()
    return HistoryResult(
        h_uri, written, removed, lake.row_count(h_uri), lake.version(h_uri), cl_version
    )


def _changes_since(
    spark: SparkSession, cl_uri: str, applied: int | None, state: lake.TableState
) -> tuple[DataFrame, DataFrame | None] | None:
    """The change-log files added since version ``applied`` and those removed (None: none),
    read; None when that cannot be told (first run, vacuumed versions or files) or the history
    has no count of its truncates to update (recorded by an older release)."""
    if applied is None or not isinstance(state.truncates, list):
        return None
    added = lake.files_added_since(cl_uri, applied)
    removed = lake.files_removed_since(cl_uri, applied)
    if added is None or removed is None:
        return None
    gone = lake.read(spark, cl_uri, only_files=removed) if removed else None
    return lake.read(spark, cl_uri, only_files=added), gone


def _recorded_truncates(state: lake.TableState) -> Counter[tuple[str, int | None]]:
    return Counter({(seq, us): n for seq, us, n in state.truncates or []})


def _differences(new: DataFrame, old: DataFrame, key: list[str]) -> DataFrame:
    """Per key with a difference between its ``new`` and ``old`` history rows: ``added`` (new
    versions, or versions whose values differ), ``gone`` (versions, by start, it no longer has)
    and ``versions`` (its new versions); one join on (key, start)."""
    ids = [*key, history.START_AT]
    values = [f for f in new.schema.fields if f.name not in ids]
    have = set(old.columns)
    # As the new rows' types (a column added or widened since): comparable field by field.
    old_values = [
        (F.col(f.name) if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)
        for f in values
    ]
    n = new.select(*ids, F.struct(*[f.name for f in values]).alias("__new"))
    o = old.select(*ids, F.struct(*old_values).alias("__old"))
    is_new, is_old = F.col("__new").isNotNull(), F.col("__old").isNotNull()
    return (
        n.join(o, ids, "full_outer")
        .groupBy(*key)
        .agg(
            F.count_if(is_new & ~F.col("__new").eqNullSafe(F.col("__old"))).alias("added"),
            F.count_if(~is_new & is_old).alias("gone"),
            F.count_if(is_new).alias("versions"),
        )
        .where((F.col("added") > 0) | (F.col("gone") > 0))
    )
