"""The checks in Dagster: one per rule, ERROR ones blocking; a failing ERROR check of a change
log skips the merge in the same run, and automation (of the merges and of the SQL models that
read the change log) waits for the checks to pass."""

import datetime as dt
import functools
import operator
from pathlib import Path

import dagster as dg
import pytest

from cdc_platform.catalog import ModelsConfig, QualityConfig, load_catalog
from cdc_platform.defs.cdc_tables import build_source_defs
from cdc_platform.defs.keys import model_key
from cdc_platform.defs.models import REBUILD_WHEN_INPUTS_UPDATE, build_models_defs
from cdc_platform.defs.resources import build_resources
from cdc_platform.demo import write_demo_traffic
from cdc_platform.quality import suites
from tests.defs.test_pipeline_in_dagster import DAY, ROOT

pytestmark = pytest.mark.spark
CUSTOMERS = dg.AssetKey(["changelog", "shop", "customers"])
CURRENT = dg.AssetKey(["current", "shop", "customers"])
# A SQL model that reads the customers change log.
DAILY_CHANGES = model_key("daily_changes")
# Every customers change is "too old": the rule fails, and with ERROR it blocks.
TOO_OLD = QualityConfig(
    min_event_time=dt.datetime(2100, 1, 1, tzinfo=dt.UTC),
    future_tolerance_minutes=200 * 365 * 24 * 60,
    severity={"event_time_bounds": "ERROR"},
)


@pytest.fixture
def catalog(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.setenv("CDC_LANDING", str(tmp_path / "landing"))
    monkeypatch.setenv("CDC_REPORTS", str(tmp_path / "reports"))
    catalog = load_catalog(ROOT / "sources.yaml")
    write_demo_traffic(catalog.landing_uri, batch=0, date=DAY)
    return catalog


def _defs(catalog, quality: QualityConfig | None = None, models: bool = False) -> dg.Definitions:
    # With a run per batch, whose automation this file tests (the demo's runs continuously).
    shop = catalog.source("shop").model_copy(update={"continuous": None})
    if quality is not None:
        tables = [
            t.model_copy(update={"quality": quality}) if t.name == "customers" else t
            for t in shop.tables
        ]
        shop = shop.model_copy(update={"tables": tables})
    return dg.Definitions.merge(
        build_source_defs(shop, catalog),
        # Models after every update, as without models.rebuild_cron (the demo spaces them).
        *(
            [build_models_defs(catalog.model_copy(update={"models": ModelsConfig()}))]
            if models
            else []
        ),
        dg.Definitions(resources=build_resources(catalog)),
    )


def test_one_check_per_rule_with_severity_and_blocking(catalog):
    graph = _defs(catalog).resolve_asset_graph()
    checks = {(k.asset_key.to_user_string(), k.name): k for k in graph.asset_check_keys}
    for rule, r in suites.load(suites.CHANGELOG).rules.items():
        spec = graph.get_check_spec(checks[("changelog/shop/customers", rule)])
        assert spec.blocking == (r.severity == suites.ERROR), rule
    assert ("quarantine/shop", "raw_messages_accounted") in checks
    for rule in ("pk_unique", "pk_not_null", "no_exposed_tombstones", "row_count_balance"):
        assert ("current/shop/customers", rule) in checks
    blocked = _defs(catalog, TOO_OLD).resolve_asset_graph()
    key = dg.AssetCheckKey(CUSTOMERS, "event_time_bounds")
    assert blocked.get_check_spec(key).blocking


def _run(defs: dg.Definitions, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    job = defs.resolve_job_def("shop__ingest")
    return job.execute_in_process(partition_key=DAY, instance=instance, raise_on_error=False)


# `spark` in a test's arguments: its runs' Spark resource gets that session (local, or the
# Spark Connect client of the [connect] pass; see tests/conftest.py).
def test_an_error_check_on_the_change_log_blocks_the_merge(spark, catalog):
    instance = dg.DagsterInstance.ephemeral()
    defs = _defs(catalog, TOO_OLD, models=True)
    # The same assets with their conditions minus the blocking-checks part, for comparison.
    eager_only = dg.AutomationCondition.eager().without(~dg.AutomationCondition.any_deps_missing())
    *rebuild, guard = REBUILD_WHEN_INPUTS_UPDATE.operands
    assert guard == dg.AutomationCondition.all_deps_blocking_checks_passed()
    without_guard = {CURRENT: eager_only, DAILY_CHANGES: functools.reduce(operator.and_, rebuild)}
    unguarded = defs.map_asset_specs(
        func=lambda spec: (
            spec.replace_attributes(automation_condition=without_guard[spec.key])
            if spec.key in without_guard
            else spec
        )
    )
    before = [
        dg.evaluate_automation_conditions(defs=d, instance=instance) for d in (defs, unguarded)
    ]
    result = _run(defs, instance)
    checks = {
        (e.asset_key.to_user_string(), e.check_name): e
        for e in result.get_asset_check_evaluations()
    }
    failed = checks[("changelog/shop/customers", "event_time_bounds")]
    assert not failed.passed and failed.severity == dg.AssetCheckSeverity.ERROR
    assert failed.metadata["unexpected_count"].value == 15
    assert failed.metadata["failing_rows_sample"].data[0]["file"]
    # Its Data Docs page: a path without a reports server (CDC_REPORTS_URL).
    page = str(failed.metadata["report"].value)
    assert f"/validations/changelog/shop/customers/{result.run_id}/" in page
    assert page.endswith(f"/{DAY}.html") and Path(page).is_file()
    assert checks[("changelog/shop/customers", "op_in_domain")].passed
    materialized = {e.asset_key for e in result.get_asset_materialization_events()}
    assert CUSTOMERS in materialized and CURRENT not in materialized  # written, not merged

    # The automation sensor does not merge it later either (without the guard it would).
    after = [
        dg.evaluate_automation_conditions(defs=d, instance=instance, cursor=b.cursor)
        for d, b in zip((defs, unguarded), before, strict=True)
    ]
    assert [a.get_num_requested(CURRENT) for a in after] == [0, 1]
    # Nor does it rebuild the model that reads the rejected change log (unguarded, it would).
    assert [a.get_num_requested(DAILY_CHANGES) for a in after] == [0, 1]


def test_passing_checks_let_the_merge_run_and_report_its_own(spark, catalog):
    instance = dg.DagsterInstance.ephemeral()
    defs = _defs(catalog, models=True)
    before = dg.evaluate_automation_conditions(defs=defs, instance=instance)
    result = _run(defs, instance)
    assert result.success
    ours = {r for layer in suites.SUITES for r in suites.load(layer).rules}
    evaluations = [e for e in result.get_asset_check_evaluations() if e.check_name in ours]
    assert len(evaluations) == 2 * 9 + 1 + 2 * 4 and all(e.passed for e in evaluations)
    current = {e.check_name for e in evaluations if e.asset_key == CURRENT}
    assert current == {"pk_unique", "pk_not_null", "no_exposed_tombstones", "row_count_balance"}
    # With the checks passed, the guard lets the models over the change log and the current
    # tables rebuild.
    after = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=before.cursor)
    assert after.get_num_requested(DAILY_CHANGES) == 1
    assert after.get_num_requested(model_key("customer_order_totals")) == 1
