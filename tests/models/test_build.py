"""Building models with real Spark over the demo's Delta tables: each materialization, the
incremental merge, Spark's parser and analyzer errors, and the YAML tests."""

import shutil
from decimal import Decimal
from pathlib import Path

import pytest
from deltalake import DeltaTable

from cdc_platform import lake
from cdc_platform.models.build import build_model, model_uri
from cdc_platform.models.checks import run_tests
from cdc_platform.models.commands import compile_models, run_models
from cdc_platform.models.compile import check_sql, render
from cdc_platform.models.project import ModelError, catalog_tables, load_project
from cdc_platform.steps.current import current_rows
from tests.models.conftest import MODELS, NEXT_DAY, replay_demo_batch

pytestmark = pytest.mark.spark


def rows(warehouse: Path, name: str, order: str) -> list[dict]:
    table = lake.read_arrow(model_uri(warehouse, name))
    return sorted(table.to_pylist(), key=lambda r: r[order])


def live(spark, warehouse: Path, table: str) -> list[dict]:
    return current_rows(spark, warehouse, "shop", table).toArrow().to_pylist()


@pytest.fixture(scope="module")
def built(spark, demo_warehouse, project, tmp_path_factory) -> Path:
    """A copy of the demo warehouse with every example model built once."""
    warehouse = Path(shutil.copytree(demo_warehouse, tmp_path_factory.mktemp("built") / "w"))
    summaries = list(run_models(spark, warehouse, project, None))
    assert [s["model"] for s in summaries][-1] == "big_spenders" or "big_spenders" in {
        s["model"] for s in summaries
    }
    return warehouse


def test_every_example_model_compiles_and_parses(spark, project):
    compiled = dict(compile_models(spark, project, None))
    headers = list(compiled)
    assert headers[0].startswith("-- models/") and len(headers) == 4
    sql = next(s for h, s in compiled.items() if "customer_order_totals" in h)
    assert "from `current__shop__customers` c" in sql


def test_a_table_model_is_the_query_over_live_current_rows(spark, built):
    customers = live(spark, built, "customers")
    orders = live(spark, built, "orders")
    expected = []
    for c in customers:
        mine = [o for o in orders if o["customer_id"] == c["id"]]
        expected.append(
            {
                "customer_id": c["id"],
                "name": c["name"],
                "email": c["email"],
                "orders": len(mine),
                "order_total": sum((o["amount"] for o in mine), Decimal(0)),
                "last_order_date": max((o["order_date"] for o in mine), default=None),
            }
        )
    assert rows(built, "customer_order_totals", "customer_id") == sorted(
        expected, key=lambda r: r["customer_id"]
    )
    assert len(expected) == 9  # the deleted customer is a tombstone, not a row


def test_a_view_is_computed_on_read_and_writes_no_table(spark, built, project):
    assert not lake.exists(model_uri(built, "big_spenders"))
    result = build_model(spark, built, project, "big_spenders")
    totals = rows(built, "customer_order_totals", "customer_id")
    big = [r for r in totals if r["order_total"] >= 1000]
    assert result.uri is None and result.rows == len(big) > 0
    assert result.schema.names == ["customer_id", "name", "email", "order_total"]


def test_a_partitioned_table_over_the_change_logs(built):
    partitions = DeltaTable(model_uri(built, "daily_changes")).metadata().partition_columns
    assert partitions == ["change_date"]
    got = {
        r["table_name"]: (r["inserted"], r["updated"], r["deleted"], r["changed_rows"])
        for r in rows(built, "daily_changes", "table_name")
    }
    assert got == {
        "shop.customers": (10, 4, 1, 15),
        "shop.orders": (20, 0, 0, 20),
        "lindorm.users": (5, 0, 0, 5),
    }


@pytest.fixture(scope="module")
def second_batch(spark, catalog, demo_warehouse, tmp_path_factory) -> Path:
    """order_facts built after the demo's first batch, then the second batch of shop replayed
    (the model not rebuilt yet)."""
    root = tmp_path_factory.mktemp("second_batch")
    warehouse = Path(shutil.copytree(demo_warehouse, root / "w"))
    project = load_project(MODELS, catalog_tables(catalog, warehouse))
    first = build_model(spark, warehouse, project, "order_facts")
    assert (first.merged, first.rows, first.input_rows) == (False, 20, {"current/shop/orders": 20})
    replay_demo_batch(spark, catalog, warehouse, root / "landing", 1, NEXT_DAY, sources={"shop"})
    return warehouse


def test_an_incremental_model_merges_only_the_rows_changed_since_its_last_build(
    spark, catalog, second_batch, tmp_path
):
    warehouse = Path(shutil.copytree(second_batch, tmp_path / "w"))
    project = load_project(MODELS, catalog_tables(catalog, warehouse))
    state = lake.state(model_uri(warehouse, "order_facts"))
    assert state.inputs["current/shop/orders"]["sequence"] is not None

    second = build_model(spark, warehouse, project, "order_facts")
    assert second.merged and second.rows == 40
    assert second.input_rows["current/shop/orders"] < 40  # not a full read
    assert second.metrics["num_target_rows_inserted"] == 20

    unchanged = build_model(spark, warehouse, project, "order_facts")
    assert unchanged.merged and unchanged.input_rows == {"current/shop/orders": 0}
    assert unchanged.rows == 40

    merged = rows(warehouse, "order_facts", "order_id")
    full = build_model(spark, warehouse, project, "order_facts", full_refresh=True)
    assert not full.merged
    assert rows(warehouse, "order_facts", "order_id") == merged
    bands = {r["size"] for r in merged}
    assert bands <= {"small", "medium", "large"} and len(merged) == 40
    parts = DeltaTable(model_uri(warehouse, "order_facts")).metadata().partition_columns
    assert parts == ["order_date"]


