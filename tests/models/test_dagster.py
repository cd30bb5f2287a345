"""The models as Dagster assets and asset checks: lineage, automation, materialization."""

import datetime as dt

import dagster as dg
import pytest

from cdc_platform import lake
from cdc_platform.catalog import Catalog, ModelsConfig
from cdc_platform.defs.keys import model_key
from cdc_platform.defs.models import build_models_defs, rebuild_condition
from cdc_platform.defs.resources import build_resources
from cdc_platform.steps.current import current_rows

pytestmark = pytest.mark.spark


def _every_update(catalog: Catalog) -> Catalog:
    """The catalog with its models rebuilt after every update (no ``models.rebuild_cron``)."""
    return catalog.model_copy(update={"models": ModelsConfig()})


@pytest.fixture
def model_defs(catalog, warehouse_copy, monkeypatch) -> dg.Definitions:
    monkeypatch.setenv("CDC_WAREHOUSE", str(warehouse_copy))
    return dg.Definitions.merge(
        build_models_defs(catalog), dg.Definitions(resources=build_resources(catalog))
    )


def test_models_are_assets_with_lineage_from_their_refs_and_rebuild_on_updates(catalog, model_defs):
    graph = model_defs.resolve_asset_graph()
    totals = graph.get(model_key("customer_order_totals"))
    assert set(totals.parent_keys) == {
        dg.AssetKey(["current", "shop", "customers"]),
        dg.AssetKey(["current", "shop", "orders"]),
    }
    assert set(graph.get(model_key("big_spenders")).parent_keys) == {totals.key}
    changes = graph.get(model_key("daily_changes"))
    assert dg.AssetKey(["changelog", "lindorm", "users"]) in changes.parent_keys
    assert totals.group_name == "models" and totals.automation_condition == rebuild_condition(
        catalog.models.rebuild_cron
    )
    checks = {k.to_user_string() for k in graph.asset_check_keys}
    assert "models/order_facts:customer_id__relationships" in checks
    assert len(checks) == 15


def test_materializing_the_models_builds_them_and_runs_their_tests(
    spark, model_defs, warehouse_copy
):
    result = dg.materialize(
        [*model_defs.assets, *model_defs.asset_checks], resources=model_defs.resources
    )
    assert result.success
    meta = {
        e.materialization.asset_key.to_user_string(): e.materialization.metadata
        for e in result.get_asset_materialization_events()
    }
    assert meta["models/customer_order_totals"]["dagster/row_count"].value == 9
    assert meta["models/order_facts"]["merged"].value is False
    assert meta["models/big_spenders"]["materialized"].text == "view"
    schema = meta["models/customer_order_totals"]["dagster/column_schema"].schema
    described = {c.name: c.description for c in schema.columns}
    assert described["orders"].startswith("Number of live orders")
    assert lake.exists(lake.TableRef(lake.MODELS, "daily_changes").uri(warehouse_copy))
    evaluations = {
        (e.asset_key.to_user_string(), e.check_name): e
        for e in result.get_asset_check_evaluations()
    }
    assert len(evaluations) == 15
    failed = [k for k, e in evaluations.items() if not e.passed]
    assert failed == [("models/order_facts", "customer_id__relationships")]
    # Orders of the customer the demo deletes: the relationship test is only a warning.
    warn = evaluations[("models/order_facts", "customer_id__relationships")]
    assert warn.severity == dg.AssetCheckSeverity.WARN
    orders = current_rows(spark, warehouse_copy, "shop", "orders").toArrow()
    customers = current_rows(spark, warehouse_copy, "shop", "customers").toArrow()
    orphans = set(orders["customer_id"].to_pylist()) - set(customers["id"].to_pylist())
    assert orphans and set(warn.metadata["sample"].data) == {str(c) for c in orphans}
    assert warn.metadata["failing_rows"].value == sum(
        1 for c in orders["customer_id"].to_pylist() if c in orphans
    )


def requested(result) -> set[str]:
    return {r.key.to_user_string() for r in result.results if r.true_subset.size}


