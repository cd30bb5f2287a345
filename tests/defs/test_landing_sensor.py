"""The landing sensor on a real Dagster instance: one incremental run at a time per source, over
the dates of the files raw lacks, requested once per state; partitions start where the data
starts. No Spark: raw is written by the ingest step (delta-rs), the first step of the run."""

import datetime as dt
import json
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteRepositoryOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

from cdc_platform.catalog import load_catalog
from cdc_platform.defs.cdc_tables import build_source_defs
from cdc_platform.defs.partitions import today, with_start_date
from cdc_platform.defs.resources import LakeResource, build_resources
from cdc_platform.defs.runs import (
    FULL_LISTING,
    INCREMENTAL,
    INCREMENTAL_TAG,
    LISTING_TAG,
    SOURCE_TAG,
    SensorCursor,
)
from cdc_platform.defs.sensors import RANGE_END_TAG, RANGE_START_TAG
from cdc_platform.demo import write_demo_traffic
from cdc_platform.steps.raw import ingest_landing
from tests.normalized import mark_normalized

ROOT = Path(__file__).resolve().parents[2]
DAY = "2026-03-01"
NEXT_DAY = "2026-03-02"
JOB = "shop__ingest"


@pytest.fixture
def catalog(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.setenv("CDC_LANDING", str(tmp_path / "landing"))
    return load_catalog(ROOT / "sources.yaml")


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def _reason(result: dg.SensorResult) -> str:
    return result.skip_reason.skip_message if result.skip_reason else ""


class _Shop:
    """Source shop's definitions, loaded once its landing folder holds what a test wrote (the
    partitions start at its earliest date, as on a reload)."""

    def __init__(self, catalog, instance: dg.DagsterInstance) -> None:
        self.catalog, self.instance = catalog, instance
        self.resources = build_resources(catalog)
        self.defs = dg.Definitions.merge(
            # With a run per batch, whose sensor this file tests (the demo's runs continuously).
            build_source_defs(
                catalog.source("shop").model_copy(update={"continuous": None}), catalog
            ),  # fmt: skip
            dg.Definitions(resources=self.resources),
        )
        self.sensor = self.defs.resolve_sensor_def("shop__landing_sensor")
        self.job = self.defs.resolve_job_def(JOB)

    def tick(self, cursor: str | None, **resources) -> dg.SensorResult:
        with dg.build_sensor_context(
            instance=self.instance, cursor=cursor, resources={**self.resources, **resources}
        ) as context:
            return self.sensor(context)

    def ingest(self, dates: list[str]) -> None:
        """What the requested run's raw step does (incremental: only the pending files)."""
        landing = self.catalog.landing_for(self.catalog.source("shop"))
        ingest_landing(self.catalog.warehouse_uri, "shop", landing, dates)


def test_one_incremental_run_for_the_pending_files_then_nothing_until_new_files(catalog, instance):
    write_demo_traffic(catalog.landing_uri, batch=0, date=DAY)
    shop = _Shop(catalog, instance)

    first = shop.tick(None)
    (request,) = first.run_requests
    assert request.partition_key == DAY
    assert request.tags[INCREMENTAL_TAG] == INCREMENTAL
    assert RANGE_START_TAG not in request.tags
    # Re-evaluated in the same state: requested once.
    again = shop.tick(first.cursor)
    assert again.run_requests == [] and "already requested" in _reason(again)
    assert shop.tick(None).run_requests[0].run_key == request.run_key  # same state, same key

    shop.ingest([DAY])  # the run did its work: raw holds every file
    mark_normalized(catalog.warehouse_uri, "shop")  # ... and its change log too
    done = shop.tick(first.cursor)
    assert done.run_requests == [] and "raw holds every landing file" in _reason(done)
    assert SensorCursor.parse(done.cursor).raw_version is not None

    write_demo_traffic(catalog.landing_uri, batch=1, date=DAY)
    (later,) = shop.tick(done.cursor).run_requests
    assert later.partition_key == DAY and later.run_key != request.run_key
    assert later.tags["cdc/pending_files"] == "1"  # only the new file


def test_a_run_that_died_after_its_raw_commit_is_finished_by_one_more_run(catalog, instance):
    """Raw holds every file but a run died before its outputs had them (kill -9 in normalize):
    with no new file to bring the next run, the sensor asks for one that finishes them, once."""
    write_demo_traffic(catalog.landing_uri, batch=0, date=DAY)
    shop = _Shop(catalog, instance)
    first = shop.tick(None)
    shop.ingest([DAY])  # the requested run's raw commit; then it died
    (finish,) = shop.tick(first.cursor).run_requests
    assert finish.run_key.startswith("finish:raw@0>normalized@None")
    assert finish.tags[INCREMENTAL_TAG] == INCREMENTAL  # it normalizes what raw has new
    assert finish.partition_key == today().isoformat()
    again = shop.tick(shop.tick(first.cursor).cursor)
    assert again.run_requests == [] and "already requested" in _reason(again)  # not a loop

    run = _add_run(instance, shop.job, dg.DagsterRunStatus.STARTED)  # its outputs are moving
    assert shop.tick(None).run_requests == []
    instance.report_run_failed(instance.get_run_by_id(run.run_id))

    mark_normalized(catalog.warehouse_uri, "shop", version=0)  # the finishing run did its work
    done = shop.tick(first.cursor)
    assert done.run_requests == [] and "raw holds every landing file" in _reason(done)


def _aged(cursor: str, minutes: float) -> str:
    """``cursor`` as it would be ``minutes`` later (its last whole listing that much older)."""
    data = json.loads(cursor)
    data["listed_at"] -= minutes * 60
    return json.dumps(data)


def test_a_tick_lists_from_the_last_file_raw_holds_and_the_whole_folder_hourly(catalog, instance):
    """Between whole listings (every full_listing_minutes), a tick finds the files named after
    the last one raw holds, and that one grown; a file landed under an earlier name waits for
    the next whole listing, whose run lists its dates whole too."""
    write_demo_traffic(catalog.landing_uri, batch=0, date=DAY)
    write_demo_traffic(catalog.landing_uri, batch=1, date=DAY)
    shop = _Shop(catalog, instance)
    assert catalog.source("shop").full_listing_minutes == 60
    (first,) = (tick := shop.tick(None)).run_requests  # no cursor: a whole listing
    assert first.tags[LISTING_TAG] == FULL_LISTING and first.tags["cdc/pending_files"] == "2"
    shop.ingest([DAY])
    mark_normalized(catalog.warehouse_uri, "shop")
    cursor = shop.tick(tick.cursor).cursor

    folder = Path(catalog.landing_uri, "shop", f"dt={DAY}")
    late = folder / "00000-late.kafka.jsonl"  # sorts before 00001, the last file raw holds
    late.write_bytes((folder / "00000.kafka.jsonl").read_bytes())
    with (folder / "00001.kafka.jsonl").open("ab") as grown:
        grown.write((folder / "00000.kafka.jsonl").read_bytes())
    write_demo_traffic(catalog.landing_uri, batch=2, date=DAY)
    (second,) = (tick := shop.tick(cursor)).run_requests
    assert LISTING_TAG not in second.tags and second.tags["cdc/pending_files"] == "2"
    assert f"dt={DAY}/00001.kafka.jsonl,dt={DAY}/00002.kafka.jsonl|" in second.run_key
    ingest_landing(catalog.warehouse_uri, "shop", str(folder.parent), [DAY], full=False)
    mark_normalized(catalog.warehouse_uri, "shop")
    cursor = shop.tick(tick.cursor).cursor
    assert shop.tick(_aged(cursor, 59)).run_requests == []  # the late file waits

    (third,) = shop.tick(_aged(cursor, 61)).run_requests
    assert third.tags[LISTING_TAG] == FULL_LISTING
    assert third.run_key.startswith(f"{DAY}:dt={DAY}/00000-late.kafka.jsonl|")


def _add_run(instance: dg.DagsterInstance, job: dg.JobDefinition, status) -> dg.DagsterRun:
    """A run of ``job`` in ``status``, as the run queue or launcher would have left it. A queued
    run must name the code location it came from: an in-process one here."""
    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="cdc_platform"))
    origin = RemoteRepositoryOrigin(location, "__repository__").get_job_origin(job.name)
    return instance.create_run_for_job(
        job, status=status, tags={"dagster/partition": DAY}, remote_job_origin=origin
    )


