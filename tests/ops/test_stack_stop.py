"""`cdc-platform up` (what `make demo` runs) survives a Spark server killed under runs in flight
(restarted; the runs retry and succeed) and stops cleanly: Ctrl-C or SIGTERM while runs are in
flight ends every process it started, the Spark Connect server's JVM included, frees every port,
leaves no run "started", and the next start comes up. The real stack: broker, Spark server,
`dagster dev`, the demo's traffic."""

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml

from cdc_platform.processes import descendants, in_sessions, stat

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STOP_SECONDS = 15  # the bound for a stop, runs in flight included
UNFINISHED = {dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
              dg.DagsterRunStatus.CANCELING}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _catalog(work: Path, broker_port: int) -> Path:
    """The demo catalog on ``work``, its Kafka source on the test's broker port."""
    catalog = yaml.safe_load((ROOT / "sources.yaml").read_text())
    catalog["warehouse"], catalog["landing"] = str(work / "warehouse"), str(work / "landing")
    for source in catalog["sources"]:
        if source.get("kafka"):
            source["kafka"]["bootstrap_servers"] = f"127.0.0.1:{broker_port}"
    (work / "dbt_like_models").symlink_to(ROOT / "dbt_like_models")
    path = work / "sources.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


class _Up:
    def __init__(self, work: Path, ports: dict[str, int], *extra: str) -> None:
        self.out = work / f"up-{len(list(work.glob('up-*')))}.out"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CDC_", "SPARK_"))}
        argv = [str(BIN / "cdc-platform"), "up", "--sources", str(work / "sources.yaml"),
                "--dagster-home", str(work / "home"), "--every", "5",
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

    def stop(self, sig: int) -> dict[int, int]:
        """Send ``sig``; the processes that were below it (pid -> start time). ``sessions``: the
        sessions they were in (a process started in one later is there too)."""
        tree = descendants([self.proc.pid])
        self.names = [_name(pid) for pid in tree]
        self.sessions = {_sid(pid) for pid in tree} - {None, os.getsid(0)}
        os.kill(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            tail = self.text()[-3000:]
            raise AssertionError(f"not stopped in {STOP_SECONDS} s: {tail}") from None
        return tree


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return None


def _alive(tree: dict[int, int]) -> list[int]:
    return [pid for pid, started in tree.items()
            if (s := stat(pid)) is not None and s[1] == started and s[2] != "Z"]  # fmt: skip


def _in_spark_step(home: Path) -> bool:
    """A source run is in a step that works on Spark (its change log or a current table)."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for run in instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
            steps = [e for e in instance.all_logs(run.run_id) if e.is_dagster_event]
            last = steps[-1] if steps else None
            if (last is not None and last.dagster_event_type == dg.DagsterEventType.STEP_START
                    and ("changelog" in (last.step_key or "") or "current" in (last.step_key or ""))
                    and run.job_name.endswith("__ingest")):  # fmt: skip
                return True
    return False


def _runs(home: Path) -> list[dg.DagsterRun]:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        return list(instance.get_runs())


@pytest.fixture
def stacks() -> Iterator[list[_Up]]:
    """The stacks a test starts, stopped (SIGTERM, then SIGKILL) when a failed test left them."""
    started: list[_Up] = []
    yield started
    for up in started:
        if up.proc.poll() is None:
            os.kill(up.proc.pid, signal.SIGTERM)
            try:
                up.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(up.proc.pid, signal.SIGKILL)


@pytest.mark.jvm
def test_the_stack_survives_a_killed_spark_server_and_stops_on_ctrl_c_and_sigterm(tmp_path, stacks):
    ports = {"port": _free_port(), "reports-port": _free_port(), "broker-port": _free_port(),
             "spark-port": _free_port()}  # fmt: skip
    _catalog(tmp_path, ports["broker-port"])
    home = tmp_path / "home"

    up = _Up(tmp_path, ports, "--no-warm-up")
    stacks.append(up)
    up.wait_for(lambda: "Dagster UI" in up.text(), 300, "no Dagster UI")
    up.wait_for(lambda: _in_spark_step(home), 240, "no run in a Spark step")

    # The Spark server killed under a run in a Spark step: it is started again, and the source
    # runs in flight succeed on the new one: the client's bounded retries reach it, or the step
    # is retried (defs/transient.py; which of the two depends on the call in flight).
    java = [pid for pid in descendants([up.proc.pid]) if _name(pid) == "java"]
    in_flight = [r.run_id for r in _runs(home) if r.status in UNFINISHED and
                 r.job_name.endswith("__ingest")]  # fmt: skip
    assert in_flight
    os.kill(java[0], signal.SIGKILL)
    up.wait_for(lambda: "Spark Connect server exited" in up.text(), 30, "no restart")
    up.wait_for(
        lambda: all(r.is_finished for r in _runs(home) if r.run_id in in_flight),
        300,
        "the runs in flight at the kill did not end",
    )
    ended = {r.run_id: r.status for r in _runs(home) if r.run_id in in_flight}
    assert set(ended.values()) == {dg.DagsterRunStatus.SUCCESS}, ended

    up.wait_for(
        lambda: any(r.status == dg.DagsterRunStatus.STARTED for r in _runs(home)),
        120,
        "no run in flight to stop",
    )
    tree = up.stop(signal.SIGINT)  # what a terminal's Ctrl-C sends it

    assert up.proc.returncode == 0
    assert {"tansu", "java"} <= set(up.names)  # the broker, the Spark server's JVM, ...
    assert _alive(tree) == []
    assert in_sessions(up.sessions) == []  # nor anything started while it stopped
    assert all(_bindable(p) for p in ports.values()), {n: _bindable(p) for n, p in ports.items()}
    runs = _runs(home)
    assert not [r.run_id for r in runs if r.status in UNFINISHED]
    assert any(
        r.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED) for r in runs
    )  # fmt: skip  (the run in flight)

    # The next start comes up on the same ports and instance; SIGTERM stops it too.
    again = _Up(tmp_path, ports, "--no-spark-server")
    stacks.append(again)
    again.wait_for(lambda: "Dagster UI" in again.text(), 300, "no Dagster UI the second time")
    again.wait_for(lambda: not _bindable(ports["port"]), 120, "the UI's port not taken")
    tree = again.stop(signal.SIGTERM)
    assert again.proc.returncode == 0
    assert _alive(tree) == []
    assert in_sessions(again.sessions) == []
    assert all(_bindable(p) for p in ports.values())
