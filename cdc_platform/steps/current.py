"""Current-state step: change log -> current state, one row per key, by sequence.

A merge after a replaced partition rebuilds the keys whose change records went away, so
backfills leave the same tables as a rebuild."""

import functools
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import TableConfig
from cdc_platform.formats import canonical as C
from cdc_platform.spark import apply, history
from cdc_platform.spark.session import PERSIST_LEVEL
from cdc_platform.timings import phase


@dataclass(kw_only=True)
class MergeResult:
    uri: str  # the current table's
    inserted: int = 0
    updated: int = 0
    rows: int = 0
    deleted_rows: int = 0
    version: int | None
    changelog_version: int | None
    truncated: int = 0
    tombstones_purged: int = 0
    # The live-row balance of this merge: rows == live_before - truncated_live + made_live -
    # made_dead (keys the batch made live that were not, and deleted that were live).
    live_before: int = 0
    truncated_live: int = 0
    made_live: int = 0
    made_dead: int = 0
    # The data files the merge committed (None: it built the table whole), for checks and
    # previews that cost what the merge changed, not the table; and the change-log files it
    # merged (added and removed since the last merge), whose keys are the ones it changed.
    written: list[str] | None = None
    merged_changes: list[str] | None = None


# What a merge reads of the current table's rows of its keys (``lake.rows_of_keys``).
_HELD = [C.SEQUENCE_COL, C.DELETED_COL, C.PARTIAL_NEWEST_COL]

# A key nothing is left of: a tombstone-like row (non-null flags, as the table has them) that
# the MERGE deletes.
_GONE = {C.DELETED_COL: True, C.PARTIAL_NEWEST_COL: False}


def _rebuild_keys(
    spark: SparkSession,
    cl_uri: str,
    current: DataFrame,
    newest: DataFrame,
    removed: DataFrame | None,
    key: list[str],
    truncated_before: str | None,
    options: TableConfig,
) -> DataFrame:
    """Replace some of the batch's rows by their keys rebuilt from the whole change log, flagged
    (``REBUILT``) to replace the current row whatever its sequence:

    - keys whose current row came from a partial image (TOAST, SharePlex, ignored nulls) take
      some values from older changes, so a late older change can still fill them;
    - keys of change records a reprocessed partition no longer holds (``removed``): their effect
      must go. A key with no change left is deleted from the table (``DROP``).

    ``current``: the current table's rows of the batch's keys (``lake.rows_of_keys``); every
    row returned keeps its key's row there (``apply.HELD``)."""
    wanted = []
    fragile = None
    if C.PARTIAL_NEWEST_COL in current.columns:
        fragile = current.where(F.col(C.PARTIAL_NEWEST_COL)).select(*key)
    # Mostly the table holds no partial row of these keys: asked of the few rows held, that
    # spares the batch's join with them.
    if fragile is not None and not fragile.isEmpty():
        wanted.append(newest.select(*key).join(fragile, key, "left_semi"))
    if removed is not None:
        wanted.append(history.touched_keys(removed, key).select("key.*"))
    if not wanted:
        return newest
    touched = functools.reduce(DataFrame.unionByName, wanted).distinct().persist(PERSIST_LEVEL)
    try:
        if touched.isEmpty():
            return newest
        changes = apply.touching(lake.read(spark, cl_uri), touched, key)
        rebuilt = apply.without_working_columns(
            apply.latest_per_key(changes, key, truncated_before, options.ignore_null_updates)
        ).join(touched, key, "left_semi")
        # Keys nothing is left of: a full rebuild would not have them either.
        gone = touched.join(rebuilt.select(*key), key, "left_anti").select(
            *[
                F.col(f.name)
                if f.name in key
                else F.lit(_GONE.get(f.name)).cast(f.dataType).alias(f.name)
                for f in rebuilt.schema.fields
            ]
        )
        untouched = newest.join(touched, key, "left_anti")
        replaced = rebuilt.withColumns({lake.REBUILT: F.lit(True), lake.DROP: F.lit(False)})
        replaced = replaced.unionByName(
            gone.withColumns({lake.REBUILT: F.lit(True), lake.DROP: F.lit(True)})
        )
        return untouched.withColumns(
            {lake.REBUILT: F.lit(False), lake.DROP: F.lit(False)}
        ).unionByName(replaced.join(apply.held(current, key), key, "left"))
    finally:
        touched.unpersist()


