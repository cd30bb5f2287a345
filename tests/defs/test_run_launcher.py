"""The demo instance's run launcher (deploy/dagster.yaml, cdc_platform/defs/launcher.py): runs
fork from a warm process and execute as `dagster api execute_run` would."""

import os
import shutil
import signal
import time
from pathlib import Path

import dagster as dg
from dagster._core.launcher import LaunchRunContext, WorkerStatus

from cdc_platform.defs.launcher import PID_TAG, WarmRunLauncher
from tests.defs import launched_jobs

ROOT = Path(__file__).resolve().parents[2]


def _launch(instance: dg.DagsterInstance, job_fn, out: Path) -> dg.DagsterRun:
    recon = dg.reconstructable(job_fn)
    run = instance.create_run_for_job(
        job_def=recon.get_definition(),
        run_config={"ops": {next(iter(recon.get_definition().nodes)).name: {"config": {
            "out": str(out)}}}},
        job_code_origin=recon.get_python_origin(),
    )  # fmt: skip
    instance.run_launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    return run


def _wait(instance: dg.DagsterInstance, run_id: str, timeout: float = 120) -> dg.DagsterRun:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run.is_finished:
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} did not finish in {timeout} s")


def test_the_demo_instance_launches_runs_warm(tmp_path):
    shutil.copy(ROOT / "deploy" / "dagster.yaml", tmp_path / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert isinstance(instance.run_launcher, WarmRunLauncher)
        out = tmp_path / "pid"
        run = _launch(instance, launched_jobs.writes_its_pid, out)
        finished = _wait(instance, run.run_id)
        assert finished.status == dg.DagsterRunStatus.SUCCESS
        # It ran in the process the launcher forked and tagged, not in this one.
        pid = int(out.read_text())
        assert pid != os.getpid() and finished.tags[PID_TAG] == str(pid)
        logged = [e.message for e in instance.all_logs(run.run_id)]
        assert any(f"Started process for run (pid: {pid})" in m for m in logged)


def test_terminating_a_run_stops_its_process(tmp_path):
    shutil.copy(ROOT / "deploy" / "dagster.yaml", tmp_path / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        out = tmp_path / "pid"
        run = _launch(instance, launched_jobs.waits, out)
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert instance.run_launcher.terminate(run.run_id)
        finished = _wait(instance, run.run_id)
        assert finished.status == dg.DagsterRunStatus.CANCELED
        pid = int(out.read_text())
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[1][0] != "Z"


def test_run_monitoring_fails_a_run_whose_process_was_killed(tmp_path):
    # kill -9 (or a crash, or a stopped machine) leaves no process to report the run's end: the
    # daemon's run monitoring asks the launcher and marks the run failed, freeing its source's
    # slot in the queue (deploy/dagster.yaml's tag concurrency limit).
    import logging

    from dagster._daemon.monitoring.run_monitoring import monitor_started_run

    shutil.copy(ROOT / "deploy" / "dagster.yaml", tmp_path / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.run_monitoring_enabled
        out = tmp_path / "pid"
        run = _launch(instance, launched_jobs.waits, out)
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        started = instance.get_run_by_id(run.run_id)
        assert started.status == dg.DagsterRunStatus.STARTED
        launcher = instance.run_launcher
        assert launcher.check_run_worker_health(started).status == WorkerStatus.RUNNING

        pid = int(out.read_text())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        health = launcher.check_run_worker_health(started)
        assert health.status == WorkerStatus.FAILED and f"pid {pid}" in (health.msg or "")
        record = instance.get_run_record_by_id(run.run_id)
        monitor_started_run(instance, None, record, logging.getLogger("test"))

        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
