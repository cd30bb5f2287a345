"""A source run continuously (``continuous`` in sources.yaml), against the real broker: one run
finishes what an earlier run left in raw, takes micro-batch after micro-batch to the current
table, reports each step's materializations and checks as the ingest job does, and ends when
another run of its source is queued; a blocking check keeps its table unmerged; the sensor keeps
one such run going."""

import threading
import time
import uuid
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.remote_origin import (
    InProcessCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

from cdc_platform import lake
from cdc_platform.catalog import ContinuousConfig, SourceConfig
from cdc_platform.defs import continuous
from cdc_platform.defs.cdc_tables import build_source_defs
from cdc_platform.defs.metadata import PROFILE_PREFIX
from cdc_platform.defs.partitions import today
from cdc_platform.defs.resources import build_resources
from cdc_platform.defs.runs import source_tags
from cdc_platform.demo import write_demo_traffic
from cdc_platform.ingest import kafka
from cdc_platform.quality import docs
from cdc_platform.steps.progress import unfinished
from tests.defs.test_pipeline_in_dagster import DAY
from tests.kafka.test_kafka_in_dagster import CORPUS_FILE, _catalog, _current, _lines
from tests.kafka.test_kafka_ingest import _produce, _topic
from tests.ops.live_stack import free_port
from tests.quality.test_dagster import TOO_OLD
from tests.quality.test_dagster import catalog as shop_catalog  # noqa: F401  (a fixture)
from tests.spark.test_corpus_debezium import _comparable

pytestmark = pytest.mark.spark


def _continuous(source: SourceConfig, minutes: float, **settings) -> SourceConfig:
    """The source run continuously; by default each look that finds data takes it at once."""
    settings = {"max_wait_seconds": 0, **settings}
    config = ContinuousConfig(run_minutes=minutes, poll_seconds=0.2, **settings)
    return source.model_copy(update={"continuous": config})


def _defs(catalog, source: SourceConfig) -> dg.Definitions:
    return dg.Definitions.merge(
        build_source_defs(source, catalog),
        dg.Definitions(resources=build_resources(catalog), executor=dg.in_process_executor),
    )


def _queue_a_run(instance: dg.DagsterInstance, source: str) -> None:
    """What a backfill or a manual run of the source leaves in the queue (a queued run names
    the code location it comes from)."""
    job = f"{source}__ingest"
    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(python_file=__file__))
    origin = RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job)
    instance.add_run(
        dg.DagsterRun(
            job_name=job,
            run_id=str(uuid.uuid4()),
            status=dg.DagsterRunStatus.QUEUED,
            tags=source_tags(source),
            remote_job_origin=origin,
        )
    )


def _run_while(
    job: dg.JobDefinition, instance: dg.DagsterInstance, source: str, feed
) -> dg.ExecuteInProcessResult:
    """The continuous ``job`` of ``source``, run while ``feed`` (in a thread) brings it data
    and at last queues another run of the source, which ends it."""
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    result = job.execute_in_process(instance=instance, tags=source_tags(source))
    feeder.join(timeout=5)
    return result


def _end_once_merged(
    instance: dg.DagsterInstance, warehouse, source: SourceConfig, records: int
) -> None:
    """Once raw holds ``records`` records and all of them are merged, queue another run of the
    source: the continuous run ends for it."""
    raw_uri = lake.TableRef(lake.RAW, source.name).uri(warehouse)
    _wait(lambda: lake.read_arrow(raw_uri).num_rows == records, f"{records} records in raw")
    _wait(lambda: not unfinished(warehouse, source), "every record merged")
    _queue_a_run(instance, source.name)