def merge_current(
    spark: SparkSession,
    warehouse: str,
    source: str,
    table: str,
    full_refresh: bool = False,
    options: TableConfig | None = None,
) -> MergeResult:
    """Merge the change-log files not yet applied into the current-state table.

    ``options``: the table's configuration (ignore_null_updates, tombstone retention)."""
    options = options or TableConfig(name=table)
    on_read = options.merge_mode == "merge-on-read"
    cl_uri = lake.TableRef(lake.CHANGELOG, source, table).uri(warehouse)
    cur_uri = lake.TableRef(lake.CURRENT, source, table).uri(warehouse)
    cl_version = lake.version(cl_uri)
    if cl_version is None:
        return MergeResult(uri=cur_uri, version=lake.version(cur_uri), changelog_version=None)
    key = lake.state(cl_uri).key
    # The version the merge reads the table's state at, before the state: every commit of the
    # merge is made against it (``lake.Pin``), so a run merging at the same time (only a run
    # past the queue can) fails this one, which runs again, rather than both counting their
    # changes from the same live rows.
    pinned = lake.version(cur_uri)
    state = lake.TableState() if full_refresh else lake.state(cur_uri)
    applied = state.changelog_version
    if applied == cl_version and lake.exists(cur_uri):
        live, deleted = _counts(spark, cur_uri, state)
        return MergeResult(
            uri=cur_uri,
            rows=live,
            deleted_rows=deleted,
            version=lake.version(cur_uri),
            changelog_version=cl_version,
            live_before=live,
            written=[],
        )
    new_files = removed_files = None
    if applied is not None:
        with phase("merge.find_changes"):
            new_files = lake.files_added_since(cl_uri, applied)
            removed_files = lake.files_removed_since(cl_uri, applied)
    batch = lake.read(spark, cl_uri, only_files=new_files)
    removed = lake.read(spark, cl_uri, only_files=removed_files) if removed_files else None
    if applied is not None and (
        new_files is None or removed_files is None or _truncates_gone(removed, batch)
    ):
        # What was applied can no longer be told apart (vacuumed versions), or a reprocessed
        # partition took a truncate away: only a rebuild from the whole change log is exact.
        full_refresh, state, applied, removed = True, lake.TableState(), None, None
        batch, new_files = lake.read(spark, cl_uri), None
    with phase("merge.truncates"):
        truncating = lake.may_hold_truncates(cl_uri, key, new_files)
        truncate = apply.latest_truncate(batch) if truncating else None
    truncated_before = max(filter(None, [state.truncated_before, truncate]), default=None)
    new_state = lake.TableState(
        key=key, changelog_version=cl_version, truncated_before=truncated_before
    )
    merging = pinned is not None and not full_refresh
    pin = lake.Pin(cur_uri, pinned) if merging else None
    with phase("merge.live_before"):
        live, deleted = _counts(spark, cur_uri, state) if merging else (0, 0)
    live_before = live
    version_before = pinned if merging else None
    truncated = truncated_live = 0
    if truncate and truncate == truncated_before and merging:
        gone = F.col(C.SEQUENCE_COL) < F.lit(truncate)
        r = (
            lake.read(spark, cur_uri)
            .where(gone)
            .agg(F.count_if(~F.col(C.DELETED_COL)), F.count("*"))
        )
        truncated_live, truncated_all = (int(v) for v in r.first())
        live, deleted = live - truncated_live, deleted - (truncated_all - truncated_live)
        # The merge below is what advances changelog_version: a crash here just reruns both.
        truncated = lake.delete_rows(
            spark,
            cur_uri,
            gone,
            replace(state, truncated_before=truncated_before, rows=[live, deleted]),
            by_file=True,
            pin=pin,
            on_read=on_read,
        )
    newest = apply.latest_per_key(batch, key, truncated_before, options.ignore_null_updates)
    # At most the batch's rows: one newest row a key, and the rebuilt keys are the batch's own
    # unless change records were removed. Read from the log's statistics.
    bound = lake.row_count(cl_uri, new_files) if merging and removed is None else None
    known, small, held, fresh = None, False, None, False
    try:
        if merging:
            # The files that may hold a key the batch touches (or a removed change record did):
            # found once, and every read of the current table below reads only them, so a merge
            # costs what its batch touches, not the table.
            with phase("merge.candidate_files"):
                touching = batch if removed is None else batch.unionByName(removed)
                keys = history.touched_keys(touching, key).select("key.*")
                span = lake.key_span(cl_uri, [*new_files, *(removed_files or [])], key[0])
                known = lake.candidates(spark, cur_uri, keys, key, span)
            small = lake.broadcastable(bound, known.rows)
            # No file may hold a key of the batch (new keys only: inserts, the usual live batch):
            # the table has no row of them to read, weigh against or correct.
            fresh = not known.files and removed is None
        if merging and not fresh:
            # The table's rows of those keys, what every decision below reads of the table: read
            # once (the key, sequence and flag columns of the candidate files), at most the batch.
            held = lake.rows_of_keys(
                spark, cur_uri, keys, key, _HELD, known, small, with_position=on_read
            )
            held = held.persist(PERSIST_LEVEL)
            newest = apply.relative_to(newest, held, key, small)
            newest = _rebuild_keys(
                spark, cl_uri, held, newest, removed, key, truncated_before, options
            )
            newest = newest.persist(PERSIST_LEVEL)
            with phase("merge.live_effect"):
                made_live, made_dead = _live_effect(newest)
        else:
            # A new or rebuilt table, or new keys only: every live row written is made live,
            # counted by the write below. A new table's write keeps its rows itself
            # (``upsert_newer``); so does a merge of new keys (the join with no file of the table).
            newest = apply.without_working_columns(newest)
            if full_refresh:
                newest = newest.persist(PERSIST_LEVEL)
        if full_refresh:
            rows = newest.drop(apply.PARTIAL_COL)
            r = rows.agg(F.count("*"), F.count_if(F.col(C.DELETED_COL))).first()
            n, deleted = int(r[0]), int(r[1])
            live = n - deleted
            lake.replace(rows, cur_uri, replace(new_state, rows=[live, deleted]), key=key, rows=n)
            metrics = {"num_target_rows_inserted": n, "num_target_rows_updated": 0}
        else:

            def counted(m: dict[str, int]) -> lake.TableState:
                rows = [live + m["unflagged_added"], deleted + m["flagged_added"]]
                return replace(new_state, rows=rows)

            with phase("merge.upsert"):
                metrics = lake.upsert_newer(
                    spark, cur_uri, newest.drop(*apply.HELD), key, C.SEQUENCE_COL,
                    apply.PARTIAL_COL, counted,
                    C.DELETED_COL, known, bound, held, pin, on_read,
                )  # fmt: skip
            live += metrics["unflagged_added"]
            deleted += metrics["flagged_added"]
        if not merging:
            made_live, made_dead = live, 0
        elif fresh:
            made_live, made_dead = metrics["unflagged_added"], 0
    finally:
        newest.unpersist()
        if held is not None:
            held.unpersist()
    purged = 0
    if options.tombstone_retention_days:
        # Past the retention a tombstone goes; an event older than it arriving later could then
        # resurrect its key (as in AUTO CDC): choose the retention longer than any lateness.
        cutoff = datetime.now(UTC) - timedelta(days=options.tombstone_retention_days)
        old = F.col(C.DELETED_COL) & (F.col(C.EVENT_TIME_COL) < F.lit(cutoff))
        expired = lake.read(spark, cur_uri).where(old).count()
        purged = lake.delete_rows(
            spark, cur_uri, old, replace(new_state, rows=[live, deleted - expired]), by_file=True,
            pin=pin, on_read=on_read,
        )  # fmt: skip
        deleted -= purged
    version = lake.version(cur_uri)
    written = (
        None if version_before is None else lake.files_between(cur_uri, version_before, version)
    )
    return MergeResult(
        uri=cur_uri,
        inserted=int(metrics.get("num_target_rows_inserted", 0)),
        updated=int(metrics.get("num_target_rows_updated", 0)),
        rows=live,
        deleted_rows=deleted,
        version=version,
        changelog_version=cl_version,
        truncated=truncated,
        tombstones_purged=purged,
        live_before=live_before,
        truncated_live=truncated_live,
        made_live=made_live,
        made_dead=made_dead,
        written=written,
        merged_changes=(
            None if written is None or new_files is None else [*new_files, *(removed_files or [])]
        ),
    )