def test_no_request_while_a_run_of_the_job_is_queued_or_started(catalog, instance):
    write_demo_traffic(catalog.landing_uri, batch=0, date=DAY)
    shop = _Shop(catalog, instance)
    run = _add_run(instance, shop.job, dg.DagsterRunStatus.QUEUED)
    queued = shop.tick(None)
    assert queued.run_requests == []
    assert run.run_id[:8] in _reason(queued) and "queued or running" in _reason(queued)

    instance.report_run_failed(instance.get_run_by_id(run.run_id))  # no longer in flight
    started = _add_run(instance, shop.job, dg.DagsterRunStatus.STARTED)
    assert shop.tick(queued.cursor).run_requests == []

    instance.report_run_failed(instance.get_run_by_id(started.run_id))
    (request,) = shop.tick(queued.cursor).run_requests
    assert request.partition_key == DAY


def test_pending_files_on_several_dates_are_one_run_over_their_range(catalog, instance):
    write_demo_traffic(catalog.landing_uri, batch=0, date=DAY)
    shop = _Shop(catalog, instance)
    shop.ingest([DAY])
    third = (dt.date.fromisoformat(DAY) + dt.timedelta(days=2)).isoformat()
    write_demo_traffic(catalog.landing_uri, batch=1, date=DAY)
    write_demo_traffic(catalog.landing_uri, batch=2, date=third)

    (request,) = shop.tick(None).run_requests
    assert request.partition_key is None
    assert (request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]) == (DAY, third)
    assert request.partition_key_range == dg.PartitionKeyRange(DAY, third)
    assert request.tags[INCREMENTAL_TAG] == INCREMENTAL
    # The run carries the source's tag, which the run queue limits to one run at a time.
    assert shop.job.run_tags[SOURCE_TAG] == "shop"


