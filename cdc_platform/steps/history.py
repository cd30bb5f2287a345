"""History step: change log -> SCD type 2 history, recomputing the keys the change log's new or
removed files touch."""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from cdc_platform.catalog import TableConfig
from cdc_platform.lake import delta as lake
from cdc_platform.spark import history


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
