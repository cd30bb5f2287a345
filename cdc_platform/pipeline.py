"""The pipeline steps, shared by the Dagster assets and the command line.

raw (messages as received) -> changelog (canonical typed change records per table, plus the DDL
and control logs and the quarantine) -> current (one row per key) and history (SCD type 2).
Every step can be rerun. Raw of a files source replaces whole ``ingest_date`` partitions (or the
rows of the files read again); raw of a Kafka source only appends, each batch once
(``ingest.kafka``). The change log appends incremental batches (``normalize_new``: the raw
batches of a Kafka source not normalized yet; each commit records the raw version it reflects,
so a rerun after a crash skips what is done) or replaces the ``ingest_date`` partitions of the
run's dates (``normalize_source``: files sources, and backfills of any source). Current and
history merge by sequence; a merge after a replaced partition rebuilds the keys whose change
records went away, so backfills leave the same tables as a rebuild.
"""

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.formats import canonical as C
from cdc_platform.ingest import landing
from cdc_platform.lake import delta as lake
from cdc_platform.spark import apply, history, normalize

PREVIEW_ROWS = 10


@dataclass(kw_only=True)
class TableChanges:
    """What normalization wrote for one table."""

    name: str
    qualified: str
    key: list[str]
    ops: dict[str, int]
    version: int | None
    max_event_time: datetime | None = None
    sample: pa.Table | None = None  # the first rows written, for previews


@dataclass
class NormalizeResult:
    messages: int = 0
    quarantined: int = 0
    control: int = 0
    ddl: int = 0
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    tables: dict[str, TableChanges] = field(default_factory=dict)
    ddl_by_table: dict[str, int] = field(default_factory=dict)
    max_control_time: datetime | None = None  # newest heartbeat / transaction marker

    def add(self, other: "NormalizeResult") -> None:
        """Fold in a later step's result (an incremental run that finished a crashed one)."""
        self.messages += other.messages
        self.quarantined += other.quarantined
        self.control += other.control
        self.ddl += other.ddl
        for reason, n in other.quarantine_reasons.items():
            self.quarantine_reasons[reason] = self.quarantine_reasons.get(reason, 0) + n
        for name, n in other.ddl_by_table.items():
            self.ddl_by_table[name] = self.ddl_by_table.get(name, 0) + n
        for name, t in other.tables.items():
            if mine := self.tables.get(name):
                t.ops = {op: mine.ops.get(op, 0) + t.ops.get(op, 0) for op in {*mine.ops, *t.ops}}
                t.max_event_time = max(
                    filter(None, [mine.max_event_time, t.max_event_time]), default=None
                )
            self.tables[name] = t
        times = filter(None, [self.max_control_time, other.max_control_time])
        self.max_control_time = max(times, default=None)


@dataclass(kw_only=True)
class MergeResult:
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


def ingest_files(
    warehouse: Path, source: str, files: list[tuple[Path, str]], date: str, whole_date: bool
) -> int:
    """Landing files of one ingest date -> raw. ``whole_date`` replaces the date's partition
    (the files are all of that date); otherwise only the rows of these files are replaced."""
    data = landing.read_files(files, date, topic=source)
    uri = lake.table_uri(warehouse, lake.RAW, source)
    if whole_date or not lake.exists(uri):
        lake.overwrite_partitions(uri, data, [date])
    else:
        names = ", ".join("'" + n.replace("'", "''") + "'" for _, n in files)
        lake.replace_where(uri, data, f"ingest_date = '{date}' AND file IN ({names})")
    return data.num_rows


def normalize_source(
    spark: SparkSession,
    warehouse: Path,
    source: SourceConfig,
    dates: list[str],
    key_override: list[str] | None = None,
    types_override: dict[str, str] | None = None,
) -> NormalizeResult:
    """Raw partitions ``dates`` -> replace those partitions of each table's change log, DDL log,
    the control log and the quarantine (files sources; backfills of any source). For a Kafka
    source the raw batches not normalized yet are appended first, so afterwards every output
    reflects the same raw version and the next incremental run starts from there."""
    raw_uri = lake.table_uri(warehouse, lake.RAW, source.name)
    version = lake.version(raw_uri)
    if version is None:
        return NormalizeResult()
    if source.transport == "kafka":
        normalize_new(spark, warehouse, source, key_override, types_override, upto=version)
    raw = lake.read(spark, raw_uri, only_files=lake.files(raw_uri, version))
    raw = raw.where(F.col("ingest_date").isin(*dates))
    return _normalize(spark, warehouse, source, raw, version, dates, key_override, types_override)


