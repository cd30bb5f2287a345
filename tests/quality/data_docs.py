"""A small Data Docs site for the report tests: the change-log suite on a table with two
failing rules, and the live-row balance of a merge, each published for a Dagster run."""

from pathlib import Path

import pandas as pd

from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.quality import docs, suites, validations
from cdc_platform.quality.validate import SuiteRun, validate
from tests.quality.builders import DATE, change, write_changelog

SOURCE = SourceConfig(name="shop", tables=[TableConfig(name="customers", source_table="app.t")])
CHANGELOG = "changelog/shop/customers"
CURRENT = "current/shop/customers"
RUN_ID = "6f1d0c1e-2b7a-4e0c-9a51-0d5c2f1e7a00"  # looks like a Dagster run id


def changelog_run(spark, warehouse: Path) -> SuiteRun:
    rows = [change("c", 1, 1), change("u", 1, 2), change("x", 2, 3), change("c", None, 4)]
    write_changelog(spark, warehouse, SOURCE.name, "customers", rows)
    run = validations.validate_changelog(spark, warehouse, SOURCE, "customers", [DATE])
    assert run is not None and not run.success
    return run


def balance_run(live_after: int) -> SuiteRun:
    row = {"live_before": 1, "truncated_live": 0, "made_live": 1, "made_dead": 0}
    frame = pd.DataFrame([{**row, "live_after": live_after, "expected_live": 2}])
    return validate(
        frame, suites.load(suites.CURRENT_ROWS), f"{suites.CURRENT_ROWS}.shop.customers", [],
        {}, batch="merge", index_columns=list(frame.columns),
    )  # fmt: skip


def build_site(spark, tmp: Path) -> dict[str, Path]:
    """Publish both for run ``RUN_ID``; returns each suite's page."""
    runs = [
        (changelog_run(spark, tmp / "warehouse"),
         docs.Subject(asset=CHANGELOG, batch=DATE, run_id=RUN_ID)),
        (balance_run(2), docs.Subject(asset=CURRENT, batch="merge", run_id=RUN_ID)),
    ]  # fmt: skip
    return docs.publish(runs, tmp / "reports")
