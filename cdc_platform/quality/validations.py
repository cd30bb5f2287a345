"""What each layer is validated with, and on what: the suites applied to the frames.

Shared by the Dagster checks (``defs/quality.py``) and ``cdc-platform quality-report``.
"""

import datetime as dt
from typing import Any

import pandas as pd
from pyspark.sql import SparkSession

from cdc_platform import lake
from cdc_platform.catalog import QualityConfig, SourceConfig, TableConfig
from cdc_platform.quality import frames, suites
from cdc_platform.quality.validate import SuiteRun, validate


def quality_of(source: SourceConfig, table: TableConfig | None) -> QualityConfig:
    """The table's quality settings: the suite defaults, then the source's, then the table's."""
    return suites.merged(source.quality, table.quality if table else None)


def changelog_parameters(quality: QualityConfig, now: dt.datetime | None = None) -> dict[str, Any]:
    defaults = suites.load(suites.CHANGELOG).parameters
    now = now or dt.datetime.now(dt.UTC)
    tolerance = quality.future_tolerance_minutes
    if tolerance is None:
        tolerance = defaults["future_tolerance_minutes"]
    low = quality.min_event_time or dt.datetime.fromisoformat(defaults["min_event_time"])
    return {"min_event_time": low, "max_event_time": now + dt.timedelta(minutes=tolerance)}


def before_formats(quality: QualityConfig) -> list[str]:
    """Formats whose updates must carry a before image (``update_before_image`` overrides)."""
    from cdc_platform import formats

    if quality.update_before_image is not None:
        return list(formats.format_names()) if quality.update_before_image else []
    return suites.load(suites.CHANGELOG).parameters["update_before_image_formats"]


def validate_changelog(
    spark: SparkSession,
    warehouse: str,
    source: SourceConfig,
    table: str,
    dates: list[str] | None,
    written: dict[str, list[str]] | None = None,
) -> SuiteRun | None:
    """The change-log suite on the partitions ``dates`` (None: all) of one table, or on the
    rows a run wrote (``written``: table -> the data files it added)."""
    quality = quality_of(source, source.table_config(table))
    built = frames.changelog_frame(
        spark, warehouse, source.name, table, dates, before_formats(quality), written
    )
    if built is None:
        return None
    frame, key = built
    return validate(
        frame,
        suites.load(suites.CHANGELOG),
        f"{suites.CHANGELOG}.{source.name}.{table}",
        key,
        suites.severities(suites.CHANGELOG, quality),
        batch=_batch(dates, written),
        index_columns=[*key, "sequence", *frames.COORDINATES],
        parameters=changelog_parameters(quality),
    )


def validate_reconciliation(
    spark: SparkSession,
    warehouse: str,
    source: SourceConfig,
    dates: list[str] | None,
    written: dict[str, list[str]] | None = None,
) -> SuiteRun | None:
    """Every raw message of ``dates`` (or that a run read: ``written``) is accounted for (see
    ``frames.reconciliation_frame``)."""
    frame = frames.reconciliation_frame(spark, warehouse, source.name, dates, written)
    if frame is None:
        return None
    return validate(
        frame,
        suites.load(suites.RECONCILIATION),
        f"{suites.RECONCILIATION}.{source.name}",
        [],
        suites.severities(suites.RECONCILIATION, source.quality),
        batch=_batch(dates, written),
        index_columns=frames.COORDINATES,
    )


def validate_current(
    spark: SparkSession,
    warehouse: str,
    source: SourceConfig,
    table: str,
    merge: dict[str, int] | None = None,
    written: list[str] | None = None,
    changes: list[str] | None = None,
) -> list[SuiteRun]:
    """The current-table suite, and with ``merge`` (live_before, truncated_live, made_live,
    made_dead, live_after: ``steps.current.MergeResult``) the live-row balance of that merge.
    ``written``: the files that merge committed, ``changes`` the change-log files it merged; the
    suite then looks at the rows of the keys it changed (``frames.current_frame``), not the
    whole table."""
    quality = quality_of(source, source.table_config(table))
    key = lake.state(lake.TableRef(lake.CHANGELOG, source.name, table).uri(warehouse)).key
    frame = (
        frames.current_frame(spark, warehouse, source.name, table, key, written, changes)
        if key
        else None
    )
    if frame is None:
        return []
    runs = [
        validate(
            frame,
            suites.load(suites.CURRENT),
            f"{suites.CURRENT}.{source.name}.{table}",
            key,
            suites.severities(suites.CURRENT, quality),
            batch="current" if written is None else "the keys the merge wrote",
            index_columns=[*key, "__sequence"],
        )
    ]
    if merge is not None:
        row = dict(merge)
        row["expected_live"] = (
            row["live_before"] - row["truncated_live"] + row["made_live"] - row["made_dead"]
        )
        runs.append(
            validate(
                pd.DataFrame([row]),
                suites.load(suites.CURRENT_ROWS),
                f"{suites.CURRENT_ROWS}.{source.name}.{table}",
                [],
                suites.severities(suites.CURRENT_ROWS, quality),
                batch="merge",
                index_columns=list(row),
            )
        )
    return runs


def _batch(dates: list[str] | None, written: dict[str, list[str]] | None = None) -> str:
    if written is not None:
        return "the run's batch"
    if not dates:
        return "all"
    return dates[0] if len(dates) == 1 else f"{min(dates)}..{max(dates)}"