def normalize_new(
    spark: SparkSession,
    warehouse: Path,
    source: SourceConfig,
    key_override: list[str] | None = None,
    types_override: dict[str, str] | None = None,
    upto: int | None = None,
) -> NormalizeResult:
    """Raw batches added since the last run -> appended to every output (Kafka sources, whose
    raw table only grows), so a run costs what arrived, not the whole day.

    Exactly once: each output commit records the raw version it reflects (``lake.
    append_normalized``) and the quarantine is written last. A run that died between outputs
    left some at a newer version than the quarantine: that same range is finished first (the
    outputs that have it skip it), then the rest."""
    raw_uri = lake.table_uri(warehouse, lake.RAW, source.name)
    upto = lake.version(raw_uri) if upto is None else upto
    result = NormalizeResult()
    if upto is None:
        return result
    finished = lake.normalized_raw_version(lake.table_uri(warehouse, lake.QUARANTINE, source.name))
    outputs = _normalize_outputs(warehouse, source)
    started = max(
        (v for uri in outputs if (v := lake.normalized_raw_version(uri)) is not None),
        default=None,
    )
    steps = []
    if started is not None and (finished is None or started > finished):
        steps.append((finished, started))  # finish the interrupted run first
        finished = started
    if finished is None or upto > finished:
        steps.append((finished, upto))
    for low, high in steps:
        raw = lake.read(spark, raw_uri, only_files=lake.files_between(raw_uri, low, high))
        result.add(
            _normalize(spark, warehouse, source, raw, high, None, key_override, types_override)
        )
    return result


def _normalize_outputs(warehouse: Path, source: SourceConfig) -> list[str]:
    """Every table a normalize step of ``source`` writes (that exists)."""
    return [
        *lake.tables_under(warehouse, lake.CHANGELOG, source.name),
        *lake.tables_under(warehouse, lake.DDL, source.name),
        *[
            uri
            for layer in (lake.CONTROL, lake.QUARANTINE)
            if lake.exists(uri := lake.table_uri(warehouse, layer, source.name))
        ],
    ]


@dataclass
class SplitChanges:
    """Parsed messages sorted out: each keyed table's typed change records, and the quarantine
    rows (errors, unkeyed tables, values that do not fit their type)."""

    tables: list[tuple[normalize.TablePlan, pa.Table]]
    quarantine: list[pa.Table]


def split_parsed(
    warehouse: Path,
    source: SourceConfig,
    parsed: DataFrame,
    key_override: list[str] | None = None,
    types_override: dict[str, str] | None = None,
) -> SplitChanges:
    """Plan, key and type the change records of ``parsed`` per table (keys and types already in
    the warehouse's change logs are kept); everything that fails goes to the quarantine rows."""
    changes = parsed.where(F.col("kind") == C.KIND_CHANGE)
    known = {
        st["qualified"]: (st["key"], lake.image_types(uri))
        for uri in lake.tables_under(warehouse, lake.CHANGELOG, source.name)
        if "key" in (st := lake.state(uri))
    }
    plans = normalize.plan_tables(changes, source, key_override, types_override, known)
    split = SplitChanges(
        [], [normalize.to_quarantine(parsed.where(F.col("kind") == C.KIND_ERROR)).toArrow()]
    )
    for plan in plans.values():
        if plan.problem:
            # No key: nothing of it can be applied; its rows wait in quarantine.
            split.quarantine.append(normalize.rejected_table(changes, plan).toArrow())
            continue
        # One pass types the table's changes; the rows with a reason are its rejects.
        typed = normalize.type_changes(changes, plan).toArrow()
        good = pc.is_null(typed["reason"])
        bad = typed.filter(pc.invert(good)).drop_columns(["key"])
        bad = bad.rename_columns(["key" if c == "raw_key" else c for c in bad.column_names])
        split.quarantine.append(bad.select(list(normalize.QUARANTINE_COLUMNS)))
        data = typed.filter(good).drop_columns(
            ["reason", "timestamp", "qualified_table", "raw_key", "value"]
        )
        split.tables.append((plan, data))
    return split