def test_dates_before_the_partitions_are_logged_and_skipped(catalog, instance):
    write_demo_traffic(catalog.landing_uri, batch=0, date=today().isoformat())
    shop = _Shop(catalog, instance)  # partitions start today
    write_demo_traffic(catalog.landing_uri, batch=1, date=DAY)

    (request,) = shop.tick(None).run_requests
    assert request.partition_key == today().isoformat()
    shop.ingest([today().isoformat()])
    mark_normalized(catalog.warehouse_uri, "shop")
    skipped = shop.tick(None)
    assert skipped.run_requests == []
    assert f"outside the partitions: {DAY}" in _reason(skipped)


def test_the_sensor_reads_the_landing_folder_of_the_lake_resource(catalog, instance, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    write_demo_traffic(elsewhere, batch=0)  # <elsewhere>/shop/dt=<today>/...
    shop = _Shop(catalog, instance)
    assert shop.tick(None).run_requests == []  # nothing under the catalog's landing folder

    lake = LakeResource(
        warehouse=str(catalog.warehouse_uri),
        landing=str(catalog.landing_uri),
        locations={"shop": str(elsewhere / "shop")},
    )
    assert lake.landing_for("shop") == str(elsewhere / "shop")
    assert lake.landing_for("lindorm") == f"{catalog.landing_uri}/lindorm"
    (request,) = shop.tick(None, lake=lake).run_requests
    assert request.partition_key == today().isoformat()


def _catalog_file(tmp_path: Path, **source) -> Path:
    path = tmp_path / "sources.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "warehouse": str(tmp_path / "warehouse"),
                "landing": str(tmp_path / "landing"),
                "sources": [{"name": "s", "format": "debezium", **source}],
            }
        )
    )
    return path


@pytest.fixture
def own_paths(monkeypatch):
    for var in ("CDC_WAREHOUSE", "CDC_LANDING"):
        monkeypatch.delenv(var, raising=False)


def test_partitions_start_at_the_earliest_landing_date_unless_configured(tmp_path, own_paths):
    catalog = load_catalog(_catalog_file(tmp_path))
    source = catalog.source("s")
    assert with_start_date(source, catalog).start_date == today()  # no data: today

    for date in ("2026-03-05", "2026-02-27", "2026-13-45"):  # the last is no date: ignored
        folder = tmp_path / "landing" / "s" / f"dt={date}"
        folder.mkdir(parents=True)
        (folder / "a.jsonl").write_text("{}\n")
    assert with_start_date(source, catalog).start_date == dt.date(2026, 2, 27)

    configured = load_catalog(_catalog_file(tmp_path, start_date="2025-06-01"))
    assert with_start_date(configured.source("s"), configured).start_date == dt.date(2025, 6, 1)
    shop = build_source_defs(configured.source("s"), configured)
    (raw,) = [a for a in shop.assets if dg.AssetKey(["raw", "s"]) in a.keys]
    assert raw.partitions_def.get_first_partition_key() == "2025-06-01"


def test_partitions_start_at_raws_first_date_when_the_landing_files_are_gone(tmp_path, own_paths):
    catalog = load_catalog(_catalog_file(tmp_path, location="landing/shop"))  # its own folder
    landing = tmp_path / "landing" / "shop"
    assert build_resources(catalog)["lake"].landing_for("s") == str(landing)
    write_demo_traffic(tmp_path / "landing", batch=0, date=DAY)
    write_demo_traffic(tmp_path / "landing", batch=1, date=NEXT_DAY)
    for date in (DAY, NEXT_DAY):
        ingest_landing(catalog.warehouse_uri, "s", landing, [date], whole_date=True)
    for path in (landing / f"dt={DAY}").iterdir():
        path.unlink()
    (landing / f"dt={DAY}").rmdir()
    assert with_start_date(catalog.source("s"), catalog).start_date == dt.date.fromisoformat(DAY)
