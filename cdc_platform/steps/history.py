"""History step: change log -> SCD type 2 history, recomputing the keys the change log's new or
removed files touch."""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession
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
    or with ``full_refresh``, every key is recomputed.
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
    truncates = history.truncates_of(changelog)
    fingerprint = hashlib.sha256(json.dumps(truncates).encode()).hexdigest()[:16]
    new_state = lake.TableState(key=key, changelog_version=cl_version, truncates=fingerprint)
    columns = [f.name for f in changelog.schema["after"].dataType.fields]
    tracked = table.tracked_columns([c for c in columns if c not in key])
    changed = None
    if applied is not None and state.truncates == fingerprint:
        changed = lake.files_changed_since(cl_uri, applied)
    if changed is None:  # first run, full refresh, truncates changed, or old files vacuumed
        rows = history.history_rows(
            changelog, key, tracked, table.ignore_null_updates, truncates=truncates
        ).persist(PERSIST_LEVEL)
        try:
            written = rows.count()
            removed = lake.row_count(h_uri)
            lake.replace(rows, h_uri, new_state)
        finally:
            rows.unpersist()
        return HistoryResult(h_uri, written, removed, written, lake.version(h_uri), cl_version)
    affected = history.touched_keys(lake.read(spark, cl_uri, only_files=changed), key)
    new = history.history_rows(
        changelog, key, tracked, table.ignore_null_updates, affected, truncates
    ).persist(PERSIST_LEVEL)
    old = lake.read(spark, h_uri).join(affected.select("key.*"), key, "left_semi")
    old = old.persist(PERSIST_LEVEL)
    try:
        # Versions that are new or differ, and versions (by key and start) that are gone: only
        # the keys with either are rewritten.
        ids = [*key, history.START_AT]
        have = set(old.columns)
        added = new.exceptAll(
            old.select(
                *[
                    F.col(f.name) if f.name in have else F.lit(None).cast(f.dataType).alias(f.name)
                    for f in new.schema.fields
                ]
            )
        )
        gone = old.select(*ids).join(new.select(*ids), ids, "left_anti")
        counts = (
            added.select(*key, F.lit(1).alias("a"), F.lit(0).alias("g"))
            .unionByName(gone.select(*key, F.lit(0).alias("a"), F.lit(1).alias("g")))
            .persist(PERSIST_LEVEL)
        )
        totals = counts.agg(F.sum("a"), F.sum("g")).first()
        written, removed = int(totals[0] or 0), int(totals[1] or 0)
        changed_keys = counts.select(*key).distinct()
        if written or removed:
            lake.replace_keys(
                spark, h_uri, new.join(changed_keys, key, "left_semi"), changed_keys, key,
                new_state,
            )  # fmt: skip
        else:
            lake.record_state(h_uri, new_state)
        counts.unpersist()
    finally:
        new.unpersist()
        old.unpersist()
    return HistoryResult(
        h_uri, written, removed, lake.row_count(h_uri), lake.version(h_uri), cl_version
    )
