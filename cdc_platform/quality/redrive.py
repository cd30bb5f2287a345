"""Redrive: re-process quarantined messages through the current configuration.

The messages are read again from raw (by the coordinates the quarantine recorded) and go through
the same parse, plan and typing steps as ``steps.normalize.normalize_source``. Whatever now
succeeds is written to its change log (DDL and control logs too); then, last, the selected
quarantine rows are replaced by the rows that still fail (with their new reasons). A crash
between the two leaves a message in both places, never in neither, and a rerun is harmless:
outputs are replaced by ``sequence`` (unique per change record), so nothing is written twice,
and the merge into current ignores a change whose sequence it already applied.

A message whose success depends on another message of its batch stays: an ``UPDATE_BEFOR``
quarantined because its partner was missing is redriven alone, so it stays unpaired.
"""

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_platform.catalog import SourceConfig
from cdc_platform.lake import delta as lake
from cdc_platform.quality.frames import COORDINATES, coordinate_key
from cdc_platform.spark import normalize
from cdc_platform.steps.history import update_history
from cdc_platform.steps.merge import merge_current
from cdc_platform.steps.normalize import split_parsed

# Rows per replace commit: predicates listing values stay a reasonable size for delta-rs.
CHUNK = 500


@dataclass
class RedriveResult:
    selected: int = 0  # quarantined messages selected (distinct raw coordinates)
    redriven: int = 0  # of them, no longer in the quarantine
    remaining: int = 0  # still quarantined (possibly with a new reason)
    changes: dict[str, int] = field(default_factory=dict)  # change records written, by table
    reasons: dict[str, int] = field(default_factory=dict)  # reasons of the remaining rows


def _literal(value: object) -> str:
    if isinstance(value, dt.date):
        value = value.isoformat()
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


def _coordinates_predicate(rows: list[dict]) -> str:
    """Rows matching any of these raw coordinates (null-safe: an absent coordinate is NULL)."""
    terms = []
    for r in rows:
        parts = [
            f"{lake.quoted(c)} IS NULL" if r[c] is None else f"{lake.quoted(c)} = {_literal(r[c])}"
            for c in COORDINATES
        ]
        terms.append("(" + " AND ".join(parts) + ")")
    return " OR ".join(terms)


def _replace_by_sequence(uri: str, data: pa.Table, metadata: dict[str, str] | None) -> None:
    """Write ``data`` into a partitioned table, replacing rows with the same sequences."""
    if data.num_rows == 0:
        return
    dates = sorted({str(d) for d in data[lake.PARTITION_COLUMN].to_pylist()})
    if not lake.exists(uri):
        lake.overwrite_partitions(uri, data, dates, metadata)
        return
    sequences = data["sequence"].to_pylist()
    for i in range(0, len(sequences), CHUNK):
        chunk = sorted(set(sequences[i : i + CHUNK]))
        predicate = (
            f"{lake.PARTITION_COLUMN} IN ({', '.join(_literal(d) for d in dates)}) AND "
            f"sequence IN ({', '.join(_literal(s) for s in chunk)})"
        )
        rows = data.filter(pc.is_in(data["sequence"], pa.array(chunk, pa.string())))
        lake.replace_where(uri, rows, predicate)


def redrive(
    spark: SparkSession,
    warehouse: Path,
    source: SourceConfig,
    reason: str | None = None,
    merge: bool = True,
) -> RedriveResult:
    """Re-process the quarantined messages of ``source`` (only those whose reason starts with
    ``reason``, if given); with ``merge``, merge the tables that received changes into current
    (and history)."""
    result = RedriveResult()
    q_uri = lake.table_uri(warehouse, lake.QUARANTINE, source.name)
    raw_uri = lake.table_uri(warehouse, lake.RAW, source.name)
    quarantine = lake.read(spark, q_uri)
    raw = lake.read(spark, raw_uri)
    if quarantine is None or raw is None:
        return result
    if reason:
        quarantine = quarantine.where(F.col("reason").startswith(reason))
    selected = (
        quarantine.select(*COORDINATES).dropDuplicates().toArrow().to_pylist()
    )  # the messages, not their rows (a Canal message may have several rejected rows)
    result.selected = len(selected)
    if not selected:
        return result
    coords = spark.createDataFrame(
        [(r,) for r in {_key(s) for s in selected}], "__coord string"
    ).hint("broadcast")
    again = raw.withColumn("__coord", coordinate_key()).join(coords, "__coord", "left_semi")
    parsed = normalize.parse_messages(again.drop("__coord"), source).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    try:
        still_bad = _write_outputs(warehouse, source, parsed, result)
    finally:
        parsed.unpersist()
    # Last: the selected rows leave the quarantine, the ones that still fail come back.
    for i in range(0, len(selected), CHUNK):
        chunk = selected[i : i + CHUNK]
        keys = {_key(s) for s in chunk}
        mine = pa.array([_key(r) in keys for r in still_bad.to_pylist()], pa.bool_())
        lake.replace_where(q_uri, still_bad.filter(mine), _coordinates_predicate(chunk))
    remaining = {_key(r) for r in still_bad.select(COORDINATES).to_pylist()}
    result.remaining = len(remaining)
    result.redriven = result.selected - result.remaining
    reasons = still_bad.group_by("reason").aggregate([("reason", "count")]).to_pylist()
    result.reasons = {r["reason"]: r["reason_count"] for r in reasons}
    if merge:
        for name in result.changes:
            options = source.table_config(name)
            merge_current(spark, warehouse, source.name, name, options=options)
            if options.history:
                update_history(spark, warehouse, source.name, options)
    return result


def _key(row: dict) -> str:
    """Python twin of ``frames.coordinate_key`` for one row of coordinates."""
    return "\x1f".join("\x00" if row[c] is None else str(row[c]) for c in COORDINATES)


def _write_outputs(
    warehouse: Path, source: SourceConfig, parsed: DataFrame, result: RedriveResult
) -> pa.Table:
    """``steps.normalize.split_parsed`` on the redriven messages, writing change, DDL and control
    records by sequence; returns the quarantine rows of what still fails."""
    split = split_parsed(warehouse, source, parsed)
    bad = split.quarantine
    for plan, data in split.tables:
        uri = lake.table_uri(warehouse, lake.CHANGELOG, source.name, plan.name)
        state = {lake.STATE_KEY: json.dumps({"key": plan.key, "qualified": plan.qualified})}
        _replace_by_sequence(uri, data, state)
        if data.num_rows:
            result.changes[plan.name] = data.num_rows
    ddl = normalize.ddl_records(parsed).toArrow()
    names = [normalize.routed_name(q, source) for q in ddl["qualified_table"].to_pylist()]
    ddl = ddl.drop_columns(["qualified_table"])
    for name in sorted(set(names)):
        rows = ddl.filter(pa.array([n == name for n in names], pa.bool_()))
        _replace_by_sequence(lake.table_uri(warehouse, lake.DDL, source.name, name), rows, None)
    control = normalize.control_records(parsed).toArrow()
    _replace_by_sequence(lake.table_uri(warehouse, lake.CONTROL, source.name), control, None)
    still = pa.concat_tables(bad, promote_options="permissive")
    return still
