"""Materialize the demo catalog's assets with Dagster (its sensors: test_landing_sensor.py)."""

import json
from pathlib import Path

import dagster as dg
import pytest

from cdc_platform import lake
from cdc_platform.catalog import load_catalog
from cdc_platform.defs.cdc_tables import build_source_defs
from cdc_platform.defs.resources import build_resources
from cdc_platform.demo import write_demo_traffic

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]
DAY = "2026-03-01"
NEXT_DAY = "2026-03-02"


@pytest.fixture
def catalog(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.setenv("CDC_LANDING", str(tmp_path / "landing"))
    return load_catalog(ROOT / "sources.yaml")


def _assets(catalog, source):
    return build_source_defs(catalog.source(source), catalog).assets


def test_materializing_the_chain_builds_current_tables(spark, catalog):
    write_demo_traffic(catalog.landing_uri, batch=0, date=DAY)
    resources = build_resources(catalog)
    assets = _assets(catalog, "shop")
    partitioned = [a for a in assets if a.partitions_def is not None]
    result = dg.materialize(partitioned, resources=resources, partition_key=DAY)
    assert result.success
    cl = result.asset_materializations_for_node("shop__changelog")
    by_key = {m.asset_key.to_user_string(): m.metadata for m in cl}
    assert by_key["changelog/shop/customers"]["rows_by_op"].data == {"c": 10, "u": 4, "d": 1}
    assert by_key["changelog/shop/orders"]["rows_by_op"].data == {"c": 20}
    assert by_key["quarantine/shop"]["control_messages"].value == 1  # the Kafka tombstone

    current = [a for a in assets if a.partitions_def is None]
    result = dg.materialize(current, resources=resources)
    assert result.success
    events = result.get_asset_materialization_events()
    meta = {
        e.materialization.asset_key.to_user_string(): e.materialization.metadata for e in events
    }
    assert meta["current/shop/customers"]["dagster/row_count"].value == 9
    assert meta["current/shop/customers"]["tombstones"].value == 1
    assert meta["current/shop/orders"]["dagster/row_count"].value == 20
    orders = lake.read(spark, lake.TableRef("current", "shop", "orders").uri(catalog.warehouse_uri))
    types = dict(orders.dtypes)
    assert types["amount"] == "decimal(10,2)" and types["order_date"] == "date"


@pytest.mark.connect  # its [connect] run: the whole path on Spark Connect
def test_lindorm_hbase_demo_table_is_decoded_and_backfilled_with_per_partition_counts(
    spark, catalog
):
    # Two dates of 10 and 5 messages, backfilled in one run (single-run backfill policy).
    write_demo_traffic(catalog.landing_uri, batch=0, date=DAY)
    write_demo_traffic(catalog.landing_uri, batch=1, date=DAY)
    write_demo_traffic(catalog.landing_uri, batch=2, date=NEXT_DAY)
    assets = _assets(catalog, "lindorm")
    resources = build_resources(catalog)
    partitioned = [a for a in assets if a.partitions_def is not None]
    result = dg.materialize(
        partitioned,
        resources=resources,
        tags={
            "dagster/asset_partition_range_start": DAY,
            "dagster/asset_partition_range_end": NEXT_DAY,
        },
    )
    assert result.success
    # One materialization per partition, each with its partition's rows (not the run's).
    counts: dict[str, dict[str, int]] = {}
    for event in result.get_asset_materialization_events():
        m = event.materialization
        rows = m.metadata["dagster/partition_row_count"].value
        counts.setdefault(m.asset_key.to_user_string(), {})[m.partition] = rows
    assert counts["raw/lindorm"] == {DAY: 10, NEXT_DAY: 5}
    assert counts["changelog/lindorm/users"] == {DAY: 10, NEXT_DAY: 5}
    assert counts["quarantine/lindorm"] == {DAY: 0, NEXT_DAY: 0}

    current = [a for a in assets if a.partitions_def is None]
    assert dg.materialize(current, resources=resources).success
    rows = lake.read(spark, lake.TableRef("current", "lindorm", "users").uri(catalog.warehouse_uri))
    users = sorted(r["ROW"] for r in rows.toArrow().to_pylist())
    assert users == sorted(f"user{i}" for i in range(1, 16))


def test_undeclared_tables_are_routed_and_get_assets_on_reload(spark, catalog):
    write_demo_traffic(catalog.landing_uri, batch=0, date=DAY)
    extra = Path(catalog.landing_uri) / "shop" / f"dt={DAY}" / "zz-products.kafka.jsonl"
    value = {"before": None, "after": {"id": 7, "name": "drill"}, "op": "c",
             "source": {"db": "inventory", "table": "products", "file": "mysql-bin.000001",
                        "pos": 9, "row": 0, "ts_ms": 1}}  # fmt: skip
    extra.write_text(json.dumps({"offset": 0, "key": {"id": 7}, "value": value}) + "\n")
    resources = build_resources(catalog)
    assets = _assets(catalog, "shop")
    partitioned = [a for a in assets if a.partitions_def is not None]
    result = dg.materialize(partitioned, resources=resources, partition_key=DAY)
    quarantine = next(
        m.metadata
        for m in result.asset_materializations_for_node("shop__changelog")
        if m.asset_key.to_user_string() == "quarantine/shop"
    )
    assert quarantine["new_routed_tables"].data == ["inventory.products"]

    reloaded = dg.Definitions.merge(
        build_source_defs(catalog.source("shop"), catalog), dg.Definitions(resources=resources)
    )
    keys = {k.to_user_string() for k in reloaded.resolve_asset_graph().get_all_asset_keys()}
    assert {"changelog/shop/inventory__products", "current/shop/inventory__products"} <= keys


def test_landing_sensor_runs_carry_new_files_to_the_current_table(spark, catalog):
    """Sensor -> incremental run -> current, twice: one date, then new files on two dates (one
    run over their range). The runs ingest just the new files."""
    write_demo_traffic(catalog.landing_uri, batch=0, date=DAY)
    resources = build_resources(catalog)
    source_defs = dg.Definitions.merge(
        # With a run per batch, whose sensor this tests (the demo's runs continuously).
        build_source_defs(
            catalog.source("lindorm").model_copy(update={"continuous": None}), catalog
        ),  # fmt: skip
        dg.Definitions(resources=resources, executor=dg.in_process_executor),
    )
    sensor = source_defs.resolve_sensor_def("lindorm__landing_sensor")
    job = source_defs.resolve_job_def("lindorm__ingest")

    def tick_and_run(cursor: str | None, instance: dg.DagsterInstance) -> tuple[str, dict]:
        with dg.build_sensor_context(
            instance=instance, cursor=cursor, resources=resources
        ) as context:
            result = sensor(context)
        (request,) = result.run_requests
        run = job.execute_in_process(
            partition_key=request.partition_key, tags=request.tags, instance=instance
        )
        assert run.success
        # One materialization per partition of the run, each with the run's metadata.
        raw = run.asset_materializations_for_node("raw__lindorm")[0]
        return result.cursor, {k: getattr(v, "value", v) for k, v in raw.metadata.items()}

    def users() -> list[str]:
        rows = lake.read(
            spark, lake.TableRef("current", "lindorm", "users").uri(catalog.warehouse_uri)
        )
        return sorted(r["ROW"] for r in rows.toArrow().to_pylist())

    with dg.instance_for_test() as instance:
        cursor, raw = tick_and_run(None, instance)
        assert raw["files_ingested"] == 1
        assert users() == sorted(f"user{i}" for i in range(1, 6))

        write_demo_traffic(catalog.landing_uri, batch=1, date=DAY)
        write_demo_traffic(catalog.landing_uri, batch=2, date=NEXT_DAY)
        cursor, raw = tick_and_run(cursor, instance)
        assert raw["files_ingested"] == 2  # the two new files, not batch 0's again
        assert users() == sorted(f"user{i}" for i in range(1, 16))
