"""Asset checks from the expectation suites: one check per rule, severity from the suite or
``sources.yaml`` (``quality.severity``). ERROR checks of a change log are blocking: a failure skips
the current and history merges downstream in the same run, and their automation condition waits
for them to pass (``automation.py``).

Builders only; ``cdc_tables.py`` passes the specs to its assets and yields the results.
"""

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
from pyspark.sql import SparkSession

from cdc_platform.catalog import CatalogError, SourceConfig, TableConfig
from cdc_platform.defs.keys import asset_key
from cdc_platform.lake import CHANGELOG, CURRENT, QUARANTINE
from cdc_platform.quality import docs, links, suites, validations
from cdc_platform.quality.validate import RuleResult, SuiteRun
from cdc_platform.steps.current import MergeResult
from cdc_platform.timings import phase

SEVERITY = {suites.ERROR: dg.AssetCheckSeverity.ERROR, suites.WARN: dg.AssetCheckSeverity.WARN}


def _severities(layer: str, source: SourceConfig, table: TableConfig | None) -> dict[str, str]:
    try:
        return suites.severities(layer, validations.quality_of(source, table))
    except ValueError as e:
        where = f"source {source.name}" + (f" table {table.name}" if table else "")
        raise CatalogError(f"{where}: {e}") from None


def _specs(
    layer: str, key: dg.AssetKey, severities: dict[str, str], blocking: bool
) -> list[dg.AssetCheckSpec]:
    rules = suites.load(layer).rules
    return [
        dg.AssetCheckSpec(
            name,
            asset=key,
            description=f"{rules[name].description} ({severity})",
            blocking=blocking and severity == suites.ERROR,
        )
        for name, severity in severities.items()
    ]


def changelog_check_specs(
    source: SourceConfig, tables: list[TableConfig]
) -> list[dg.AssetCheckSpec]:
    """The change-log rules per table (ERROR ones blocking) and the source's reconciliation,
    attached to its quarantine asset."""
    specs = []
    for t in tables:
        severities = _severities(suites.CHANGELOG, source, t)
        specs += _specs(
            suites.CHANGELOG, asset_key(CHANGELOG, source.name, t.name), severities, True
        )
    severities = _severities(suites.RECONCILIATION, source, None)
    specs += _specs(suites.RECONCILIATION, asset_key(QUARANTINE, source.name), severities, False)
    return specs


def current_check_specs(source: SourceConfig, table: TableConfig) -> list[dg.AssetCheckSpec]:
    key = asset_key(CURRENT, source.name, table.name)
    return [
        spec
        for layer in (suites.CURRENT, suites.CURRENT_ROWS)
        for spec in _specs(layer, key, _severities(layer, source, table), True)
    ]


def _result(
    key: dg.AssetKey, rule: RuleResult, run: SuiteRun, report: dg.MetadataValue | None
) -> dg.AssetCheckResult:
    metadata: dict[str, dg.RawMetadataValue] = {
        "unexpected_count": rule.unexpected,
        "checked_rows": rule.checked,
        "batch": run.batch,
        "suite": run.suite,
        "engine": run.engine,
        "validation_seconds": round(run.seconds, 3),
    }
    if rule.sample:
        metadata["failing_rows_sample"] = dg.MetadataValue.json(rule.sample)
    if rule.error:
        metadata["error"] = rule.error
    if report is not None:
        metadata["report"] = report
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=rule.rule,
        passed=rule.success,
        severity=SEVERITY[rule.severity],
        description=rule.description,
        metadata=metadata,
    )


def _publish(
    context: dg.OpExecutionContext,
    runs: list[tuple[dg.AssetKey, SuiteRun]],
    warehouse: Path,
    batch: str | None = None,
) -> dict[str, dg.MetadataValue]:
    """Data Docs after each validation, each page naming the asset, the run and the batch
    (``batch``, else the run's); a report that cannot be written never fails the run.
    Returns each suite's link to its page."""
    reports = docs.reports_dir(warehouse)
    run_id = context.run.run_id
    subjects = [
        (run, docs.Subject(asset=key.to_user_string(), batch=batch or run.batch, run_id=run_id))
        for key, run in runs
    ]
    try:
        with phase("checks/data_docs"):
            pages = docs.publish(subjects, reports)
    except OSError as e:
        context.log.warning(f"data docs not written: {e}")
        return {}
    return {suite: _link(page, docs.site_dir(reports)) for suite, page in pages.items()}


