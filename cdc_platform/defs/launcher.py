"""A run launcher whose runs start warm: each run is a process forked from one that has already
imported Dagster, PySpark, Great Expectations and the other libraries a run needs.

Dagster's default launcher has the code server spawn a fresh Python per run, which imports those
libraries again: about 4 s of every run on the 2-core machine, more than the work of a small
batch. Here a forkserver (Python's ``multiprocessing``, started once by the process that
launches runs: the daemon) imports them once; a run forks from it and imports only our own
package (about 0.1 s), so a changed ``cdc_platform`` is always what runs. The run then executes as
``dagster api execute_run`` would: same instance, same events, same exit code.

Configure it in the instance's ``dagster.yaml`` (``deploy/dagster.yaml`` does)::

    run_launcher:
      module: cdc_platform.defs.launcher
      class: WarmRunLauncher
"""

import gc
import multiprocessing
import os
import signal
from typing import Any

from dagster import _check as check
from dagster._core.launcher import (
    CheckRunHealthResult,
    LaunchRunContext,
    RunLauncher,
    WorkerStatus,
)
from dagster._core.storage.dagster_run import DagsterRun
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import ConfigurableClass, ConfigurableClassData, serialize_value

from cdc_platform.processes import stat

# Imported once by the forkserver; only third-party libraries, so code edits are never stale.
PRELOAD = [
    "dagster",
    # The instance's storage (SQLAlchemy, Alembic), which a run loads first: 0.37 s a run.
    "dagster._core.storage.base_storage",
    "dagster_pyspark",
    "pyspark.sql.connect.session",
    "pyspark.sql.functions",
    "great_expectations",
    "pandas",
    "pyarrow.parquet",
    "deltalake",
    "confluent_kafka",
    "fastavro",
]
# The run tags naming the process a run executes in (what `terminate` signals) and its start
# time (clock ticks since boot: a pid the system gave to another process since is not the run's).
PID_TAG = "cdc/run_pid"
PID_START_TAG = "cdc/run_pid_start"

_context: Any = None


def _forkserver() -> Any:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _execute(input_json: str) -> None:
    """The body of ``dagster api execute_run``, in the forked process."""
    from dagster._cli.api import execute_run_command

    signal.signal(signal.SIGINT, signal.default_int_handler)  # the forkserver ignores it
    # The preloaded libraries' objects (about 440,000) live as long as the run: kept out of the
    # collector's sight. A full collection, which a large batch's allocations set off now and
    # then, took 0.3 s over them.
    gc.freeze()
    execute_run_command.main([input_json], standalone_mode=True)


class WarmRunLauncher(RunLauncher, ConfigurableClass):
    """Launches each run in a process forked from a warm forkserver (see the module)."""

    def __init__(self, inst_data: ConfigurableClassData | None = None) -> None:
        self._inst_data = inst_data
        self._processes: dict[str, Any] = {}
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict:
        return {}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Any):
        return cls(inst_data=inst_data)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        args = ExecuteRunArgs(
            job_origin=check.not_none(run.job_code_origin),
            run_id=run.run_id,
            instance_ref=self._instance.get_ref(),
            set_exit_code_on_failure=True,
        )
        process = _forkserver().Process(
            target=_execute, args=(serialize_value(args),), name=f"dagster-run-{run.run_id[:8]}"
        )
        process.start()
        self._processes = {k: p for k, p in self._processes.items() if p.is_alive()}
        self._processes[run.run_id] = process
        found = stat(process.pid)
        tags = {PID_TAG: str(process.pid)} | ({PID_START_TAG: str(found[1])} if found else {})
        self._instance.add_run_tags(run.run_id, tags)

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        """Whether the run's process still runs. With ``run_monitoring`` on (deploy/dagster.yaml),
        the daemon marks a started run whose process is gone (kill -9, a crash, a stopped
        machine) as failed, instead of leaving it started and its source's queue slot taken."""
        if PID_TAG not in run.tags:  # launched this instant: the tag follows the fork
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        pid = int(run.tags[PID_TAG])
        found = stat(pid)
        if found is None or found[2] == "Z" or str(found[1]) != run.tags.get(PID_START_TAG):
            return CheckRunHealthResult(
                WorkerStatus.FAILED, f"the run's process (pid {pid}) is gone: killed or crashed"
            )
        return CheckRunHealthResult(WorkerStatus.RUNNING)

    def terminate(self, run_id: str) -> bool:
        """Interrupt the run's process (SIGINT): Dagster marks the run canceled as it stops."""
        run = self._instance.get_run_by_id(run_id)
        if not run or run.is_finished or PID_TAG not in run.tags:
            return False
        self._instance.report_run_canceling(run)
        try:
            os.kill(int(run.tags[PID_TAG]), signal.SIGINT)
        except ProcessLookupError:
            return False
        return True

    def join(self, timeout: int = 30) -> None:
        for process in list(self._processes.values()):
            process.join(timeout)