def _wait(condition, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_one_run_takes_micro_batch_after_micro_batch(spark, kafka_bootstrap, tmp_path, expected):
    entry = expected[CORPUS_FILE]
    topic = _topic(kafka_bootstrap, "continuous")
    catalog, table = _catalog(tmp_path, kafka_bootstrap, topic, entry)
    warehouse = catalog.warehouse_uri
    source = _continuous(catalog.source("k"), minutes=5)
    lines = _lines()
    head, tail = lines[:10], lines[10:]
    _produce(kafka_bootstrap, topic, [{"value": v} for v in head])
    # An earlier run stored the first records in raw and died before normalizing them.
    kafka.ingest_kafka(warehouse, source, date=today().isoformat())
    raw_uri = lake.TableRef(lake.RAW, "k").uri(warehouse)
    current_uri = lake.TableRef(lake.CURRENT, "k", table).uri(warehouse)

    with dg.instance_for_test() as instance:
        job = _defs(catalog, source).resolve_job_def("k__continuous")

        def feed() -> None:
            # Once the first micro-batch (the catch-up) is merged, the rest of the records come;
            # once they are merged too, a queued run of the source ends the continuous run.
            _wait(
                lambda: lake.exists(current_uri) and not unfinished(warehouse, source), "catch-up"
            )
            _produce(kafka_bootstrap, topic, [{"value": v} for v in tail])
            _end_once_merged(instance, warehouse, source, len(lines))

        result = _run_while(job, instance, "k", feed)
        profiles = [
            e.user_message
            for e in instance.all_logs(result.run_id)
            if e.user_message.startswith(PROFILE_PREFIX)
        ]

    assert result.success
    assert _current(spark, warehouse, table, entry) == _comparable(entry["final_state"], entry)
    raw = lake.read_arrow(raw_uri)
    assert sorted(raw["offset"].to_pylist()) == list(range(len(lines)))  # each record once

    materialized = [m.asset_key.to_user_string() for m in _materializations(result)]
    # The catch-up had no new raw; the second micro-batch did.
    assert materialized.count("raw/k") == 1
    assert materialized.count(f"changelog/k/{table}") == 2
    assert materialized.count(f"current/k/{table}") == 2
    (raw_meta,) = [m for m in _materializations(result) if m.asset_key.path == ["raw", "k"]]
    assert raw_meta.partition == today().isoformat()
    assert raw_meta.metadata["ingested_records"].value == len(tail)
    assert raw_meta.metadata["dagster/partition_row_count"].value == len(lines)
    checks = result.get_asset_check_evaluations()
    names = {(c.asset_key.to_user_string(), c.check_name) for c in checks}
    assert (f"changelog/k/{table}", "op_in_domain") in names
    assert (f"current/k/{table}", "row_count_balance") in names
    assert all(c.passed for c in checks)
    # One profile line per micro-batch that did work, none for the looks that found nothing.
    assert len(profiles) == 2


def test_micro_batches_stop_at_the_adaptive_bound_and_the_next_goes_on(
    spark, kafka_bootstrap, tmp_path, expected, monkeypatch
):
    # A backlog, and a bound that starts at 2 records and grows (at most 2x) while every
    # micro-batch is cut by it and finishes well within batch_seconds.
    entry = expected[CORPUS_FILE]
    topic = _topic(kafka_bootstrap, "adaptive")
    catalog, table = _catalog(tmp_path, kafka_bootstrap, topic, entry)
    warehouse = catalog.warehouse_uri
    monkeypatch.setattr(continuous, "FIRST_RECORDS_PER_SECOND", 2 / 600)
    monkeypatch.setattr(continuous, "MIN_RECORDS", 1)
    monkeypatch.setattr(continuous, "MAX_GROWTH", 2)
    source = catalog.source("k").model_copy(
        update={"continuous": ContinuousConfig(run_minutes=5, poll_seconds=0.2, batch_seconds=600)}
    )
    lines = _lines()
    _produce(kafka_bootstrap, topic, [{"value": v} for v in lines])
    raw_uri = lake.TableRef(lake.RAW, "k").uri(warehouse)

    with dg.instance_for_test() as instance:
        job = _defs(catalog, source).resolve_job_def("k__continuous")

        def end_when_all_merged() -> None:
            def all_merged() -> bool:
                return (
                    lake.exists(raw_uri)
                    and lake.read_arrow(raw_uri).num_rows == len(lines)
                    and not unfinished(warehouse, source)
                )

            _wait(all_merged, "every record merged", seconds=300)
            _queue_a_run(instance, "k")

        result = _run_while(job, instance, "k", end_when_all_merged)

    assert result.success
    raws = [m for m in _materializations(result) if m.asset_key.path == ["raw", "k"]]
    taken = [m.metadata["ingested_records"].value for m in raws]
    # 2, 4, 8 records, then the rest (fewer than the bound of 16): each micro-batch from where
    # the one before stopped.
    assert taken == [2, 4, 8, len(lines) - 14]
    assert [m.metadata["more_waiting"].value for m in raws] == [True, True, True, False]
    offsets = lake.read_arrow(raw_uri)["offset"].to_pylist()
    assert sorted(offsets) == list(range(len(lines)))  # each record once
    assert _current(spark, warehouse, table, entry) == _comparable(entry["final_state"], entry)


def test_a_trickle_waits_for_more_until_max_wait_seconds(
    spark, kafka_bootstrap, tmp_path, expected
):
    # Fewer records than min_batch_records: the first look that sees them waits max_wait_seconds
    # for more, so records produced meanwhile go into the same micro-batch.
    entry = expected[CORPUS_FILE]
    topic = _topic(kafka_bootstrap, "trickle")
    catalog, table = _catalog(tmp_path, kafka_bootstrap, topic, entry)
    warehouse = catalog.warehouse_uri
    wait = 8.0
    source = _continuous(
        catalog.source("k"), minutes=5, min_batch_records=10**6, max_wait_seconds=wait
    )
    lines = _lines()
    head, first, rest = lines[:10], lines[10:13], lines[13:]
    _produce(kafka_bootstrap, topic, [{"value": v} for v in head])
    current_uri = lake.TableRef(lake.CURRENT, "k", table).uri(warehouse)
    produced: list[float] = []

    with dg.instance_for_test() as instance:
        job = _defs(catalog, source).resolve_job_def("k__continuous")

        def feed() -> None:
            # The run's first look takes the head at once (a run starts by catching up).
            _wait(
                lambda: lake.exists(current_uri) and not unfinished(warehouse, source), "the head"
            )
            produced.append(time.time())
            _produce(kafka_bootstrap, topic, [{"value": v} for v in first])
            _produce(kafka_bootstrap, topic, [{"value": v} for v in rest])
            _end_once_merged(instance, warehouse, source, len(lines))

        result = _run_while(job, instance, "k", feed)
        raws = [
            e
            for e in instance.all_logs(
                result.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
            )
            if e.dagster_event.asset_key == dg.AssetKey(["raw", "k"])
        ]

    assert result.success
    taken = [e.dagster_event.materialization.metadata["ingested_records"].value for e in raws]
    assert taken == [len(head), len(first) + len(rest)]
    # Taken no sooner than max_wait_seconds after the first of them could be seen.
    assert raws[1].timestamp - produced[0] >= wait
    assert _current(spark, warehouse, table, entry) == _comparable(entry["final_state"], entry)


def test_landing_files_start_a_micro_batch_once_min_batch_bytes_wait(
    shop_catalog,  # noqa: F811
    tmp_path,
):
    # Two more batches of demo files: the first alone is less than min_batch_bytes and waits
    # (max_wait_seconds is long); with the second, enough waits and one micro-batch takes both.
    sizes = [
        next(p for p in map(Path, write_demo_traffic(tmp_path / "sizes", batch=b, date=DAY))
             if "shop" in p.parts).stat().st_size
        for b in (1, 2)
    ]  # fmt: skip
    warehouse, landing = shop_catalog.warehouse_uri, shop_catalog.landing_uri
    source = _continuous(
        shop_catalog.source("shop"), minutes=5, min_batch_bytes=sum(sizes), max_wait_seconds=600
    )
    raw_uri = lake.TableRef(lake.RAW, "shop").uri(warehouse)
    current_uri = lake.TableRef(lake.CURRENT, "shop", "orders").uri(warehouse)
    versions: list[int] = []  # raw's commits while the first file waited

    with dg.instance_for_test() as instance:
        job = _defs(shop_catalog, source).resolve_job_def("shop__continuous")

        def feed() -> None:
            _wait(
                lambda: lake.exists(current_uri) and not unfinished(warehouse, source),
                "the first files (a run starts by catching up)",
            )
            before = lake.version(raw_uri)
            write_demo_traffic(landing, batch=1, date=DAY)
            time.sleep(2)  # ten looks, each finding less than min_batch_bytes
            versions.append(lake.version(raw_uri) - before)
            write_demo_traffic(landing, batch=2, date=DAY)
            _wait(lambda: lake.version(raw_uri) > before, "the two files in raw")
            _wait(lambda: not unfinished(warehouse, source), "the two files merged")
            _queue_a_run(instance, "shop")

        result = _run_while(job, instance, "shop", feed)

    assert result.success
    assert versions == [0]
    raws = [m for m in _materializations(result) if m.asset_key.path == ["raw", "shop"]]
    assert [m.metadata["files_ingested"].value for m in raws] == [1, 2]


def _materializations(result: dg.ExecuteInProcessResult) -> list[dg.AssetMaterialization]:
    return [e.materialization for e in result.get_asset_materialization_events()]


def test_a_blocking_check_keeps_its_table_unmerged(spark, shop_catalog):  # noqa: F811
    shop = shop_catalog.source("shop")
    tables = [
        t.model_copy(update={"quality": TOO_OLD}) if t.name == "customers" else t
        for t in shop.tables
    ]
    # A run that ends after its first micro-batch.
    source = _continuous(shop.model_copy(update={"tables": tables}), minutes=0.001)
    job = _defs(shop_catalog, source).resolve_job_def("shop__continuous")
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance)
    assert result.success
    failed = [
        (c.asset_key.to_user_string(), c.check_name)
        for c in result.get_asset_check_evaluations()
        if not c.passed
    ]
    assert failed == [("changelog/shop/customers", "event_time_bounds")]
    materialized = {m.asset_key.to_user_string() for m in _materializations(result)}
    assert "changelog/shop/customers" in materialized
    assert "current/shop/customers" not in materialized  # written, not merged
    assert {"current/shop/orders", "raw/shop"} <= materialized


