"""The code location loads, its asset keys are the expected ones, and workspace.yaml validates."""

import datetime as dt
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from cdc_platform.definitions import defs

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = Path(__file__).with_name("asset_keys.txt")


@pytest.fixture(autouse=True)
def empty_warehouse(tmp_path, monkeypatch):
    # Routed tables found in a warehouse get assets too: test against an empty one.
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))


def test_definitions_load_and_match_snapshot():
    d = defs()
    dg.Definitions.validate_loadable(d)
    graph = d.resolve_asset_graph()
    keys = sorted(k.to_user_string() for k in graph.get_all_asset_keys())
    assert keys == SNAPSHOT.read_text().split()


def test_each_table_has_raw_changelog_and_current_in_its_source_group():
    graph = defs().resolve_asset_graph()
    current = graph.get(dg.AssetKey(["current", "shop", "customers"]))
    changelog = graph.get(dg.AssetKey(["changelog", "shop", "customers"]))
    assert set(current.parent_keys) == {changelog.key}
    assert set(changelog.parent_keys) == {dg.AssetKey(["raw", "shop"])}
    assert {current.group_name, changelog.group_name} == {"shop"}
    assert changelog.partitions_def is not None and current.partitions_def is None
    # The demo's sources run continuously: their runs merge, not automation.
    assert current.automation_condition is None


def test_workspace_yaml_loads(tmp_path):
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "DAGSTER_HOME": str(tmp_path)}  # fmt: skip
    done = subprocess.run(
        [str(bin_dir / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "All code locations passed validation" in done.stderr + done.stdout


def test_a_kafka_source_gets_an_append_only_raw_asset_a_sensor_and_freshness_checks():
    d = defs()
    graph = d.resolve_asset_graph()
    raw = graph.get(dg.AssetKey(["raw", "crm"]))
    assert "kafka" in raw.kinds and raw.partitions_def is not None
    assert "Append-only" in raw.description
    # The demo runs it continuously; its ingest job stays for manual runs and backfills.
    sensor = d.get_sensor_def("crm__continuous_sensor")
    assert sensor.minimum_interval_seconds == 5
    assert sensor.job_name == "crm__continuous"
    assert d.resolve_job_def("crm__continuous").run_tags == {"cdc/source": "crm"}
    job = d.resolve_job_def("crm__ingest")
    assert {
        "raw/crm", "changelog/crm/accounts", "current/crm/accounts", "current/crm/tickets"
    } <= {k.to_user_string() for k in job.asset_layer.executable_asset_keys}  # fmt: skip
    checks = {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys}
    assert ("current/crm/accounts", "freshness") in checks
    assert ("current/shop/customers", "freshness") in checks
    assert d.get_schedule_def("cdc_freshness").cron_schedule == "*/5 * * * *"


def test_the_maintenance_job_vacuums_the_tables_daily_unless_told_otherwise():
    maintenance = defs().get_schedule_def("cdc_maintenance_schedule")
    assert (maintenance.cron_schedule, maintenance.job_name) == ("0 3 * * *", "cdc_maintenance")
    assert maintenance.default_status == dg.DefaultScheduleStatus.RUNNING


def test_every_run_of_a_source_carries_its_tag_for_the_run_queue():
    d = defs()
    repo = d.get_repository_def()
    automation = {
        s.name: s for s in repo.sensor_defs if isinstance(s, dg.AutomationConditionSensorDefinition)
    }
    # One for the models, none for the demo's continuous sources (their runs merge what a
    # backfill wrote when they start again), no catch-all sensor.
    assert set(automation) == {"models__automation"}
    assert automation["models__automation"].run_tags == {"cdc/source": "models"}
    for source in ("shop", "lindorm", "crm"):
        for job in (f"{source}__ingest", f"{source}__continuous"):
            assert d.resolve_job_def(job).run_tags == {"cdc/source": source}


def test_partitions_are_per_source_and_start_where_the_data_starts(tmp_path, monkeypatch):
    landing = tmp_path / "landing"
    (landing / "shop" / "dt=2026-03-01").mkdir(parents=True)
    monkeypatch.setenv("CDC_LANDING", str(landing))
    graph = defs().resolve_asset_graph()

    def first(key: str) -> str:
        return graph.get(dg.AssetKey(key.split("/"))).partitions_def.get_first_partition_key()

    today = dt.datetime.now(dt.UTC).date().isoformat()
    assert first("raw/shop") == first("changelog/shop/orders") == "2026-03-01"
    assert first("quarantine/shop") == "2026-03-01"
    assert first("raw/lindorm") == first("raw/crm") == today  # no data yet


def test_the_demo_instance_queues_one_run_per_source(tmp_path):
    shutil.copy(ROOT / "deploy" / "dagster.yaml", tmp_path / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        queue = instance.run_coordinator.get_run_queue_config()
        assert not instance.telemetry_enabled
    assert queue.max_concurrent_runs == 5
    assert queue.tag_concurrency_limits == [
        {"key": "cdc/source", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
    ]