def _normalize(
    spark: SparkSession,
    warehouse: Path,
    source: SourceConfig,
    raw: DataFrame,
    raw_version: int,
    dates: list[str] | None,
    key_override: list[str] | None,
    types_override: dict[str, str] | None,
) -> NormalizeResult:
    """Parse ``raw`` and write each output: replacing the partitions ``dates``, or appending
    (``dates`` None). Every commit records ``raw_version``."""

    def write(uri: str, data: pa.Table, metadata: dict[str, str] | None = None) -> int | None:
        if dates is not None:
            return lake.overwrite_partitions(uri, data, dates, metadata, raw_version)
        return lake.append_normalized(uri, data, raw_version, metadata)

    result = NormalizeResult()
    parsed = normalize.parse_messages(raw, source).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        kinds = {r["kind"]: r["count"] for r in parsed.groupBy("kind").count().collect()}
        result.messages = sum(kinds.values())
        result.control = kinds.get(C.KIND_CONTROL, 0)
        result.ddl = kinds.get(C.KIND_DDL, 0)
        split = split_parsed(warehouse, source, parsed, key_override, types_override)
        quarantine = split.quarantine
        for plan, data in split.tables:
            uri = lake.table_uri(warehouse, lake.CHANGELOG, source.name, plan.name)
            state = json.dumps({"key": plan.key, "qualified": plan.qualified})
            version = write(uri, data, {lake.STATE_KEY: state})
            ops = data.group_by("op").aggregate([("op", "count")]).to_pylist()
            result.tables[plan.name] = TableChanges(
                name=plan.name,
                qualified=plan.qualified,
                key=plan.key,
                ops={r["op"]: r["op_count"] for r in ops},
                version=version,
                max_event_time=pc.max(data["event_time"]).as_py(),
                sample=data.slice(0, PREVIEW_ROWS),
            )
        if dates is not None:
            # A table the reprocessed dates no longer hold keeps no stale rows for them.
            written = {plan.name for plan, _ in split.tables}
            for uri in lake.tables_under(warehouse, lake.CHANGELOG, source.name):
                if (name := Path(uri).name) not in written:
                    st = lake.state(uri)
                    version = write(uri, lake.arrow_schema(uri).empty_table())
                    result.tables[name] = TableChanges(
                        name=name,
                        qualified=st.get("qualified", name),
                        key=st["key"],
                        ops={},
                        version=version,
                    )
        result.ddl_by_table = _write_ddl_log(warehouse, source, parsed, write, dates is None)
        control = normalize.control_records(parsed).toArrow()
        write(lake.table_uri(warehouse, lake.CONTROL, source.name), control)
        result.max_control_time = pc.max(control["event_time"]).as_py()
        # Last: its recorded raw version is where the next incremental run starts.
        q = pa.concat_tables(quarantine, promote_options="permissive")
        write(lake.table_uri(warehouse, lake.QUARANTINE, source.name), q)
        reasons = q.group_by("reason").aggregate([("reason", "count")]).to_pylist()
        result.quarantine_reasons = {r["reason"]: r["reason_count"] for r in reasons}
        result.quarantined = sum(result.quarantine_reasons.values())
    finally:
        parsed.unpersist()
    return result


# A key nothing is left of: a tombstone-like row (non-null flags, as the table has them) that
# the MERGE deletes.
_GONE = {C.DELETED_COL: True, C.PARTIAL_NEWEST_COL: False}