def test_a_micro_batch_reports_its_checks_at_its_end_with_one_publish(
    shop_catalog,  # noqa: F811
    monkeypatch,
):
    published: list[list[str]] = []
    publish = docs.publish

    def counted(runs, reports, rebuild=False):
        validations = [run.suite.split(".")[0] for run, _ in runs if run.result is not None]
        published.append(sorted(validations))
        return publish(runs, reports, rebuild)

    def broken(*args, **kwargs):
        raise RuntimeError("the merge broke")

    monkeypatch.setattr(docs, "publish", counted)
    source = _continuous(shop_catalog.source("shop"), minutes=0.001)  # one micro-batch
    job = _defs(shop_catalog, source).resolve_job_def("shop__continuous")

    def run() -> tuple[dg.ExecuteInProcessResult, set[str]]:
        published.clear()
        with dg.instance_for_test() as instance:
            result = job.execute_in_process(instance=instance, raise_on_error=False)
        return result, {c.asset_key.to_user_string() for c in result.get_asset_check_evaluations()}

    # A step failing after the change logs' checks: the run fails, and those checks are still
    # reported and published.
    with monkeypatch.context() as patch:
        patch.setattr(continuous, "merge_current", broken)
        result, checked = run()
    assert not result.success
    assert checked == {"changelog/shop/customers", "changelog/shop/orders", "quarantine/shop"}
    assert published == [["changelog", "changelog", "reconciliation"]]

    # The next run merges what it left (nothing new to validate in the change logs); the
    # current tables' checks, one publish.
    result, checked = run()
    assert result.success
    assert checked >= {"current/shop/customers", "current/shop/orders"}
    assert published == [["current", "current", "current_rows", "current_rows"]]


