"""`cdc-platform up` (what `make demo` runs) started by a test on free ports and a folder of its
own, and what the live-stack tests ask of it: its processes, its runs, its ports."""

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import dagster as dg

from cdc_platform.processes import descendants, stat

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STOP_SECONDS = 15  # the bound for a stop, runs in flight included
UNFINISHED = {dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
              dg.DagsterRunStatus.CANCELING}  # fmt: skip
PORTS = ("port", "reports-port", "broker-port", "spark-port")  # the options of `up` naming one


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports() -> dict[str, int]:
    return {name: free_port() for name in PORTS}


def bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return None


def alive(tree: dict[int, int]) -> list[int]:
    """The processes of ``tree`` (pid -> start time) still running; zombies are dead."""
    return [pid for pid, started in tree.items()
            if (s := stat(pid)) is not None and s[1] == started and s[2] != "Z"]  # fmt: skip


def runs(home: Path, **filters) -> list[dg.DagsterRun]:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return list(instance.get_runs(dg.RunsFilter(**filters) if filters else None))


def running_step(home: Path, step: str, job_suffix: str = "__ingest") -> dg.DagsterRun | None:
    """A started run of a job ending in ``job_suffix`` whose latest event is the start of a step
    whose key holds ``step``."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for run in instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
            if not run.job_name.endswith(job_suffix):
                continue
            events = [e for e in instance.all_logs(run.run_id) if e.is_dagster_event]
            last = events[-1] if events else None
            if (last is not None and last.dagster_event_type == dg.DagsterEventType.STEP_START
                    and step in (last.step_key or "")):  # fmt: skip
                return run
    return None


class Up:
    """``cdc-platform up`` on ``work``'s sources.yaml and dagster home, its output in a file.
    ``env``: variables set for it over this process's (the object store's ``AWS_*``, say)."""

    def __init__(
        self, work: Path, ports: dict[str, int], *extra: str, env: Mapping[str, str] | None = None
    ) -> None:
        self.work, self.ports = work, ports
        self.home = work / "home"
        self.out = work / f"up-{len(list(work.glob('up-*')))}.out"
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(("CDC_", "SPARK_"))}
        env = {**inherited, **(env or {})}
        argv = [str(BIN / "cdc-platform"), "up", "--sources", str(work / "sources.yaml"),
                "--dagster-home", str(self.home),
                *[f"--{name}={port}" for name, port in ports.items()], *extra]  # fmt: skip
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, what, timeout: float, why: str) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            assert self.proc.poll() is None, f"cdc-platform up exited: {self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"{why} after {timeout} s: {self.text()[-3000:]}"
            time.sleep(0.5)

    def processes(self, called: str) -> list[int]:
        """The pids below the stack whose command name is ``called`` (java, tansu, ...)."""
        return [pid for pid in descendants([self.proc.pid]) if name(pid) == called]

    def stop(self, sig: int) -> dict[int, int]:
        """Send ``sig``; the processes that were below it (pid -> start time). ``sessions``: the
        sessions they were in (a process started in one later is there too)."""
        tree = descendants([self.proc.pid])
        self.names = [name(pid) for pid in tree]
        self.sessions = {session(pid) for pid in tree} - {None, os.getsid(0)}
        os.kill(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            tail = self.text()[-3000:]
            raise AssertionError(f"not stopped in {STOP_SECONDS} s: {tail}") from None
        return tree

    def ensure_stopped(self) -> None:
        """After a failed test: SIGTERM, then SIGKILL to its group."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