def _rebuild_keys(
    spark: SparkSession,
    cl_uri: str,
    cur_uri: str,
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
      must go. A key with no change left is deleted from the table (``DROP``)."""
    current = lake.read(spark, cur_uri)
    wanted = []
    if C.PARTIAL_NEWEST_COL in current.columns:
        fragile = current.where(F.col(C.PARTIAL_NEWEST_COL)).select(*key)
        wanted.append(newest.select(*key).join(fragile, key, "left_semi"))
    if removed is not None:
        wanted.append(history.touched_keys(removed, key).select("key.*"))
    if not wanted:
        return newest
    touched = functools.reduce(DataFrame.unionByName, wanted).distinct().persist()
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
        return (
            untouched.withColumns({lake.REBUILT: F.lit(False), lake.DROP: F.lit(False)})
            .unionByName(rebuilt.withColumns({lake.REBUILT: F.lit(True), lake.DROP: F.lit(False)}))
            .unionByName(gone.withColumns({lake.REBUILT: F.lit(True), lake.DROP: F.lit(True)}))
        )
    finally:
        touched.unpersist()


def _write_ddl_log(
    warehouse: Path,
    source: SourceConfig,
    parsed: DataFrame,
    write: Callable[[str, pa.Table], int | None],
    appending: bool,
) -> dict[str, int]:
    """Each table's DDL statements into ddl/<source>/<table>. Replacing dates rewrites every DDL
    log of the source, so a reprocessed date never keeps stale rows; appending skips tables
    without new statements."""
    ddl = normalize.ddl_records(parsed).toArrow()
    names = [normalize.routed_name(q, source) for q in ddl["qualified_table"].to_pylist()]
    ddl = ddl.drop_columns(["qualified_table"])
    existing = (
        set()
        if appending
        else {Path(u).name for u in lake.tables_under(warehouse, lake.DDL, source.name)}
    )
    counts = {}
    for name in sorted(existing | set(names)):
        rows = ddl.filter(pa.array([n == name for n in names], pa.bool_()))
        write(lake.table_uri(warehouse, lake.DDL, source.name, name), rows)
        counts[name] = rows.num_rows
    return counts


def merge_current(
    spark: SparkSession,
    warehouse: Path,
    source: str,
    table: str,
    full_refresh: bool = False,
    options: TableConfig | None = None,
) -> MergeResult:
    """Merge the change-log files not yet applied into the current-state table.

    ``options``: the table's configuration (ignore_null_updates, tombstone retention)."""
    options = options or TableConfig(name=table)
    cl_uri = lake.table_uri(warehouse, lake.CHANGELOG, source, table)
    cur_uri = lake.table_uri(warehouse, lake.CURRENT, source, table)
    cl_version = lake.version(cl_uri)
    if cl_version is None:
        return MergeResult(version=lake.version(cur_uri), changelog_version=None)
    key = lake.state(cl_uri)["key"]
    state = {} if full_refresh else lake.state(cur_uri)
    applied = state.get("changelog_version")
    if applied == cl_version and lake.exists(cur_uri):
        live, deleted = _live_counts(spark, cur_uri)
        return MergeResult(
            rows=live,
            deleted_rows=deleted,
            version=lake.version(cur_uri),
            changelog_version=cl_version,
            live_before=live,
        )
    new_files = removed_files = None
    if applied is not None:
        new_files = lake.files_added_since(cl_uri, applied)
        removed_files = lake.files_removed_since(cl_uri, applied)
    batch = lake.read(spark, cl_uri, only_files=new_files)
    removed = lake.read(spark, cl_uri, only_files=removed_files) if removed_files else None
    if applied is not None and (
        new_files is None or removed_files is None or _truncates_gone(removed, batch)
    ):
        # What was applied can no longer be told apart (vacuumed versions), or a reprocessed
        # partition took a truncate away: only a rebuild from the whole change log is exact.
        full_refresh, state, applied, removed = True, {}, None, None
        batch = lake.read(spark, cl_uri)
    truncate = apply.latest_truncate(batch)
    truncated_before = max(filter(None, [state.get("truncated_before"), truncate]), default=None)
    new_state = {"changelog_version": cl_version, "truncated_before": truncated_before, "key": key}
    merging = lake.exists(cur_uri) and not full_refresh
    live_before = _live_counts(spark, cur_uri)[0] if merging else 0
    truncated = truncated_live = 0
    if truncate and truncate == truncated_before and merging:
        truncated_live = (
            lake.read(spark, cur_uri)
            .where((F.col(C.SEQUENCE_COL) < truncate) & ~F.col(C.DELETED_COL))
            .count()
        )
        # The merge below is what advances changelog_version: a crash here just reruns both.
        truncated = lake.delete_where(
            cur_uri,
            f"{lake.quoted(C.SEQUENCE_COL)} < '{truncate}'",
            {**state, "truncated_before": truncated_before},
        )
    newest = apply.latest_per_key(batch, key, truncated_before, options.ignore_null_updates)
    if merging:
        newest = apply.relative_to(newest, lake.read(spark, cur_uri), key)
        newest = _rebuild_keys(
            spark, cl_uri, cur_uri, newest, removed, key, truncated_before, options
        )
    else:
        newest = apply.without_working_columns(newest)
    newest = newest.persist()
    try:
        rows = newest.toArrow()
        made_live, made_dead = _live_effect(spark, cur_uri, newest, key, merging)
    finally:
        newest.unpersist()
    if full_refresh:
        lake.replace(cur_uri, rows.drop_columns([apply.PARTIAL_COL]), new_state, key=key)
        metrics = {"num_target_rows_inserted": rows.num_rows, "num_target_rows_updated": 0}
    else:
        metrics = lake.upsert_newer(
            cur_uri, rows, key, C.SEQUENCE_COL, apply.PARTIAL_COL, new_state
        )
    purged = 0
    if options.tombstone_retention_days:
        # Past the retention a tombstone goes; an event older than it arriving later could then
        # resurrect its key (as in AUTO CDC): choose the retention longer than any lateness.
        cutoff = datetime.now(UTC) - timedelta(days=options.tombstone_retention_days)
        purged = lake.delete_where(
            cur_uri,
            f"{lake.quoted(C.DELETED_COL)} AND {lake.quoted(C.EVENT_TIME_COL)}"
            f" < '{cutoff.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}'",
            new_state,
        )
    live, deleted = _live_counts(spark, cur_uri)
    return MergeResult(
        inserted=int(metrics.get("num_target_rows_inserted", 0)),
        updated=int(metrics.get("num_target_rows_updated", 0)),
        rows=live,
        deleted_rows=deleted,
        version=lake.version(cur_uri),
        changelog_version=cl_version,
        truncated=truncated,
        tombstones_purged=purged,
        live_before=live_before,
        truncated_live=truncated_live,
        made_live=made_live,
        made_dead=made_dead,
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


def _live_effect(
    spark: SparkSession, cur_uri: str, newest: DataFrame, key: list[str], merging: bool
) -> tuple[int, int]:
    """(keys the batch makes live that were not, keys it deletes that were live), computed apart
    from the MERGE by the same rule (a newer sequence or a rebuilt key wins), so the quality
    check comparing the balance with the table tests the merge."""
    deleted = F.col(C.DELETED_COL)
    if not merging:  # a new or rebuilt table: every live newest row is one more
        return newest.where(~deleted).count(), 0
    before = lake.read(spark, cur_uri).select(
        *key,
        F.col(C.SEQUENCE_COL).alias("__was_seq"),
        (~F.col(C.DELETED_COL)).alias("__was_live"),
    )
    rebuilt = F.col(lake.REBUILT) if lake.REBUILT in newest.columns else F.lit(False)
    joined = newest.select(*key, C.SEQUENCE_COL, C.DELETED_COL, rebuilt.alias("__rebuilt")).join(
        before, key, "left"
    )
    was = F.coalesce(F.col("__was_live"), F.lit(False))
    applies = (
        F.col("__was_seq").isNull()
        | (F.col(C.SEQUENCE_COL) > F.col("__was_seq"))
        | F.col("__rebuilt")
    )
    now = F.when(applies, ~deleted).otherwise(was)
    row = joined.agg(
        F.count(F.when(now & ~was, 1)).alias("made_live"),
        F.count(F.when(~now & was, 1)).alias("made_dead"),
    ).first()
    return int(row["made_live"]), int(row["made_dead"])


def replay(
    spark: SparkSession,
    warehouse: Path,
    files: list[Path],
    source: SourceConfig,
    default_date: str,
    key_override: list[str] | None = None,
    types_override: dict[str, str] | None = None,
) -> tuple[dict, NormalizeResult]:
    """Files -> raw -> changelog -> current for every table found; returns (summary, details).

    The summary counts the replayed change records by op and the live rows after the merge.
    """
    by_date: dict[str, list[tuple[Path, str]]] = {}
    for f in files:
        by_date.setdefault(landing.date_of(f, default_date), []).append((f, str(f.resolve())))
    for date, group in sorted(by_date.items()):
        ingest_files(warehouse, source.name, group, date, whole_date=False)
    result = normalize_source(
        spark,
        warehouse,
        source,
        sorted(by_date),
        key_override=key_override,
        types_override=types_override,
    )
    summary: dict = {"tables": {}, "quarantined": result.quarantined}
    for t in result.tables.values():
        merged = merge_current(
            spark, warehouse, source.name, t.name, options=source.table_config(t.name)
        )
        summary["tables"][t.qualified] = {
            "inserted": t.ops.get(C.INSERT, 0) + t.ops.get(C.READ, 0),
            "updated": t.ops.get(C.UPDATE, 0),
            "deleted": t.ops.get(C.DELETE, 0),
            "rows": merged.rows,
        }
    return summary, result


def routed_tables(warehouse: Path, source: SourceConfig) -> list[TableConfig]:
    """Tables of ``source`` that normalization routed without a declaration, as table configs
    (name and qualified source name), so the Dagster layer can give them assets too."""
    declared = {t.name for t in source.tables}
    found = []
    for uri in lake.tables_under(warehouse, lake.CHANGELOG, source.name):
        name = Path(uri).name
        if name not in declared:
            qualified = lake.state(uri).get("qualified", name)
            found.append(TableConfig(name=name, source_table=qualified))
    return found


def _live_counts(spark: SparkSession, cur_uri: str) -> tuple[int, int]:
    df = lake.read(spark, cur_uri)
    if df is None:
        return 0, 0
    r = df.agg(F.count_if(~F.col(C.DELETED_COL)), F.count_if(F.col(C.DELETED_COL))).first()
    return int(r[0]), int(r[1])


def current_rows(spark: SparkSession, warehouse: Path, source: str, table: str) -> DataFrame | None:
    """The exposed current state: live rows only, without the ``__`` bookkeeping columns."""
    df = lake.read(spark, lake.table_uri(warehouse, lake.CURRENT, source, table))
    if df is None:
        return None
    return df.where(~F.col(C.DELETED_COL)).drop(*C.CURRENT_META)


@dataclass
class HistoryResult:
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
    or with ``full_refresh``, every key is recomputed.
    """
    import hashlib  # imported here: this step is appended to the module

    from cdc_platform.spark import history

    cl_uri = lake.table_uri(warehouse, lake.CHANGELOG, source, table.name)
    h_uri = lake.table_uri(warehouse, lake.HISTORY, source, table.name)
    cl_version = lake.version(cl_uri)
    if cl_version is None:
        return HistoryResult(0, 0, lake.row_count(h_uri), lake.version(h_uri), None)
    key = lake.state(cl_uri)["key"]
    state = {} if full_refresh else lake.state(h_uri)
    applied = state.get("changelog_version")
    if applied == cl_version:
        return HistoryResult(0, 0, lake.row_count(h_uri), lake.version(h_uri), cl_version)
    changelog = lake.read(spark, cl_uri)
    truncates = history.truncates_of(changelog)
    fingerprint = hashlib.sha256(json.dumps(truncates).encode()).hexdigest()[:16]
    new_state = {"changelog_version": cl_version, "key": key, "truncates": fingerprint}
    columns = [f.name for f in changelog.schema["after"].dataType.fields]
    tracked = table.tracked_columns([c for c in columns if c not in key])
    changed = None
    if applied is not None and state.get("truncates") == fingerprint:
        changed = lake.files_changed_since(cl_uri, applied)
    if changed is None:  # first run, full refresh, truncates changed, or old files vacuumed
        data = _nullable(
            history.history_rows(
                changelog, key, tracked, table.ignore_null_updates, truncates=truncates
            ).toArrow()
        )
        removed = lake.row_count(h_uri)
        lake.replace(h_uri, data, new_state)
        return HistoryResult(data.num_rows, removed, data.num_rows, lake.version(h_uri), cl_version)
    affected = history.touched_keys(lake.read(spark, cl_uri, only_files=changed), key)
    data = _nullable(
        history.history_rows(
            changelog, key, tracked, table.ignore_null_updates, affected, truncates
        ).toArrow()
    )
    # Versions of the recomputed keys that no longer exist: the same MERGE deletes them.
    ids = [*key, history.START_AT]
    old = lake.read(spark, h_uri).join(affected.select("key.*"), key, "left_semi").select(*ids)
    gone = old.toArrow().join(data.select(ids), ids, join_type="left anti")
    merged = pa.concat_tables(
        [
            data.append_column("__drop", pa.repeat(False, data.num_rows)),
            gone.append_column("__drop", pa.repeat(True, gone.num_rows)),
        ],
        promote_options="permissive",
    )
    metrics = lake.replace_versions(h_uri, merged, key, history.START_AT, "__drop", new_state)
    written = metrics.get("num_target_rows_inserted", 0) + metrics.get("num_target_rows_updated", 0)
    return HistoryResult(
        int(written),
        int(metrics.get("num_target_rows_deleted", 0)),
        lake.row_count(h_uri),
        lake.version(h_uri),
        cl_version,
    )


def _nullable(data: pa.Table) -> pa.Table:
    """Every column nullable: MERGE sources carry null rows, and Spark's non-null flags would
    otherwise become Delta column constraints."""
    return data.cast(pa.schema([f.with_nullable(True) for f in data.schema]))
