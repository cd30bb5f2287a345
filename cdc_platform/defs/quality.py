"""Asset checks from the expectation suites: one check per rule, severity from the suite or
``sources.yaml`` (``quality.severity``). ERROR checks of a change log are blocking: a failure skips
the current and history merges downstream in the same run, and their automation condition waits
for them to pass (``automation.py``).

The reconciliation blocks nothing, so it is validated in a thread of its own (``reconciling``)
beside the change-log checks and, in a continuous micro-batch, the merges: its Spark work and
its GX fill the time they leave idle.

Builders only; ``cdc_tables.py`` passes the specs to its assets and yields the results.
"""

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from pyspark.sql import SparkSession

from cdc_platform.catalog import CatalogError, SourceConfig, TableConfig
from cdc_platform.defs.keys import asset_key
from cdc_platform.lake import CHANGELOG, CURRENT, QUARANTINE
from cdc_platform.lake.storage import StorageError
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


@dataclass
class Validated:
    """One suite's validation of an asset (``run`` None: nothing to validate yet, so nothing can
    be wrong) and how its report page names the batch (None: the run's own)."""

    key: dg.AssetKey
    layer: str
    run: SuiteRun | None
    batch: str | None = None


def _publish(
    context: dg.OpExecutionContext, validated: list[Validated], warehouse: str
) -> dict[str, dg.MetadataValue]:
    """Data Docs for the validations, in one publish, each page naming the asset, the run and
    the batch; a report that cannot be written never fails the run. Returns each suite's link
    to its page."""
    reports = docs.reports_dir(warehouse)
    run_id = context.run.run_id
    subjects = [
        (v.run, docs.Subject(asset=v.key.to_user_string(), batch=v.batch or v.run.batch,
                             run_id=run_id))
        for v in validated
        if v.run is not None
    ]  # fmt: skip
    if not subjects:
        return {}
    try:
        with phase("checks/data_docs"):
            pages = docs.publish(subjects, reports)
    except (OSError, StorageError) as e:
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


def validate_changelogs(
    spark: SparkSession,
    warehouse: str,
    source: SourceConfig,
    tables: list[TableConfig],
    dates: list[str],
    written: dict[str, list[str]] | None = None,
    batch: str | None = None,
) -> list[Validated]:
    """Validate the change-log partitions ``dates`` of every table; or, for an incremental run,
    just what it wrote (``written``: table -> the data files it added), so a check costs what the
    run wrote, not the day. ``batch``: how the checks name the batch (default: ``dates``)."""
    batch = batch or batch_label(dates, written is not None)
    return [
        Validated(
            asset_key(CHANGELOG, source.name, t.name),
            suites.CHANGELOG,
            validations.validate_changelog(spark, warehouse, source, t.name, dates, written),
            batch,
        )
        for t in tables
    ]


# One thread for the process, so that its snapshots of the tables (``lake.snapshot`` keeps them
# per thread) are kept from one micro-batch to the next.
_BESIDE = ThreadPoolExecutor(1, thread_name_prefix="reconciliation")


@contextmanager
def reconciling(
    spark: SparkSession,
    warehouse: str,
    source: SourceConfig,
    dates: list[str],
    written: dict[str, list[str]] | None,
    into: list[Validated],
    batch: str | None = None,
) -> Iterator[None]:
    """Reconcile the source (as ``validate_changelogs`` validates its tables) in a thread while
    the block runs, and add the validation to ``into`` when the block ends. When the block
    fails, its error is the one raised, and the reconciliation is added if it succeeded."""
    batch = batch or batch_label(dates, written is not None)
    key = asset_key(QUARANTINE, source.name)
    future = _BESIDE.submit(
        validations.validate_reconciliation, spark, warehouse, source, dates, written
    )

    def add() -> None:
        into.append(Validated(key, suites.RECONCILIATION, future.result(), batch))

    try:
        yield
    except BaseException:
        with phase("checks"):
            if future.exception() is None:
                add()
        raise
    with phase("checks"):
        add()


def validate_current(
    spark: SparkSession,
    warehouse: str,
    source: SourceConfig,
    table: TableConfig,
    merged: MergeResult,
) -> list[Validated]:
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
        return [Validated(key, suites.CURRENT, None), Validated(key, suites.CURRENT_ROWS, None)]
    return [Validated(key, run.suite.split(".")[0], run) for run in runs]


def check_results(
    context: dg.OpExecutionContext,
    validated: list[Validated],
    warehouse: str,
    source: SourceConfig,
    tables: list[TableConfig],
) -> list[dg.AssetCheckResult]:
    """One check result per rule of each validation, linking its report page (all published at
    once: a publish costs about the same for one validation as for several)."""
    reports = _publish(context, validated, warehouse)
    by_name = {t.name: t for t in tables}
    results = []
    for v in validated:
        if v.run is not None:
            report = reports.get(v.run.suite)
            results += [_result(v.key, rule, v.run, report) for rule in v.run.rules]
            continue
        table = by_name.get(v.key.path[-1]) if len(v.key.path) == 3 else None
        results += [
            dg.AssetCheckResult(
                asset_key=v.key,
                check_name=rule,
                passed=True,
                severity=SEVERITY[severity],
                metadata={"unexpected_count": 0, "checked_rows": 0},
            )
            for rule, severity in _severities(v.layer, source, table).items()
        ]
    return results


def blocked(validated: list[Validated]) -> set[dg.AssetKey]:
    """The assets with a failed ERROR rule (blocking: what depends on them waits)."""
    return {
        v.key
        for v in validated
        if v.run is not None
        for rule in v.run.rules
        if not rule.success and rule.severity == suites.ERROR
    }