def _link(page: Path, site: Path) -> dg.MetadataValue:
    """The page on the reports server (``CDC_REPORTS_URL``), else its path."""
    url = links.page_url(page, site)
    return dg.MetadataValue.url(url) if url else dg.MetadataValue.path(str(page))


def batch_label(dates: list[str], incremental: bool) -> str:
    """A run's batch as its checks name it: its dates, and for an incremental run, the new raw
    batches."""
    label = dates[0] if len(dates) == 1 else f"{dates[0]}..{dates[-1]}"
    return f"{label}, new raw batches" if incremental else label


def changelog_check_results(
    context: dg.OpExecutionContext,
    spark: SparkSession,
    warehouse: Path,
    source: SourceConfig,
    tables: list[TableConfig],
    dates: list[str],
    written: dict[str, list[str]] | None = None,
    batch: str | None = None,
) -> Iterator[dg.AssetCheckResult]:
    """Validate the change-log partitions ``dates`` of every table and reconcile the source; or,
    for an incremental run, just what it wrote (``written``: table -> the data files it added),
    so a check costs what the run wrote, not the day. ``batch``: how the checks name the batch
    (default: ``dates``)."""
    runs: list[tuple[dg.AssetKey, SuiteRun | None, str]] = []
    for t in tables:
        run = validations.validate_changelog(spark, warehouse, source, t.name, dates, written)
        runs.append((asset_key(CHANGELOG, source.name, t.name), run, suites.CHANGELOG))
    run = validations.validate_reconciliation(spark, warehouse, source, dates, written)
    runs.append((asset_key(QUARANTINE, source.name), run, suites.RECONCILIATION))
    batch = batch or batch_label(dates, written is not None)
    reports = _publish(context, [(k, r) for k, r, _ in runs if r], warehouse, batch)
    yield from _results(runs, reports, source, tables)


def _results(
    runs: list[tuple[dg.AssetKey, SuiteRun | None, str]],
    reports: dict[str, dg.MetadataValue],
    source: SourceConfig,
    tables: list[TableConfig],
) -> Iterator[dg.AssetCheckResult]:
    by_name = {t.name: t for t in tables}
    for key, run, layer in runs:
        if run is not None:
            report = reports.get(run.suite)
            yield from (_result(key, rule, run, report) for rule in run.rules)
            continue
        # Nothing to validate yet (the table or raw is absent): nothing can be wrong.
        table = by_name.get(key.path[-1]) if len(key.path) == 3 else None
        for rule, severity in _severities(layer, source, table).items():
            yield dg.AssetCheckResult(
                asset_key=key,
                check_name=rule,
                passed=True,
                severity=SEVERITY[severity],
                metadata={"unexpected_count": 0, "checked_rows": 0},
            )


def current_check_results(
    context: dg.OpExecutionContext,
    spark: SparkSession,
    warehouse: Path,
    source: SourceConfig,
    table: TableConfig,
    merged: MergeResult,
) -> list[dg.AssetCheckResult]:
    """Validate the current table after a merge (its suite and the merge's row balance)."""
    balance = {
        "live_before": merged.live_before,
        "made_live": merged.made_live,
        "made_dead": merged.made_dead,
        "truncated_live": merged.truncated_live,
        "live_after": merged.rows,
    }
    runs = validations.validate_current(
        spark, warehouse, source, table.name, balance, merged.written, merged.merged_changes
    )
    key = asset_key(CURRENT, source.name, table.name)
    if not runs:
        return list(_results([(key, None, suites.CURRENT), (key, None, suites.CURRENT_ROWS)],
                             {}, source, [table]))  # fmt: skip
    reports = _publish(context, [(key, run) for run in runs], warehouse)
    return [_result(key, rule, run, reports.get(run.suite)) for run in runs for rule in run.rules]