def test_the_sensor_keeps_one_run_going(kafka_bootstrap, tmp_path, expected, monkeypatch):
    topic = _topic(kafka_bootstrap, "keep")
    catalog, _ = _catalog(tmp_path, kafka_bootstrap, topic, expected[CORPUS_FILE])
    source = _continuous(catalog.source("k"), minutes=30)
    defs = _defs(catalog, source)
    sensor = defs.resolve_sensor_def("k__continuous_sensor")
    assert [s.name for s in defs.sensors] == ["k__continuous_sensor"]  # no per-batch sensor

    with dg.instance_for_test() as instance:

        def tick() -> dg.SensorResult:
            with dg.build_sensor_context(instance=instance) as context:
                return sensor(context)

        (request,) = tick().run_requests
        assert request.job_name in (None, "k__continuous")
        job = defs.resolve_job_def("k__continuous")

        def failed_run() -> None:
            run = instance.create_run_for_job(job_def=job, tags=source_tags("k"))
            assert "in flight" in tick().skip_reason.skip_message  # not started yet: still one
            instance.report_run_failed(run)

        failed_run()
        assert len(tick().run_requests) == 1  # one failure (a killed run): at once
        failed_run()
        assert "failed" in tick().skip_reason.skip_message  # two in a row: spaced out
        monkeypatch.setattr(continuous, "RESTART_AFTER_FAILURE_SECONDS", 0)
        assert len(tick().run_requests) == 1


