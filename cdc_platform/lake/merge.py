"""MERGE in Spark, copy-on-write: rows change by rewriting the files that hold them.

A merge reads only the files whose key range (min/max statistics of the first key column)
holds a key of its batch, keeping each row's file (``FILE_COLUMN``); it rewrites the files
holding a row it changes, writes new keys to new files, and commits the removes and adds in
one commit against the version it read, with the table's small files once they are many
(``small_files``: a day of small runs would otherwise leave a file per run). Only file paths
and counts reach the driver. A commit that loses a race (another writer removed one of its
files) is retried from the start on the new snapshot: nothing it decided on stale rows is
kept. A merge whose caller decided from the table's state (``Pin``: the current-state step's
live-row counts) fails instead (``TableMoved``), and the caller's step runs again. A small
batch into many rows is merged file by file (``broadcastable``): each changed file is
rewritten in the task that read it, with no shuffle of the table.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_platform.lake import commit as C
from cdc_platform.lake import data_files
from cdc_platform.lake import deletion_vectors as DV
from cdc_platform.lake.commit import Pin, TableMoved
from cdc_platform.lake.tables import (
    FILE_COLUMN,
    PARTITION_COLUMN,
    ROW_COLUMN,
    TableState,
    absolute_path,
    add_actions,
    deletion_vectors_of,
    exists,
    local_path,
    open_table,
    read,
)
from cdc_platform.lake.tables import state as table_state
from cdc_platform.spark.session import PERSIST_LEVEL

# Merge source columns: true rows replace the target row whatever the sequences (REBUILT), or
# delete it (DROP: nothing of the key is left in the change log).
REBUILT = "__rebuilt"
DROP = "__drop"
_ACTION = "__action"
_WAS_FLAGGED = "__was_flagged"
_FLAG = "__flag"
_ATTEMPTS = 3
# Actions whose row is written anew, and those whose old row goes.
_GAINS = ("insert", "full", "partial")
_LOSSES = ("full", "partial", "delete")
# Each run that inserts keys writes them to a file of their own: a day of small runs would
# leave thousands of tiny files, and every read that lists them (a Spark read lists its files)
# would cost more with each. A rewrite folds the small files in once there are this many.
COMPACT_AT = 32
SMALL_FILE_FRACTION = 8  # a file under ROWS_PER_FILE / 8 rows is small
# A batch of at most this many rows is sent whole to every task that reads a file of the table:
# each task then rewrites the file it read, in its order, and the table is neither shuffled
# nor sorted. A larger batch is joined with the table's rows by a shuffle of both, and the rows
# written are range-sorted anew.
BROADCAST_ROWS = 200_000
# ...when the files that may hold its keys have more rows than this: fewer are shuffled at less
# cost than the by-file merge's extra Spark jobs (a broadcast each).
BY_FILE_ABOVE_ROWS = 100_000
# Files whose key range meets a batch's (from the change log's statistics) and hold at most this
# many rows are read without matching each key to them: a Spark job (0.3 s) costs more than
# reading the key columns of a file or two that hold none of the keys.
SPAN_ROWS = 2 * C.ROWS_PER_FILE
# A table of at most this many rows is read whole: pruning its files by their key ranges would
# cost a Spark job, more than reading them (a small micro-batch's merge runs a few dozen jobs).
PRUNE_ABOVE_ROWS = 100_000


def broadcastable(batch_rows: int | None, table_rows: int) -> bool:
    """Whether a batch of ``batch_rows`` rows (None: unknown) is merged file by file into files
    of ``table_rows`` rows."""
    if batch_rows is None:
        return False
    return batch_rows <= BROADCAST_ROWS and table_rows > BY_FILE_ABOVE_ROWS


# Spark's file packing turned off: a file is never split, and a task reads one file only.
_ONE_FILE_A_TASK = {
    "spark.sql.files.maxPartitionBytes": str(1 << 40),
    "spark.sql.files.openCostInBytes": str(1 << 40),
}


@contextmanager
def one_file_a_task(spark: SparkSession) -> Iterator[None]:
    """Within the block, every read of data files plans a task per file (frames persisted here
    keep that partitioning): rows of one file stay together without a shuffle."""
    before = {k: spark.conf.get(k, None) for k in _ONE_FILE_A_TASK}
    for k, v in _ONE_FILE_A_TASK.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def candidate_files(
    spark: SparkSession,
    dt: DeltaTable,
    keys: DataFrame,
    column: str,
    span: tuple[Any, Any] | None = None,
) -> list[str]:
    """Files (paths relative to the table) that may hold a row whose ``column`` is one of
    ``keys``' values (null-safe): those whose [min, max] holds one, those holding nulls in it,
    and those without statistics; every file of a table of at most ``PRUNE_ABOVE_ROWS`` rows.

    ``span``: the least and greatest of those values, when known (``lake.key_span``): only the
    files whose [min, max] meets it are looked at, and when they hold at most ``SPAN_ROWS`` rows
    they are taken as they are, without the Spark job that matches each key to the files."""
    actions = add_actions(dt)
    if actions.num_rows == 0:
        return []
    if sum(n or 0 for n in actions["num_records"].to_pylist()) <= PRUNE_ABOVE_ROWS:
        return actions["path"].to_pylist()
    low, high, nulls = f"min.{column}", f"max.{column}", f"null_count.{column}"
    if not {low, high, nulls} <= set(actions.column_names):
        return actions["path"].to_pylist()
    bounds = actions.select(["path", low, high, nulls, "num_records"]).rename_columns(
        ["path", "lo", "hi", "n", "rows"]
    )
    always = [r["path"] for r in bounds.to_pylist() if r["lo"] is None or r["hi"] is None or r["n"]]
    known = bounds.filter(bounds["lo"].is_valid())
    meets = _meeting(known, span) if span is not None else None
    if meets is not None:
        known = known.filter(pa.array(meets, pa.bool_()))
        if (pc.sum(known["rows"]).as_py() or 0) <= SPAN_ROWS:
            return sorted({*known["path"].to_pylist(), *always})
    known = known.select(["path", "lo", "hi"])
    if known.num_rows == 0:
        return always
    ranges = spark.createDataFrame(known)
    k = keys.select(F.col(f"`{column}`").alias("__k")).where(F.col("__k").isNotNull()).distinct()
    hit = k.join(F.broadcast(ranges), (F.col("__k") >= F.col("lo")) & (F.col("__k") <= F.col("hi")))
    found = {r["path"] for r in hit.select("path").distinct().collect()}
    return sorted(found | set(always))


def _meeting(bounds: pa.Table, span: tuple[Any, Any]) -> list[bool] | None:
    """For each file of ``bounds`` (``lo``, ``hi``), whether its [min, max] meets ``span``; None
    when the two do not compare (bounds of another type than the keys', such as after a change
    of the column's type)."""
    first, last = span
    try:
        return [
            lo <= last and first <= hi
            for lo, hi in zip(bounds["lo"].to_pylist(), bounds["hi"].to_pylist(), strict=True)
        ]
    except TypeError:
        return None


def _retrying(run):
    """Run a read-decide-write-commit attempt; again on a lost commit race (not under a moved
    ``Pin``: what the step decided before the attempt is stale too)."""
    for attempt in range(_ATTEMPTS):
        try:
            return run()
        except TableMoved:
            raise
        except CommitFailedError:
            if attempt == _ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Candidates:
    """The files of one version of a table that may hold some keys (``candidate_files``), and
    their rows: found once, read by every step of a merge that needs the rows of those keys."""

    version: int
    files: list[str]
    rows: int


def candidates(
    spark: SparkSession,
    uri: str,
    keys: DataFrame,
    key: list[str],
    span: tuple[Any, Any] | None = None,
) -> Candidates:
    """``span``: see ``candidate_files``."""
    dt = open_table(uri)
    files = candidate_files(spark, dt, keys, key[0], span)
    sizes = add_actions(dt).select(["path", "num_records"]).to_pylist()
    wanted = set(files)
    rows = sum(a["num_records"] or 0 for a in sizes if a["path"] in wanted)
    return Candidates(dt.version(), files, rows)


def _targets(
    spark: SparkSession,
    uri: str,
    dt: DeltaTable,
    keys: DataFrame,
    key: list[str],
    known: Candidates | None = None,
    with_position: bool = False,
    columns: list[str] | None = None,
):
    """The rows of the files that may hold ``keys`` (``columns`` of them; None: all)."""
    if known is not None and known.version == dt.version():
        files = known.files
    else:
        files = candidate_files(spark, dt, keys, key[0])
    paths = [absolute_path(uri, f) for f in files]
    return read(
        spark, uri, only_files=paths, with_file=True, with_position=with_position, columns=columns
    )


def rows_of_keys(
    spark: SparkSession,
    uri: str,
    keys: DataFrame,
    key: list[str],
    columns: list[str],
    known: Candidates | None = None,
    few: bool = False,
    with_position: bool = False,
) -> DataFrame:
    """The rows of ``uri`` whose key is one of ``keys`` (a frame with the key columns; repeats
    allowed): their key, those of ``columns`` the table has, and their file (``FILE_COLUMN``).
    Only the files that may hold one of the keys are read (``known``, when they were found
    already for this version). ``few``: the keys are sent to the tasks reading the files, and
    the table is not shuffled. ``with_position``: each row's position in its file too
    (``ROW_COLUMN``), for a merge-on-read merge."""
    dt = open_table(uri)
    rows = _targets(spark, uri, dt, keys, key, known, with_position, [*key, *columns])
    have = {*pa.schema(dt.schema()).names, FILE_COLUMN, ROW_COLUMN}  # the read's, from the log
    extra = [FILE_COLUMN, *[ROW_COLUMN] * with_position]
    chosen = [F.col(f"`{c}`") for c in [*key, *columns, *extra] if c in have]
    wanted = keys.select(*[F.col(f"`{k}`") for k in key])
    return rows.select(*chosen).join(F.broadcast(wanted) if few else wanted, key, "left_semi")


def files_sharing_keys(uri: str, files: list[str], column: str) -> list[str]:
    """``files`` (data files of the table's snapshot, as ``lake.files`` names them) and every
    other file of the snapshot whose [min, max] of ``column`` overlaps one of theirs, or that
    has no statistics for it: where a key of ``files`` may also be. From the log alone."""
    actions = add_actions(open_table(uri))
    paths = [absolute_path(uri, p) for p in actions["path"].to_pylist()]
    low, high = f"min.{column}", f"max.{column}"
    if not files or not {low, high} <= set(actions.column_names):
        return files if files else []
    mine = {local_path(f) for f in files}
    spans = list(zip(paths, actions[low].to_pylist(), actions[high].to_pylist(), strict=True))
    own = [(lo, hi) for p, lo, hi in spans if p in mine and lo is not None and hi is not None]
    shared = [
        p
        for p, lo, hi in spans
        if p not in mine and (lo is None or hi is None or any(lo <= b and a <= hi for a, b in own))
    ]
    return sorted({*files, *shared})


def small_files(dt: DeltaTable, rewritten: set[str]) -> tuple[list[str], int]:
    """The small files a rewrite folds in, and their rows: none until the table holds
    ``COMPACT_AT`` small files besides ``rewritten`` (each under ``ROWS_PER_FILE /
    SMALL_FILE_FRACTION`` rows), then the smallest of them up to ``ROWS_PER_FILE`` rows in all
    (at least two)."""
    actions = add_actions(dt).select(["path", "num_records"]).to_pylist()
    small = sorted(
        (a["num_records"], a["path"])
        for a in actions
        if a["path"] not in rewritten
        and a["num_records"] is not None
        and a["num_records"] < C.ROWS_PER_FILE // SMALL_FILE_FRACTION
    )
    if len(small) < COMPACT_AT:
        return [], 0
    chosen, total = [], 0
    for n, path in small:
        if len(chosen) >= 2 and total + n > C.ROWS_PER_FILE:
            break
        chosen.append(path)
        total += n
    return chosen, total


def _rewrite(
    uri: str,
    dt: DeltaTable,
    rows: DataFrame,
    rewritten: set[str],
    key: list[str],
    state: TableState | None,
    rows_hint: int | None,
    compact: bool,
    kept: DataFrame | None = None,
    pin: Pin | None = None,
) -> int:
    """Write ``rows`` (sorted by key) and commit them with the removes of ``rewritten``. With
    ``compact``, the table's small files (``small_files``) are rewritten with them, unchanged,
    into files of ``ROWS_PER_FILE`` rows.

    ``kept``: the rows of ``rewritten`` as they are written again, one file's rows to a task
    (``one_file_a_task``), in the order the file holds them. Each task writes them as the file
    they came from, with no shuffle and no sort: a file of a current table is sorted by key
    (every write sorts, or keeps a file's order), and a broadcast join keeps the order of the
    rows it streams. ``rows`` (new rows, at most ``BROADCAST_ROWS``, and the small files) go to
    files of their own, sorted in one task. ``pin``: see ``upsert_newer``."""
    spark = rows.sparkSession
    schema = C.evolve(spark, uri, C.arrow_of(rows))
    out = C.conform(rows, schema)
    folded, folded_rows = small_files(dt, rewritten) if compact else ([], 0)
    if folded:
        paths = [absolute_path(uri, f) for f in folded]
        out = out.unionByName(C.conform(read(spark, uri, only_files=paths), schema))
        rewritten = rewritten | set(folded)
        rows_hint = None if rows_hint is None else rows_hint + folded_rows
    if kept is None:
        out = C.sorted_by_key(out, key, rows_hint)
    else:
        out = C.conform(kept, schema).unionByName(out.coalesce(1).sortWithinPartitions(*key))
    adds = data_files.write(out, uri, dt.metadata().partition_columns, C.ROWS_PER_FILE)
    removes = data_files.removes(add_actions(dt), rewritten)
    return C.commit(
        uri, adds, removes, schema=schema, read_version=dt.version(),
        props=C.properties(state, pinned=pin is not None), pin=pin,
    )  # fmt: skip


def _write_beside(
    uri: str,
    dt: DeltaTable,
    rows: DataFrame | None,
    deleted: DataFrame,
    key: list[str],
    state: TableState | None,
    rows_hint: int | None,
    pin: Pin | None = None,
) -> int:
    """Merge-on-read: mark the rows ``deleted`` names (``FILE_COLUMN``, ``ROW_COLUMN``) in
    their files' deletion vectors, write ``rows`` (sorted by key) to new files, and commit
    both against ``dt``'s version recording ``state``, with the table's small files folded in
    (``small_files``) once they are many. A file keeps its rows and key range: only what
    changed is written (``rows`` None: nothing)."""
    spark = deleted.sparkSession
    if rows is None:
        schema, out = pa.schema(dt.schema()), None
    else:
        schema = C.evolve(spark, uri, C.arrow_of(rows), pin)
        out = C.conform(rows, schema)
    marked = DV.mark(uri, deleted, deletion_vectors_of(uri, dt))
    # Small files fold in sorted by key: a table without one (a key-less delete) keeps them.
    folded, folded_rows = small_files(dt, set(marked)) if key else ([], 0)
    if folded:
        paths = [absolute_path(uri, f) for f in folded]
        small = C.conform(read(spark, uri, only_files=paths), schema)
        out = small if out is None else out.unionByName(small)
        rows_hint = None if rows_hint is None else rows_hint + folded_rows
    adds = []
    if out is not None:
        out = C.sorted_by_key(out, key, rows_hint)
        adds = data_files.write(out, uri, dt.metadata().partition_columns, C.ROWS_PER_FILE)
    return C.commit(
        uri, adds, data_files.removes(add_actions(dt), set(folded)), schema=schema,
        read_version=dt.version(), props=C.properties(state, pinned=pin is not None), pin=pin,
        marked=marked,
    )  # fmt: skip


def upsert_newer(
    spark: SparkSession,
    uri: str,
    data: DataFrame,
    key: list[str],
    sequence: str,
    partial: str,
    state: TableState | Callable[[dict[str, int]], TableState],
    flag: str | None = None,
    known: Candidates | None = None,
    batch_rows: int | None = None,
    held: DataFrame | None = None,
    pin: Pin | None = None,
    on_read: bool = False,
) -> dict[str, int]:
    """MERGE rows into ``uri`` by ``key`` where their ``sequence`` is newer; record ``state``.

    The sequence condition makes the merge idempotent and order-insensitive: replaying a batch,
    or a late, older batch, leaves newer rows untouched. A row whose ``partial`` column lists
    columns updates only those (and the ``__`` bookkeeping); the rest keep their values. A row
    whose ``REBUILT`` column is true replaces its key's row whatever the sequences; one whose
    ``DROP`` column is true deletes it. ``known``: the candidate files of ``data``'s keys, when
    found already (used while the table is still at their version). ``batch_rows``: at most how
    many rows ``data`` has, when known (else they are counted): whether it is merged file by
    file (``broadcastable``) or by a shuffle of both sides. ``held``: the table's rows of
    ``data``'s keys at ``known``'s version (``rows_of_keys``, with ``sequence`` and ``flag``),
    when read already: a merge file by file finds from them which files change.

    ``flag`` is a boolean column whose rows the commit counts, from the files it writes and
    removes only: the metrics ``flagged_added`` and ``unflagged_added`` say how many rows with it
    true and false the table gained (negative: lost). ``state`` may be a function of the metrics
    that returns what the commit records, so a count kept in the state moves with the rows it
    counts. ``pin``: the version the caller read what ``state`` counts from (``Pin``): a commit
    of another writer since fails the merge with ``TableMoved`` instead of a retry here, whose
    counts would start from the old version. The table's schema takes ``data``'s first, so the
    attempt reads and commits against one version.

    ``on_read``: merge-on-read (``_write_beside``): the rows replaced or deleted are marked in
    their files' deletion vectors and only the new rows are written (``held`` then has
    ``ROW_COLUMN``); else the files holding them are rewritten (copy-on-write).
    """
    extra = [c for c in (partial, REBUILT, DROP) if c in data.columns]
    recorded = state if callable(state) else lambda _: state
    flagged_col = F.col(flag) if flag else F.lit(False)
    if not exists(uri):
        rows = data.where(~F.col(DROP)) if DROP in extra else data
        rows = rows.drop(*extra).persist(PERSIST_LEVEL)
        try:
            r = rows.agg(F.count("*"), F.count_if(flagged_col)).first()
            n, flagged = int(r[0]), int(r[1])
            metrics = {
                "num_target_rows_inserted": n,
                "num_target_rows_updated": 0,
                "flagged_added": flagged,
                "unflagged_added": n - flagged,
            }
            C.replace(rows, uri, recorded(metrics), key=key, rows=n)
        finally:
            rows.unpersist()
        return metrics
    columns = [c for c in data.columns if c not in extra]
    # From the schema ``data.columns`` fetched (a select's would be one more analysis).
    incoming = T.StructType([f for f in data.schema.fields if f.name in columns])
    C.evolve(spark, uri, C.arrow_of(incoming), pin)
    known = known or candidates(spark, uri, data, key)
    by_file = broadcastable(data.count() if batch_rows is None else batch_rows, known.rows)

    # By file, the batch is broadcast to the tasks reading the table's files, one file a task;
    # else both sides are shuffled by key.
    s = (F.broadcast(data) if by_file else data).alias("s")

    def joined(target: DataFrame, how: str) -> tuple[DataFrame, Column, Callable[[str], Column]]:
        """``target`` (rows of the table, with their file) joined with the batch: the frame, the
        action each row takes, and the value each column gets."""
        table_columns = [c for c in target.columns if c != FILE_COLUMN]
        on = [F.col(f"s.`{k}`") == F.col(f"t.`{k}`") for k in key]
        newer = F.col(f"s.`{sequence}`") > F.col(f"t.`{sequence}`")
        if REBUILT in extra:
            newer = newer | F.col(f"s.`{REBUILT}`")
        dropped = F.col(f"s.`{DROP}`") if DROP in extra else F.lit(False)
        part = F.col(f"s.`{partial}`") if partial in extra else F.lit(None).cast("array<string>")
        action = (
            F.when(F.col(f"s.`{key[0]}`").isNull(), "keep")
            .when(F.col(f"t.{FILE_COLUMN}").isNull(), F.when(dropped, "none").otherwise("insert"))
            .when(dropped, "delete")
            .when(newer & part.isNull(), "full")
            .when(newer, "partial")
            .otherwise("keep")
        )

        def value(c: str) -> Column:
            mine = F.col(f"s.`{c}`") if c in columns else F.lit(None)
            theirs = F.col(f"t.`{c}`") if c in table_columns else F.lit(None)
            if c in key:
                return F.coalesce(F.col(f"s.`{c}`"), F.col(f"t.`{c}`")).alias(c)
            carried = mine if c.startswith("__") else F.when(F.array_contains(part, c), mine)
            if not c.startswith("__"):
                carried = carried.otherwise(theirs)
            return (
                F.when(action.isin("insert", "full"), mine)
                .when(action == "partial", carried)
                .otherwise(theirs)
                .alias(c)
            )

        return target.alias("t").join(s, on, how), action, value

    def changes(frame: DataFrame, action: Column, value: Callable[[str], Column]) -> list[Column]:
        """What ``per_file`` counts of each row: its file, action and flag, and its old flag."""
        return [
            F.col(f"t.{FILE_COLUMN}").alias(FILE_COLUMN), action.alias(_ACTION),
            (value(flag) if flag else F.lit(False)).alias(_FLAG),
            (F.col(f"t.`{flag}`") if flag else F.lit(False)).alias(_WAS_FLAGGED),
            *([F.col(f"t.{ROW_COLUMN}").alias(ROW_COLUMN)] if on_read else []),
        ]  # fmt: skip

    def attempt() -> dict[str, int]:
        dt = open_table(uri)
        if pin is not None:
            pin.check(dt.version())
        target = _targets(spark, uri, dt, data, key, known, on_read)
        names = [c for c in target.columns if c not in (FILE_COLUMN, ROW_COLUMN)]
        names += [c for c in columns if c not in names]
        if not by_file:
            # Every row of the candidate files and of the batch, kept for the count and the
            # write: one join.
            frame, action, value = joined(target, "full_outer")
            out = frame.select(*[value(c) for c in names], *changes(frame, action, value))
            out = out.persist(PERSIST_LEVEL)
            try:
                metrics, rewritten, kept = _per_file(out)
                if on_read:
                    changed = out.where(F.col(_ACTION).isin(*_GAINS))
                    gone = out.where(F.col(_ACTION).isin(*_LOSSES)).select(FILE_COLUMN, ROW_COLUMN)
                    beside(dt, metrics, changed.select(*names), gone)
                    return metrics
                rows = out.where(
                    (F.col(_ACTION) == "insert")
                    | (F.col(FILE_COLUMN).isin(*rewritten) & (F.col(_ACTION) != "delete"))
                ).select(*names)
                hint = metrics["num_target_rows_inserted"] + kept
                commit(dt, metrics, rewritten, rows, None, hint)
            finally:
                out.unpersist()
            return metrics
        # First the table's rows of the batch's keys (only their key, sequence and flag columns
        # are read), and the batch's rows of keys it does not hold: which files change, and how.
        fresh_held = (
            held is not None
            and known.version == dt.version()
            and (not on_read or ROW_COLUMN in held.columns)
        )
        frame, action, value = joined(held if fresh_held else target, "inner")
        hits = frame.select(
            *[F.col(f"t.`{k}`").alias(k) for k in key], *changes(frame, action, value)
        )
        hits = hits.persist(PERSIST_LEVEL)
        try:
            fresh = data.where(F.col(f"`{key[0]}`").isNotNull())
            fresh = fresh.where(~F.col(DROP)) if DROP in extra else fresh
            fresh = fresh.join(F.broadcast(hits.select(*key)), key, "left_anti").select(
                *[
                    F.col(f"`{c}`")
                    if c in columns
                    else F.lit(None).cast(target.schema[c].dataType).alias(c)
                    for c in names
                ]
            )
            new = fresh.select(
                F.lit(None).cast("string").alias(FILE_COLUMN), F.lit("insert").alias(_ACTION),
                flagged_col.alias(_FLAG), F.lit(False).alias(_WAS_FLAGGED),
            )  # fmt: skip
            metrics, rewritten, _ = _per_file(
                hits.drop(*key).unionByName(new, allowMissingColumns=True)
            )
            if on_read:
                gone = hits.where(F.col(_ACTION).isin(*_LOSSES)).select(FILE_COLUMN, ROW_COLUMN)
                # A full update's new row is the batch's; a partial one's takes the rest of its
                # row from the table: the files holding one are read.
                full = frame.where(action == "full").select(
                    *[
                        F.col(f"s.`{c}`").alias(c)
                        if c in columns
                        else F.lit(None).cast(target.schema[c].dataType).alias(c)
                        for c in names
                    ]
                )
                changed = fresh.unionByName(full)
                patched = sorted(metrics.pop("patched_files"))
                if patched:
                    paths = [absolute_path(uri, f) for f in patched]
                    again, action2, value2 = joined(
                        read(spark, uri, only_files=paths, with_file=True), "inner"
                    )
                    changed = changed.unionByName(
                        again.where(action2 == "partial").select(*[value2(c) for c in names])
                    )
                beside(dt, metrics, changed, gone)
                return metrics
            # Then the files that change, read again whole, each row with its key's batch row.
            paths = [absolute_path(uri, f) for f in sorted(rewritten)]
            frame, action, value = joined(
                read(spark, uri, only_files=paths, with_file=True), "left"
            )
            again = frame.where(action != "delete").select(*[value(c) for c in names])
            commit(dt, metrics, rewritten, fresh, again, None)
        finally:
            hits.unpersist()
        return metrics

    def beside(dt: DeltaTable, metrics: dict[str, int], rows: DataFrame, gone: DataFrame) -> None:
        """Write ``rows`` and mark ``gone`` (``_write_beside``); only the state when nothing
        changes."""
        metrics.pop("patched_files", None)
        new = metrics["num_target_rows_inserted"] + metrics["num_target_rows_updated"]
        if new or metrics["num_target_rows_deleted"]:
            _write_beside(uri, dt, rows, gone, key, recorded(metrics), new, pin)
        else:
            C.record_state(uri, recorded(metrics), pin)

    def commit(
        dt: DeltaTable,
        metrics: dict[str, int],
        rewritten: set[str],
        rows: DataFrame,
        again: DataFrame | None,
        rows_hint: int | None,
    ) -> None:
        """Write ``rows`` (and ``again``: see ``_rewrite``) in place of ``rewritten``; only the
        state when nothing changes."""
        metrics.pop("patched_files", None)
        if metrics["num_target_rows_inserted"] or rewritten:
            _rewrite(uri, dt, rows, rewritten, key, recorded(metrics), rows_hint, True, again, pin)
        else:
            C.record_state(uri, recorded(metrics), pin)

    with one_file_a_task(spark) if by_file else nullcontext():
        return _retrying(attempt)


def _per_file(changes: DataFrame) -> tuple[dict[str, int], set[str], int]:
    """From a row per change (``FILE_COLUMN``, ``_ACTION``, ``_FLAG``, ``_WAS_FLAGGED``; one
    aggregate, a row per file): the merge's metrics, the files it rewrites, and the rows they
    keep. ``flagged_added`` and ``unflagged_added``: the rows the commit adds less those it
    removes, flagged and not (a changed row's flag for its old one, a new row's, less a deleted
    one's; rows kept as they were cancel out). The rows kept are those of ``changes``."""
    action, now, was = F.col(_ACTION), F.col(_FLAG), F.col(_WAS_FLAGGED)
    gains = action.isin("insert", "full", "partial")
    losses = action.isin("full", "partial", "delete")
    per_file = (
        changes.groupBy(FILE_COLUMN)
        .agg(
            F.count("*").alias("rows"),
            F.count_if(action == "insert").alias("inserted"),
            F.count_if(action.isin("full", "partial")).alias("updated"),
            F.count_if(action == "partial").alias("patched"),
            F.count_if(action == "delete").alias("deleted"),
            (F.count_if(gains & now) - F.count_if(losses & was)).alias("flagged"),
            (F.count_if(gains & ~now) - F.count_if(losses & ~was)).alias("unflagged"),
        )
        .collect()
    )
    changed = [r for r in per_file if r[FILE_COLUMN] is not None and r["updated"] + r["deleted"]]
    metrics = {
        "num_target_rows_inserted": sum(r["inserted"] for r in per_file),
        "num_target_rows_updated": sum(r["updated"] for r in per_file),
        "num_target_rows_deleted": sum(r["deleted"] for r in per_file),
        "flagged_added": sum(r["flagged"] for r in per_file),
        "unflagged_added": sum(r["unflagged"] for r in per_file),
        # Files holding a partial update (popped before the metrics are recorded).
        "patched_files": {r[FILE_COLUMN] for r in per_file if r["patched"]},
    }
    kept = sum(r["rows"] - r["deleted"] for r in changed)
    return metrics, {r[FILE_COLUMN] for r in changed}, kept


def _hits(marked: DataFrame) -> tuple[set[str], int, int]:
    """Of rows flagged ``__hit`` (one aggregate, a row per file): the files holding a hit, the
    hits, and the rows those files keep."""
    per_file = (
        marked.groupBy(FILE_COLUMN)
        .agg(F.count("*").alias("rows"), F.count_if("__hit").alias("hits"))
        .collect()
    )
    rewritten = {r[FILE_COLUMN] for r in per_file if r["hits"]}
    hits = sum(r["hits"] for r in per_file)
    kept = sum(r["rows"] - r["hits"] for r in per_file if r[FILE_COLUMN] in rewritten)
    return rewritten, hits, kept


def replace_keys(
    spark: SparkSession,
    uri: str,
    rows: DataFrame,
    keys: DataFrame,
    key: list[str],
    state: TableState | None,
    count: int | None = None,
    compact: bool = False,
) -> tuple[int, int]:
    """Replace every row whose ``key`` is one of ``keys`` (a frame of key columns; null-safe)
    by ``rows`` (``count`` of them, when known), in one commit recording ``state``; a new table
    is created from ``rows``. ``compact``: fold the table's small files in (``_rewrite``), for
    a table no reader takes apart by its files (not a change log). Returns (rows written, rows
    of those keys replaced)."""
    if not exists(uri):
        rows = rows.persist(PERSIST_LEVEL)
        try:
            n = rows.count()
            C.replace(rows, uri, state, rows=n)
        finally:
            rows.unpersist()
        return n, 0
    wanted = keys.select(*[F.col(f"`{k}`") for k in key]).distinct()
    wanted = wanted.withColumn("__hit", F.lit(True))
    rows = rows.persist(PERSIST_LEVEL)
    inserted = rows.count() if count is None else count

    def attempt() -> tuple[int, int]:
        dt = open_table(uri)
        target = _targets(spark, uri, dt, keys, key)
        on = [target[f"`{k}`"].eqNullSafe(wanted[f"`{k}`"]) for k in key]
        marked = target.join(wanted, on, "left").select(
            target["*"], F.coalesce(F.col("__hit"), F.lit(False)).alias("__hit")
        )
        marked = marked.persist(PERSIST_LEVEL)
        try:
            rewritten, removed, kept = _hits(marked)
            survivors = marked.where(F.col(FILE_COLUMN).isin(*rewritten) & ~F.col("__hit"))
            out = survivors.drop(FILE_COLUMN, "__hit").unionByName(rows, allowMissingColumns=True)
            _rewrite(uri, dt, out, rewritten, key, state, inserted + kept, compact)
        finally:
            marked.unpersist()
        return inserted, removed

    try:
        return _retrying(attempt)
    finally:
        rows.unpersist()


def rewrite_keys(
    spark: SparkSession,
    uri: str,
    rows: DataFrame,
    keys: DataFrame,
    held: dict[str, int],
    key: list[str],
    state: TableState | None,
    count: int,
    version: int,
    few: bool,
    compact: bool = False,
    on_read: bool = False,
) -> None:
    """Replace every row of ``keys`` (a frame of key columns, each key once) by ``rows``
    (``count`` of them), where the caller found the files of version ``version`` that hold
    those keys' rows: ``held`` maps each (a path as ``FILE_COLUMN`` gives it) to its rows of
    them. Those files are written again without those rows, with ``rows``, in one commit against
    ``version`` recording ``state``: ``replace_keys`` without looking for the keys' rows.
    ``few``: ``keys`` are sent to the tasks reading the files. ``compact``: see ``_rewrite``.
    ``on_read``: the rows of ``keys`` are marked in deletion vectors (``_write_beside``)."""
    dt = open_table(uri, version)
    out = rows
    if on_read:
        paths = [absolute_path(uri, f) for f in sorted(held)]
        target = read(spark, uri, only_files=paths, with_file=True, with_position=True, columns=key)
        wanted = F.broadcast(keys) if few else keys
        on = [target[f"`{k}`"].eqNullSafe(wanted[f"`{k}`"]) for k in key]
        gone = target.join(wanted, on, "left_semi").select(FILE_COLUMN, ROW_COLUMN)
        _write_beside(uri, dt, rows, gone, key, state, count)
        return
    if held:
        sizes = add_actions(dt).select(["path", "num_records"]).to_pylist()
        kept = sum(a["num_records"] or 0 for a in sizes if a["path"] in held) - sum(held.values())
        paths = [absolute_path(uri, f) for f in sorted(held)]
        target = read(spark, uri, only_files=paths)
        wanted = F.broadcast(keys) if few else keys
        on = [target[f"`{k}`"].eqNullSafe(wanted[f"`{k}`"]) for k in key]
        others = target.join(wanted, on, "left_anti")
        out = others.unionByName(rows, allowMissingColumns=True)
        count += kept
    _rewrite(uri, dt, out, set(held), key, state, count, compact)


def delete_rows(
    spark: SparkSession,
    uri: str,
    condition: Column,
    state: TableState | None = None,
    only_dates: list[str] | None = None,
    by_file: bool = False,
    pin: Pin | None = None,
    on_read: bool = False,
) -> int:
    """Delete the rows matching ``condition`` by rewriting the files that hold one (only the
    files of the ``ingest_date`` partitions ``only_dates`` are read, when given); returns rows
    deleted. Records ``state`` (when given) even when nothing matched. ``by_file``: each file
    is rewritten as itself, in its own task, so a sorted file stays sorted and keeps its key
    range (a current table's: its files are few); else Spark may pack several small files into
    one task and write them as one. ``pin``: see ``upsert_newer``. ``on_read``: the rows are
    marked in deletion vectors instead (``_write_beside``)."""
    if not exists(uri):
        return 0

    def attempt() -> int:
        dt = open_table(uri)
        if pin is not None:
            pin.check(dt.version())
        actions = add_actions(dt)
        relative = actions["path"].to_pylist()
        if only_dates is not None and actions.num_rows:
            dates = actions[f"partition.{PARTITION_COLUMN}"].to_pylist()
            relative = [p for p, d in zip(relative, dates, strict=True) if str(d) in only_dates]
        paths = [absolute_path(uri, f) for f in relative]
        target = read(spark, uri, only_files=paths, with_file=True, with_position=on_read)
        marked = target.withColumn("__hit", F.coalesce(condition, F.lit(False))).persist(
            PERSIST_LEVEL
        )
        try:
            rewritten, deleted, _ = _hits(marked)
            if rewritten and on_read:
                gone = marked.where(F.col("__hit")).select(FILE_COLUMN, ROW_COLUMN)
                key = (state.key if state is not None else None) or []
                _write_beside(uri, dt, None, gone, key, state, None, pin)
            elif rewritten:
                keep = marked.where(F.col(FILE_COLUMN).isin(*rewritten) & ~F.col("__hit"))
                keep = keep.drop(ROW_COLUMN) if on_read else keep
                schema = pa.schema(dt.schema())
                out = C.conform(keep, schema)
                adds = data_files.write(out, uri, dt.metadata().partition_columns)
                removes = data_files.removes(add_actions(dt), rewritten)
                C.commit(
                    uri, adds, removes, schema=schema, read_version=dt.version(),
                    props=C.properties(state, pinned=pin is not None), pin=pin,
                )  # fmt: skip
            elif state is not None:
                C.record_state(uri, state, pin)
        finally:
            marked.unpersist()
        return deleted

    with one_file_a_task(spark) if by_file else nullcontext():
        return _retrying(attempt)


# A file whose deletion vector marks at least this share of its rows is rewritten by ``purge``:
# every read decodes its DV and skips the dead rows.
PURGE_SHARE = 0.3


def purge(spark_of: Callable[[], SparkSession], uri: str, share: float = PURGE_SHARE) -> int:
    """Rewrite the files of ``uri`` whose deletion vectors mark at least ``share`` of their
    rows, with its small files once they are many (``small_files``), sorted by the table's key,
    in one commit; returns the files rewritten. ``spark_of`` gives the session, asked for only
    when a file is rewritten. A lost race is retried on the new snapshot."""
    if not exists(uri) or not deletion_vectors_of(uri):
        return 0

    def attempt() -> int:
        dt = open_table(uri)
        dvs = deletion_vectors_of(uri, dt)
        actions = add_actions(dt)
        rows = dict(
            zip(actions["path"].to_pylist(), actions["num_records"].to_pylist(), strict=True)
        )
        heavy = {
            p for p, n in rows.items()
            if unquote(p) in dvs and n and dvs[unquote(p)].cardinality >= share * n
        }  # fmt: skip
        if not heavy:
            return 0
        folded, _ = small_files(dt, heavy)
        chosen = heavy | set(folded)
        live = sum(
            (rows[p] or 0) - (dvs[unquote(p)].cardinality if unquote(p) in dvs else 0)
            for p in chosen
        )
        spark = spark_of()
        out = read(spark, uri, only_files=[absolute_path(uri, p) for p in sorted(chosen)])
        out = out.persist(PERSIST_LEVEL)
        try:
            key = table_state(uri).key
            out = C.sorted_by_key(out, key, live) if key else out
            adds = data_files.write(out, uri, dt.metadata().partition_columns, C.ROWS_PER_FILE)
            C.commit(uri, adds, data_files.removes(actions, chosen), read_version=dt.version())
        finally:
            out.unpersist()
        return len(chosen)

    return _retrying(attempt)
