"""What ``cdc-platform models compile|run|test`` do, outside Dagster (the CLI prints it)."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from cdc_platform.catalog import Catalog
from cdc_platform.models.build import build_model
from cdc_platform.models.checks import run_tests
from cdc_platform.models.compile import check_sql, render
from cdc_platform.models.graph import select
from cdc_platform.models.project import (
    Project,
    catalog_tables,
    default_models_dir,
    display_path,
    load_project,
)


def open_project(catalog: Catalog, warehouse: str, models_dir: Path | None) -> Project:
    folder = models_dir or default_models_dir(catalog.base_dir)
    return load_project(folder, catalog_tables(catalog, warehouse))


def compile_models(
    spark: SparkSession, project: Project, names: list[str] | None
) -> Iterator[tuple[str, str]]:
    """(header, SQL) of each selected model in build order, each checked by Spark's parser."""
    for name in select(project, names):
        model = project.models[name]
        sql = render(project, model)
        check_sql(spark, model, sql)
        yield f"-- models/{name} ({model.materialized}) from {display_path(model.path)}", sql


def run_models(
    spark: SparkSession,
    warehouse: str,
    project: Project,
    names: list[str] | None,
    full_refresh: bool = False,
) -> Iterator[dict[str, Any]]:
    """Build the selected models in order; a summary of each."""
    for name in select(project, names):
        built = build_model(spark, warehouse, project, name, full_refresh=full_refresh)
        yield {
            "model": name,
            "materialized": built.materialized,
            "rows": built.rows,
            "delta_version": built.version,
            **({"merged": built.merged} if built.materialized == "incremental" else {}),
        }


def run_model_tests(
    spark: SparkSession, warehouse: str, project: Project, names: list[str] | None
) -> Iterator[dict[str, Any]]:
    """Run the selected models' YAML tests; one result each."""
    for name in select(project, names):
        for o in run_tests(spark, warehouse, project, name):
            yield {
                "model": name,
                "test": o.name,
                "passed": o.passed,
                "severity": o.severity,
                "failing_rows": o.failing_rows,
                "sample": [str(v) for v in o.sample],
            }
