"""Replay: files -> raw -> change log -> current in one call (the ``replay`` command)."""

from pathlib import Path

from pyspark.sql import SparkSession

from cdc_platform.catalog import SourceConfig
from cdc_platform.formats import canonical as C
from cdc_platform.ingest import landing
from cdc_platform.steps.changelog import NormalizeResult, normalize_source
from cdc_platform.steps.current import merge_current
from cdc_platform.steps.raw import ingest_files


def replay(
    spark: SparkSession,
    warehouse: str,
    files: list[Path],
    source: SourceConfig,
    default_date: str,
) -> tuple[dict, NormalizeResult]:
    """Files -> raw -> changelog -> current for every table found; returns (summary, details).

    The summary counts the replayed change records by op and the live rows after the merge.
    """
    by_date: dict[str, list[tuple[Path, str]]] = {}
    for f in files:
        by_date.setdefault(landing.date_of(str(f), default_date), []).append(
            (str(f), str(f.resolve()))
        )
    for date, group in sorted(by_date.items()):
        ingest_files(warehouse, source.name, group, date, whole_date=False)
    result = normalize_source(spark, warehouse, source, sorted(by_date))
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