def _truncates_gone(removed: DataFrame | None, added: DataFrame) -> bool:
    """Whether change-log files removed since the last merge held a truncate the files added
    since do not hold again."""
    if removed is None:
        return False
    sequences = removed.where(F.col("op") == C.TRUNCATE).select("sequence")
    return not sequences.subtract(
        added.where(F.col("op") == C.TRUNCATE).select("sequence")
    ).isEmpty()


def _live_effect(newest: DataFrame) -> tuple[int, int]:
    """(keys the batch makes live that were not, keys it deletes that were live), computed apart
    from the MERGE by the same rule (a newer sequence or a rebuilt key wins), so the quality
    check comparing the balance with the table tests the merge.

    ``newest``: the rows to merge, each with its key's row in the table (``apply.HELD``, from
    ``relative_to`` or the rebuild): a key the table does not hold is made live by a live row;
    one it holds changes as the merge changes it."""
    deleted, rebuilt = F.col(C.DELETED_COL), F.col(lake.REBUILT)
    was, was_at = F.col(apply.HELD_LIVE), F.col(apply.HELD_SEQ)
    applies = was_at.isNull() | (F.col(C.SEQUENCE_COL) > was_at)
    if lake.REBUILT in newest.columns:
        applies = applies | rebuilt
    now = F.when(applies, ~deleted).otherwise(was)
    held = was.isNotNull()
    live = F.when(held, now & ~was).otherwise(~deleted)
    dead = held & ~now & was
    row = newest.agg(F.count_if(live), F.count_if(dead)).first()
    return int(row[0] or 0), int(row[1] or 0)


def _counts(spark: SparkSession, cur_uri: str, state: lake.TableState) -> tuple[int, int]:
    """(live rows, tombstones) of the current table: kept in its state by every commit that
    changes them (from the files it writes and removes), so a merge never counts the whole
    table; counted once for a table whose state does not have them yet."""
    if state.rows is not None:
        live, deleted = state.rows
        return int(live), int(deleted)
    df = lake.read(spark, cur_uri)
    if df is None:
        return 0, 0
    r = df.agg(F.count_if(~F.col(C.DELETED_COL)), F.count_if(F.col(C.DELETED_COL))).first()
    return int(r[0]), int(r[1])


def current_rows(
    spark: SparkSession,
    warehouse: str,
    source: str,
    table: str,
    only_files: list[str] | None = None,
) -> DataFrame | None:
    """The exposed current state: live rows only, without the ``__`` bookkeeping columns
    (``only_files``: of just those data files)."""
    uri = lake.TableRef(lake.CURRENT, source, table).uri(warehouse)
    df = lake.read(spark, uri, only_files=only_files)
    if df is None:
        return None
    return df.where(~F.col(C.DELETED_COL)).drop(*C.CURRENT_META)
