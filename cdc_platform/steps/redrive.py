"""Redrive: re-process quarantined messages through the current configuration.

The messages are read again from raw (by the coordinates the quarantine recorded) and go through
the same normalization as the change-log step (``normalize.normalize``). Whatever now
succeeds is written to its change log (DDL and control logs too); then, last, the selected
quarantine rows are replaced by the rows that still fail (with their new reasons). A crash
between the two leaves a message in both places, never in neither, and a rerun is harmless:
outputs are replaced by ``sequence`` (unique per change record), so nothing is written twice,
and the merge into current ignores a change whose sequence it already applied.

A message whose success depends on another message of its batch stays: an ``UPDATE_BEFOR``
quarantined because its partner was missing is redriven alone, so it stays unpaired.
"""

from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.normalize import Normalized, normalize, routed_name
from cdc_platform.quality.frames import COORDINATES, coordinate_key
from cdc_platform.steps.current import merge_current
from cdc_platform.steps.history import update_history


@dataclass
class RedriveResult:
    selected: int = 0  # quarantined messages selected (distinct raw coordinates)
    redriven: int = 0  # of them, no longer in the quarantine
    remaining: int = 0  # still quarantined (possibly with a new reason)
    changes: dict[str, int] = field(default_factory=dict)  # change records written, by table
    reasons: dict[str, int] = field(default_factory=dict)  # reasons of the remaining rows


def _replace_by_sequence(
    spark: SparkSession, uri: str, data: DataFrame, state: lake.TableState | None
) -> None:
    """Write ``data`` into a partitioned table, replacing rows with the same sequences."""
    if not lake.exists(uri):
        props = lake.properties(state)
        lake.append(data, uri, partition_by=[lake.PARTITION_COLUMN], props=props)
        return
    lake.replace_keys(spark, uri, data, data.select("sequence"), ["sequence"], state)


def redrive(
    spark: SparkSession,
    warehouse: str,
    source: SourceConfig,
    reason: str | None = None,
    merge: bool = True,
) -> RedriveResult:
    """Re-process the quarantined messages of ``source`` (only those whose reason starts with
    ``reason``, if given); with ``merge``, merge the tables that received changes into current
    (and history)."""
    result = RedriveResult()
    q_uri = lake.TableRef(lake.QUARANTINE, source.name).uri(warehouse)
    raw_uri = lake.TableRef(lake.RAW, source.name).uri(warehouse)
    quarantine = lake.read(spark, q_uri)
    raw = lake.read(spark, raw_uri)
    if quarantine is None or raw is None:
        return result
    if reason:
        quarantine = quarantine.where(F.col("reason").startswith(reason))
    # The messages, not their rows (a Canal message may have several rejected rows).
    staging = lake.Staging(warehouse)
    try:
        selected = staging.keep(quarantine.select(*COORDINATES).dropDuplicates())
        result.selected = selected.count()
        if not result.selected:
            return result
        coords = selected.select(coordinate_key().alias("__coord"))
        again = raw.withColumn("__coord", coordinate_key()).join(coords, "__coord", "left_semi")
        known = lake.changelog_facts(warehouse, source.name)
        normalized = normalize(again.drop("__coord"), source, known, staging)
        _write_outputs(spark, warehouse, source, normalized, result)
        # Last: the selected rows leave the quarantine, the ones that still fail come back.
        still_bad = normalized.quarantine
        _requarantine(spark, q_uri, still_bad, selected)
        result.remaining = still_bad.select(*COORDINATES).distinct().count()
        reasons = still_bad.groupBy("reason").count().collect()
        result.reasons = {r["reason"]: r["count"] for r in reasons}
    finally:
        staging.release()
    result.redriven = result.selected - result.remaining
    if merge:
        for name in result.changes:
            options = source.table_config(name)
            merge_current(spark, warehouse, source.name, name, options=options)
            if options.history:
                update_history(spark, warehouse, source.name, options)
    return result


def _requarantine(spark: SparkSession, uri: str, still_bad: DataFrame, selected: DataFrame) -> None:
    """Replace the quarantine rows of the ``selected`` messages by the rows that still fail."""
    lake.replace_keys(spark, uri, still_bad, selected, COORDINATES, None)


def _write_outputs(
    spark: SparkSession,
    warehouse: str,
    source: SourceConfig,
    normalized: Normalized,
    result: RedriveResult,
) -> None:
    """The redriven messages' change, DDL and control records, written by sequence (their
    quarantine rows are what still fails)."""
    for plan, data in normalized.tables:
        uri = lake.TableRef(lake.CHANGELOG, source.name, plan.name).uri(warehouse)
        _replace_by_sequence(
            spark, uri, data, lake.TableState(key=plan.key, qualified=plan.qualified)
        )
        if n := data.count():
            result.changes[plan.name] = n
    ddl = normalized.ddl()
    for r in ddl.select("qualified_table").distinct().collect():  # one row per table
        rows = ddl.where(F.col("qualified_table").eqNullSafe(r[0])).drop("qualified_table")
        uri = lake.TableRef(lake.DDL, source.name, routed_name(r[0], source)).uri(warehouse)
        _replace_by_sequence(spark, uri, rows, None)
    control = normalized.control()
    _replace_by_sequence(
        spark, lake.TableRef(lake.CONTROL, source.name).uri(warehouse), control, None
    )
