"""What ``cdc-platform quality-report`` and ``cdc-platform redrive`` do (arguments parsed)."""

import os
from pathlib import Path

from pyspark.sql import SparkSession

from cdc_platform import lake
from cdc_platform.catalog import Catalog, CatalogError, SourceConfig, load_catalog
from cdc_platform.quality import docs, validations
from cdc_platform.quality.validate import SuiteRun
from cdc_platform.steps.redrive import RedriveResult, redrive


def warehouse_sources(warehouse: str, sources_file: Path | None) -> list[SourceConfig]:
    """Every source with tables in the warehouse, configured by the sources file when it names
    it (given, else ``CDC_SOURCES`` or ./sources.yaml if present), else with defaults."""
    catalog: Catalog | None = None
    path = sources_file or Path(os.environ.get("CDC_SOURCES", "sources.yaml"))
    if sources_file is not None or path.is_file():
        catalog = load_catalog(path)
    names = sorted(
        {
            lake.storage.name(f)
            for layer in (lake.RAW, lake.QUARANTINE)
            for f in lake.folders(lake.storage.join(warehouse, layer))
        }
    )
    configured = {s.name: s for s in catalog.sources} if catalog else {}
    return [configured.get(n) or SourceConfig(name=n) for n in names]


def quality_report(
    spark: SparkSession, warehouse: str, out: Path, sources_file: Path | None = None
) -> tuple[Path, list[SuiteRun]]:
    """Validate every change log (all partitions), reconciliation and current table of the
    warehouse and build the whole Data Docs site in ``out``."""
    runs: list[tuple[SuiteRun, docs.Subject]] = []

    def add(run: SuiteRun | None, layer: str, source: str, table: str | None = None) -> None:
        if run is not None:  # the page names the asset whose checks in Dagster run the suite
            asset = "/".join(lake.TableRef(layer, source, table).key_path)
            runs.append((run, docs.Subject(asset=asset, batch=run.batch)))

    for source in warehouse_sources(warehouse, sources_file):
        for uri in lake.tables_under(warehouse, lake.CHANGELOG, source.name):
            table = lake.storage.name(uri)
            run = validations.validate_changelog(spark, warehouse, source, table, None)
            add(run, lake.CHANGELOG, source.name, table)
            for run in validations.validate_current(spark, warehouse, source, table):
                add(run, lake.CURRENT, source.name, table)
        run = validations.validate_reconciliation(spark, warehouse, source, None)
        add(run, lake.QUARANTINE, source.name)
    if not runs:
        raise CatalogError(f"nothing to validate in warehouse {warehouse}")
    docs.publish(runs, out, rebuild=True)
    return docs.index_page(out), [run for run, _ in runs]


def redrive_all(
    spark: SparkSession,
    warehouse: str,
    reason: str | None,
    source: str | None,
    sources_file: Path | None = None,
) -> dict[str, RedriveResult]:
    sources = warehouse_sources(warehouse, sources_file)
    if source is not None:
        sources = [s for s in sources if s.name == source]
        if not sources:
            raise CatalogError(f"no source {source!r} in warehouse {warehouse}")
    return {s.name: redrive(spark, warehouse, s, reason) for s in sources}
