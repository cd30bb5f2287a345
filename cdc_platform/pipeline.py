"""The pipeline steps, shared by the Dagster assets and the command line.

raw (messages as received) -> changelog (canonical typed change records per table, + quarantine)
-> current (one row per key). Each step is idempotent: raw and changelog replace whole
``ingest_date`` partitions, and current merges by sequence, so any step can be rerun.
"""

import json
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
from cdc_platform.spark import apply, normalize


@dataclass
class TableChanges:
    """What normalization wrote for one table."""

    name: str
    qualified: str
    key: list[str]
    ops: dict[str, int]
    version: int | None
    max_event_time: datetime | None = None
    declared: bool = True


@dataclass
class NormalizeResult:
    messages: int = 0
    quarantined: int = 0
    control: int = 0
    ddl: int = 0
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    tables: dict[str, TableChanges] = field(default_factory=dict)


@dataclass
class MergeResult:
    inserted: int
    updated: int
    rows: int
    deleted_rows: int
    version: int | None
    changelog_version: int | None
    truncated: int = 0
    tombstones_purged: int = 0


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
    """Raw partitions ``dates`` -> each table's changelog partitions and the quarantine."""
    raw = lake.read(spark, lake.table_uri(warehouse, lake.RAW, source.name))
    result = NormalizeResult()
    if raw is None:
        return result
    raw = raw.where(F.col("ingest_date").isin(*dates))
    parsed = normalize.parse_messages(raw, source).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        kinds = {r["kind"]: r["count"] for r in parsed.groupBy("kind").count().collect()}
        result.messages = sum(kinds.values())
        result.control = kinds.get(C.KIND_CONTROL, 0)
        result.ddl = kinds.get(C.KIND_DDL, 0)
        changes = parsed.where(F.col("kind") == C.KIND_CHANGE)
        known = {
            st["qualified"]: (st["key"], lake.image_types(uri))
            for uri in lake.tables_under(warehouse, lake.CHANGELOG, source.name)
            if "key" in (st := lake.state(uri))
        }
        plans = normalize.plan_tables(changes, source, key_override, types_override, known)
        errors = normalize.to_quarantine(parsed.where(F.col("kind") == C.KIND_ERROR))
        quarantine = [errors.toArrow()]
        for plan in plans.values():
            if plan.problem:
                # No key: nothing of it can be applied; its rows wait in quarantine.
                quarantine.append(normalize.rejected_table(changes, plan).toArrow())
                continue
            # One pass types the table's changes; the rows with a reason are its rejects.
            typed = normalize.type_changes(changes, plan).toArrow()
            good = pc.is_null(typed["reason"])
            bad = typed.filter(pc.invert(good)).drop_columns(["key"])
            bad = bad.rename_columns(["key" if c == "raw_key" else c for c in bad.column_names])
            quarantine.append(bad.select(list(normalize.QUARANTINE_COLUMNS)))
            data = typed.filter(good).drop_columns(
                ["reason", "timestamp", "qualified_table", "raw_key", "value"]
            )
            uri = lake.table_uri(warehouse, lake.CHANGELOG, source.name, plan.name)
            version = lake.overwrite_partitions(
                uri,
                data,
                dates,
                metadata={
                    lake.STATE_KEY: json.dumps({"key": plan.key, "qualified": plan.qualified})
                },
            )
            ops = data.group_by("op").aggregate([("op", "count")]).to_pylist()
            result.tables[plan.name] = TableChanges(
                plan.name,
                plan.qualified,
                plan.key,
                {r["op"]: r["op_count"] for r in ops},
                version,
                pc.max(data["event_time"]).as_py(),
                plan.declared,
            )
        q = pa.concat_tables(quarantine, promote_options="permissive")
        lake.overwrite_partitions(lake.table_uri(warehouse, lake.QUARANTINE, source.name), q, dates)
        reasons = q.group_by("reason").aggregate([("reason", "count")]).to_pylist()
        result.quarantine_reasons = {r["reason"]: r["reason_count"] for r in reasons}
        result.quarantined = sum(result.quarantine_reasons.values())
    finally:
        parsed.unpersist()
    return result


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
        return MergeResult(0, 0, 0, 0, lake.version(cur_uri), None)
    key = lake.state(cl_uri)["key"]
    state = {} if full_refresh else lake.state(cur_uri)
    applied = state.get("changelog_version")
    if applied == cl_version and lake.exists(cur_uri):
        return MergeResult(0, 0, *_live_counts(spark, cur_uri), lake.version(cur_uri), cl_version)
    new_files = lake.files_added_since(cl_uri, applied) if applied is not None else None
    batch = lake.read(spark, cl_uri, only_files=new_files)
    truncate = apply.latest_truncate(batch)
    truncated_before = max(filter(None, [state.get("truncated_before"), truncate]), default=None)
    new_state = {"changelog_version": cl_version, "truncated_before": truncated_before, "key": key}
    truncated = 0
    if truncate and truncate == truncated_before and lake.exists(cur_uri) and not full_refresh:
        # The merge below is what advances changelog_version: a crash here just reruns both.
        truncated = lake.delete_where(
            cur_uri,
            f"{lake.quoted(C.SEQUENCE_COL)} < '{truncate}'",
            {**state, "truncated_before": truncated_before},
        )
    rows = apply.latest_per_key(batch, key, truncated_before, options.ignore_null_updates).toArrow()
    if full_refresh:
        lake.replace(cur_uri, rows.drop_columns([apply.PARTIAL_COL]), new_state)
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
        int(metrics.get("num_target_rows_inserted", 0)),
        int(metrics.get("num_target_rows_updated", 0)),
        live,
        deleted,
        lake.version(cur_uri),
        cl_version,
        truncated,
        purged,
    )


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