def test_an_incremental_build_falls_back_to_the_sequence_when_its_version_is_gone(
    spark, catalog, second_batch, tmp_path
):
    warehouse = Path(shutil.copytree(second_batch, tmp_path / "w"))
    project = load_project(MODELS, catalog_tables(catalog, warehouse))
    uri = model_uri(warehouse, "order_facts")
    state = lake.state(uri)
    state.inputs["current/shop/orders"]["version"] = 999  # a version that does not exist
    lake.replace(lake.read(spark, uri), uri, state, partition_by=["order_date"])
    again = build_model(spark, warehouse, project, "order_facts")
    # The demo's second batch restarts the binlog positions, so most of its orders sort before
    # the mark: exactly the late data the version mark catches and this fallback cannot.
    mark = state.inputs["current/shop/orders"]["sequence"]
    current = lake.read_arrow(lake.TableRef("current", "shop", "orders").uri(warehouse))
    newer = [r for r in current.to_pylist() if r["__sequence"] > mark and not r["__deleted"]]
    assert again.merged and again.input_rows == {"current/shop/orders": len(newer)}
    assert again.rows == 20 + len(newer)


def test_sql_that_does_not_parse_names_the_model_file_line(
    spark, catalog, demo_warehouse, tmp_path
):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "bad.sql").write_text(
        "{% if is_incremental() %}\n-- only merges\n{% endif %}\n"
        "select order_id,\n  amount frm {{ ref('orders') }}\nwhere\n"
    )
    (folder / "cmd.sql").write_text("-- no\ndrop table x")
    (folder / "unknown_column.sql").write_text("select\n  nope\nfrom {{ ref('orders') }}")
    project = load_project(folder, catalog_tables(catalog, demo_warehouse))
    bad = project.models["bad"]
    with pytest.raises(ModelError, match=r"bad.sql:5: SQL does not parse: \[PARSE_SYNTAX_ERROR\]"):
        check_sql(spark, bad, render(project, bad))
    cmd = project.models["cmd"]
    with pytest.raises(ModelError, match="cmd.sql: a model is one query"):
        check_sql(spark, cmd, render(project, cmd))
    with pytest.raises(ModelError, match=r"unknown_column.sql:2: \[UNRESOLVED_COLUMN"):
        build_model(spark, demo_warehouse, project, "unknown_column")


def test_a_query_over_views_not_bound_yet_passes_the_parse_check_quietly(
    spark, catalog, demo_warehouse, tmp_path, capfd
):
    # Through Spark Connect the check is the server's analysis, which fails on the views the
    # build binds later: expected, so not logged (pyspark logs such errors at ERROR, stack and
    # all, even when they are caught).
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "ok.sql").write_text("select order_id from {{ ref('orders') }}")
    project = load_project(folder, catalog_tables(catalog, demo_warehouse))
    model = project.models["ok"]
    check_sql(spark, model, render(project, model))
    assert "TABLE_OR_VIEW_NOT_FOUND" not in capfd.readouterr().err


def test_a_model_over_a_model_not_built_yet_says_so(spark, catalog, demo_warehouse, tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "a.sql").write_text("{{ config(materialized='table') }} select 1 as id")
    (folder / "b.sql").write_text("{{ config(materialized='table') }} select * from {{ ref('a') }}")
    project = load_project(folder, catalog_tables(catalog, demo_warehouse))
    with pytest.raises(ModelError, match="model a has not been built yet"):
        build_model(spark, demo_warehouse, project, "b")


def test_failing_tests_count_the_offending_rows(spark, catalog, demo_warehouse, tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "per_order.sql").write_text(
        "select customer_id, if(amount > 500, 'big', 'small') as band, "
        "if(order_id = 3, null, order_id) as order_id from {{ ref('orders') }}"
    )
    (folder / "per_order.yml").write_text(
        "columns:\n"
        "  - name: customer_id\n    tests: [unique]\n"
        "  - name: band\n    tests: [{accepted_values: {values: [small]}}]\n"
        "  - name: order_id\n    tests: [not_null]\n"
    )
    project = load_project(folder, catalog_tables(catalog, demo_warehouse))
    outcomes = {o.name: o for o in run_tests(spark, demo_warehouse, project, "per_order")}
    orders = live(spark, demo_warehouse, "orders")
    counts: dict[int, int] = {}
    for o in orders:
        counts[o["customer_id"]] = counts.get(o["customer_id"], 0) + 1
    repeated = {k: n for k, n in counts.items() if n > 1}
    unique = outcomes["customer_id__unique"]
    assert (unique.passed, unique.failing_values, unique.failing_rows) == (
        False, len(repeated), sum(repeated.values())
    )  # fmt: skip
    big = sum(1 for o in orders if o["amount"] > 500)
    assert outcomes["band__accepted_values"].failing_rows == big
    assert outcomes["band__accepted_values"].sample == ["big"]
    assert outcomes["order_id__not_null"].failing_rows == 1