def test_a_transient_failure_is_waited_out_in_place_then_fails_the_run(
    kafka_bootstrap, tmp_path, expected, monkeypatch
):
    # The broker unreachable (a closed port): each micro-batch's first step fails with a
    # transient error; the run waits and tries again, and fails once the waits are used up.
    topic = _topic(kafka_bootstrap, "gone")
    closed = f"127.0.0.1:{free_port()}"
    catalog, _ = _catalog(tmp_path, closed, topic, expected[CORPUS_FILE])
    monkeypatch.setattr(continuous, "RETRY_SECONDS", (0.1, 0.1))
    monkeypatch.setattr(kafka, "_METADATA_TIMEOUT", 1)  # how long "unreachable" takes to say
    job = _defs(catalog, _continuous(catalog.source("k"), minutes=5)).resolve_job_def(
        "k__continuous"
    )
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False)
        warnings = [
            e.user_message
            for e in instance.all_logs(result.run_id)
            if e.user_message.startswith("transient:")
        ]
    assert not result.success
    assert len(warnings) == 2
    assert all("the Kafka broker is unreachable" in w for w in warnings)


def test_landing_dates_outside_the_partitions_wait_and_are_said_once(shop_catalog):  # noqa: F811
    # The demo's files are of an earlier date than the source's first partition.
    shop = shop_catalog.source("shop").model_copy(update={"start_date": today()})
    job = _defs(shop_catalog, _continuous(shop, minutes=0.05)).resolve_job_def("shop__continuous")
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance)
        said = [
            e.user_message
            for e in instance.all_logs(result.run_id)
            if "outside the partitions" in e.user_message
        ]
    assert result.success
    assert len(said) == 1 and "set start_date" in said[0]  # polled many times, said once
    assert not result.get_asset_materialization_events()
    assert not lake.exists(lake.TableRef(lake.RAW, "shop").uri(shop_catalog.warehouse_uri))