def test_automation_builds_a_model_when_an_input_updates_then_its_checks(
    catalog, tmp_path, monkeypatch
):
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    defs = dg.Definitions.merge(
        build_models_defs(_every_update(catalog)),
        dg.Definitions(resources=build_resources(catalog)),
    )
    with dg.instance_for_test() as instance:
        first = dg.evaluate_automation_conditions(defs=defs, instance=instance)
        assert requested(first) == set()  # nothing updated: a missing model is not built yet
        orders = dg.AssetKey(["current", "shop", "orders"])
        instance.report_runless_asset_event(dg.AssetMaterialization(orders))
        early = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
        # customers not written yet: the models reading it wait rather than fail; order_facts
        # reads only orders.
        assert {k for k in requested(early) if ":" not in k} == {"models/order_facts"}
        assert "models/order_facts:size__accepted_values" in requested(early)
        customers = dg.AssetKey(["current", "shop", "customers"])
        instance.report_runless_asset_event(dg.AssetMaterialization(customers))
        second = dg.evaluate_automation_conditions(
            defs=defs, instance=instance, cursor=early.cursor
        )
        # One request for the whole chain below the update (Dagster runs it in order), with
        # the checks of each model; daily_changes reads nothing that changed.
        models = {k for k in requested(second) if ":" not in k}
        assert models == {"models/customer_order_totals", "models/big_spenders"}
        assert "models/customer_order_totals:customer_id__unique" in requested(second)


def test_with_a_rebuild_cron_a_model_is_rebuilt_at_most_once_per_tick(
    catalog, tmp_path, monkeypatch
):
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    spaced = catalog.model_copy(update={"models": ModelsConfig(rebuild_cron="*/2 * * * *")})
    defs = dg.Definitions.merge(
        build_models_defs(spaced), dg.Definitions(resources=build_resources(catalog))
    )
    totals = model_key("customer_order_totals")
    orders = dg.AssetKey(["current", "shop", "orders"])
    # Looks after the events they see (the events carry the clock's time): from 30 s past the
    # next 10-minute mark on.
    now = dt.datetime.now(dt.UTC)
    at = now.replace(minute=now.minute - now.minute % 10, second=30, microsecond=0)
    at += dt.timedelta(minutes=10)
    with dg.instance_for_test() as instance:

        def evaluate(seconds: float, cursor=None):
            when = at + dt.timedelta(seconds=seconds)
            return dg.evaluate_automation_conditions(
                defs=defs, instance=instance, evaluation_time=when, cursor=cursor
            )

        def update(key: dg.AssetKey) -> None:
            instance.report_runless_asset_event(dg.AssetMaterialization(key))

        update(dg.AssetKey(["current", "shop", "customers"]))  # written before: it exists
        looks = [evaluate(0)]
        update(orders)
        looks.append(evaluate(10, looks[-1].cursor))  # 0:40 past the mark: no tick yet
        looks.append(evaluate(95, looks[-1].cursor))  # 2:05: the 2:00 tick passed
        update(totals)  # built
        looks.append(evaluate(110, looks[-1].cursor))  # 2:20
        update(orders)  # and its input updated again, and the table a test relates to
        update(dg.AssetKey(["current", "shop", "customers"]))
        looks.append(evaluate(130, looks[-1].cursor))  # 2:40: not again before 4:00
        looks.append(evaluate(215, looks[-1].cursor))  # 4:05
        assert [totals.to_user_string() in requested(r) for r in looks] == [
            False, False, True, False, False, True
        ]  # fmt: skip
        # Between ticks no model is rebuilt. A test of a relationship to another table runs when
        # that table updates, also at most once per tick: at 2:05 (customers was written before
        # it), not again at 2:40 after customers' update at 2:20, and at 4:05.
        assert requested(looks[1]) == requested(looks[4]) == set()
        relationship = "models/customer_order_totals:customer_id__relationships"
        assert [relationship in requested(r) for r in looks] == [
            False, False, True, False, False, True
        ]  # fmt: skip
        looks.append(evaluate(335, looks[-1].cursor))  # 6:05: a tick, but nothing new
        assert totals.to_user_string() not in requested(looks[-1])
