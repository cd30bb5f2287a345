"""The production profile's Dagster instance (deploy/dagster-production.yaml) on a real PostgreSQL
(the test's own server, tests/postgres_server.py): copied into DAGSTER_HOME as dagster.yaml with
only the DAGSTER_PG_* variables set, it opens with Postgres run, event-log and schedule storage
and the platform's run queue and launcher; a run of the platform's ``cdc_maintenance`` job is
recorded there, and a new Python process (a restart: nothing shared but DAGSTER_HOME and the
environment) finds the run, its status and its events. The run executes in this process
(``execute_in_process``), not through the queue, the daemon and ``WarmRunLauncher``."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
import yaml
from dagster_postgres import (
    DagsterPostgresStorage,
    PostgresEventLogStorage,
    PostgresRunStorage,
    PostgresScheduleStorage,
)
from deltalake import write_deltalake

from cdc_platform.definitions import defs
from cdc_platform.defs.launcher import WarmRunLauncher

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ROOT / "deploy" / "dagster-production.yaml"
JOB = "cdc_maintenance"

pytestmark = pytest.mark.postgres

# The restart: a fresh interpreter that knows only DAGSTER_HOME and the environment.
READ_BACK = """
import json, sys
import dagster as dg
run_id = sys.argv[1]
with dg.DagsterInstance.get() as instance:
    run = instance.get_run_by_id(run_id)
    events = instance.all_logs(run_id)
    outputs = [e.dagster_event.step_output_data for e in events
               if e.dagster_event and e.dagster_event.event_type == dg.DagsterEventType.STEP_OUTPUT]
    print(json.dumps({
        "storages": [type(s).__name__ for s in (
            instance.run_storage, instance.event_log_storage, instance.schedule_storage)],
        "run": run and {"job": run.job_name, "status": run.status.value},
        "event_types": [e.dagster_event.event_type.value for e in events if e.dagster_event],
        "metadata": {k: v.value for o in outputs for k, v in o.metadata.items()},
    }))
"""


@pytest.fixture
def production_home(tmp_path, monkeypatch, postgres_server) -> Path:
    """DAGSTER_HOME holding the production instance; the Postgres connection in the environment;
    a one-source catalog (no Spark needed) whose warehouse holds one Delta table."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PRODUCTION, home / "dagster.yaml")
    catalog = tmp_path / "sources.yaml"
    catalog.write_text(
        "warehouse: warehouse\nlanding: landing\nsources:\n"
        "  - {name: shop, format: debezium, tables: [{name: customers}]}\n"
    )
    write_deltalake(str(tmp_path / "warehouse/current/shop/customers"), pa.table({"id": [1, 2]}))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("CDC_SOURCES", str(catalog))
    for key in ("CDC_WAREHOUSE", "CDC_LANDING", "CDC_MODELS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in postgres_server.env().items():
        monkeypatch.setenv(key, value)
    return home


def test_the_production_instance_keeps_runs_in_postgres_across_a_restart(production_home):
    # The file's run queue, launcher and monitoring are the demo instance's, to the letter.
    production = yaml.safe_load(PRODUCTION.read_text())
    demo = yaml.safe_load((ROOT / "deploy" / "dagster.yaml").read_text())
    assert list(production.pop("storage")) == ["postgres"]
    assert production == demo
    assert os.environ["DAGSTER_PG_PASSWORD"] not in PRODUCTION.read_text()

    with dg.DagsterInstance.get() as instance:
        assert isinstance(instance.get_ref().storage, DagsterPostgresStorage)
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert isinstance(instance.schedule_storage, PostgresScheduleStorage)
        assert isinstance(instance.run_coordinator, dg.QueuedRunCoordinator)
        assert isinstance(instance.run_launcher, WarmRunLauncher)
        # What a launched run gets: the variables' names, not the password.
        assert os.environ["DAGSTER_PG_PASSWORD"] not in repr(instance.get_ref())

        result = defs().resolve_job_def(JOB).execute_in_process(instance=instance)
        assert result.success
        run_id = result.run_id
        outputs = [e.step_output_data for e in result.all_events if e.is_successful_output]
        metadata = {k: v.value for o in outputs for k, v in o.metadata.items()}
        assert metadata["tables"] == 1

    # Nothing in DAGSTER_HOME but the file and local artifacts: no SQLite run or event storage.
    assert not list(production_home.rglob("*.db"))

    done = subprocess.run(
        [sys.executable, "-c", READ_BACK, run_id],
        env=dict(os.environ), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["storages"] == [
        "PostgresRunStorage",
        "PostgresEventLogStorage",
        "PostgresScheduleStorage",
    ]
    assert seen["run"] == {"job": JOB, "status": "SUCCESS"}
    assert seen["event_types"][-1] == dg.DagsterEventType.RUN_SUCCESS.value
    assert dg.DagsterEventType.STEP_SUCCESS.value in seen["event_types"]
    assert seen["metadata"] == metadata
