"""``cdc-platform up``: the demo stack as one supervised process tree (what ``make demo`` runs).

It starts, each in a session of its own: the embedded broker, the Data Docs web server, the Spark
Connect server (warmed up), the demo's traffic and ``dagster dev``. One signal to this process
(Ctrl-C, SIGTERM, a closed terminal) stops them all: SIGTERM to every group at once, runs in
flight included, then SIGKILL to whatever is left after ``GRACE`` seconds, so every port is free
when it returns. The Spark Connect server is supervised: when it exits while the stack is up, it
is started again after a back-off, and the runs that used it fail with a line naming it.

Why a process and not the Makefile's shell, as before: a shell waiting on ``dagster dev`` in the
foreground runs its SIGTERM trap only once ``dagster dev`` has exited (a SIGTERM to ``make demo``
left the whole stack running), and what a shell starts with ``&`` ignores SIGINT, which Dagster
then copies to SIGTERM (``dagster._utils.interrupts``): such a ``dagster dev`` cannot be stopped
by SIGTERM. Here every child starts with the default handlers.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cdc_platform.processes import descendants, in_sessions, proc_table, signal_group

GRACE = 10.0  # seconds between SIGTERM and SIGKILL when the stack stops
RESTART_DELAYS = (1, 2, 5, 10, 30)  # the Spark server's back-off, seconds; the last repeats
WARM = "Spark Connect server warm"  # what `cdc-platform spark-server` prints after its warm-up


class StackError(Exception):
    """A part of the stack did not start or died: one line naming it and its log."""


@dataclass
class Settings:
    sources: Path
    home: Path  # DAGSTER_HOME
    logs: Path  # one <part>.out per process
    reports: Path  # the Data Docs site is served from <reports>/data_docs
    host: str = "127.0.0.1"
    port: int = 3000
    reports_port: int = 3001
    broker_port: int = 19092
    spark_port: int | None = 15002  # None: no server, each run starts a local Spark
    warm_up: bool = True  # the Spark server replays sample traffic before the UI starts
    every: float = 30.0  # seconds between demo traffic batches (0: none after the first)
    instance: Path = Path("deploy/dagster.yaml")  # copied into ``home`` (the run queue)


@dataclass
class Stack:
    settings: Settings
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    seen: dict[int, int] = field(default_factory=dict)  # pid -> start time, all ever below us
    restarts: int = 0

    def _bin(self, name: str) -> str:
        return str(Path(sys.executable).with_name(name))

    def _spawn(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        console: bool = False,
        mode: str = "wb",
    ) -> None:
        """Start a part in a session of its own (a terminal's Ctrl-C reaches only this process,
        which stops every part); its output goes to its log (new, or appended to with ``mode``
        "ab"), or to the console."""
        log = None if console else (self.settings.logs / f"{name}.out").open(mode)
        out = {} if log is None else {"stdout": log, "stderr": subprocess.STDOUT}
        try:
            self.procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
                start_new_session=True, **out,
            )  # fmt: skip
        finally:
            if log is not None:
                log.close()

    def log(self, name: str) -> Path:
        return self.settings.logs / f"{name}.out"

    def _wait(self, name: str, ready: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.procs[name].poll() is not None:
                raise StackError(f"{what} exited with {self.procs[name].returncode}; see "
                                 f"{self.log(name)}")  # fmt: skip
            if time.monotonic() > deadline:
                raise StackError(f"{what} not ready after {timeout:.0f} s; see {self.log(name)}")
            time.sleep(0.5)

    def _start_spark(self, mode: str = "wb") -> None:
        s = self.settings
        self._spawn("spark-server", [self._bin("cdc-platform"), "spark-server", "--sources",
                                     str(s.sources), "--port", str(s.spark_port),
                                     *([] if s.warm_up else ["--no-warm-up"])],
                    mode=mode)  # fmt: skip

    def _spark_warm(self) -> bool:
        text = self.log("spark-server").read_text(errors="replace")
        return WARM in text or "warm-up failed" in text

    def start(self) -> None:
        s = self.settings
        for folder in (s.logs, s.home, s.reports / "data_docs"):
            folder.mkdir(parents=True, exist_ok=True)
        if not s.instance.is_file():
            raise StackError(f"{s.instance} is missing (the Dagster instance's settings)")
        shutil.copy(s.instance, s.home / "dagster.yaml")
        cli = self._bin("cdc-platform")
        sources = ["--sources", str(s.sources)]
        self._spawn("broker", [cli, "broker", *sources, "--port", str(s.broker_port)])
        self._wait("broker", lambda: _listening(s.broker_port), "the broker", 60)
        self._spawn("reports-server", [sys.executable, "-m", "http.server", "--bind", s.host,
                                       "--directory", str(s.reports / "data_docs"),
                                       str(s.reports_port)])  # fmt: skip
        if s.spark_port is not None:
            self._start_spark()
        # The first batch of traffic, written while the Spark server starts.
        first = subprocess.run([cli, "demo", *sources, "--batches", "1"], check=False)
        if first.returncode:
            raise StackError("the demo's first batch of traffic could not be written (above)")
        if s.spark_port is not None:
            print(f"starting the Spark Connect server on port {s.spark_port}"
                  f"{' and warming it up' if s.warm_up else ''} (log: {self.log('spark-server')})",
                  flush=True)  # fmt: skip
            self._wait("spark-server", lambda: _listening(s.spark_port), "spark-server", 300)
            if s.warm_up:
                self._wait("spark-server", self._spark_warm, "the Spark server's warm-up", 600)
        if s.every > 0:  # else the first batch was all (a part that exits stops the stack)
            self._spawn("demo-traffic", [cli, "demo", *sources, "--batches", "0", "--every",
                                         str(s.every)])  # fmt: skip
        web = f"http://{s.host}:{s.port}"
        env = {
            "DAGSTER_HOME": str(s.home),
            "CDC_SOURCES": str(s.sources),
            "CDC_REPORTS": str(s.reports),
            "CDC_REPORTS_URL": f"http://{s.host}:{s.reports_port}",
            "CDC_DAGSTER_URL": web,
        }
        if s.spark_port is not None:
            env["CDC_SPARK_REMOTE"] = f"sc://127.0.0.1:{s.spark_port}"
            env["CDC_SPARK_SERVER_LOG"] = str(self.log("spark-server"))  # named when it fails
        with self._instance():  # its storage created by one process, before dagster dev's three
            pass  # race to create it (two of them once stamped runs.db twice: it never opened)
        self._spawn("dagster", [self._bin("dagster"), "dev", "-w", "workspace.yaml", "-h", s.host,
                                "-p", str(s.port)], env, console=True)  # fmt: skip
        traffic = f"new demo traffic every {s.every:g} s" if s.every > 0 else "no more demo traffic"
        print(f"Dagster UI: {web}  ({traffic}; Ctrl-C stops all)", flush=True)
        print(f"Data Docs:  http://{s.host}:{s.reports_port}", flush=True)

    def watch(self) -> int:
        """Until a signal or a part's exit: restart the Spark server when it exits (with a
        back-off), end the stack when another part exits. Returns the exit status."""
        restart_at: float | None = None
        while True:
            time.sleep(0.5)
            self.seen.update(descendants([proc.pid for proc in self.procs.values()]))
            for name, proc in self.procs.items():
                if proc.poll() is None or name == "spark-server":
                    continue
                print(f"{name} exited with {proc.returncode} (log: {self.log(name)}): stopping "
                      "the stack", flush=True)  # fmt: skip
                return 1
            spark = self.procs.get("spark-server")
            if spark is not None and spark.poll() is not None:
                if restart_at is None:
                    delay = RESTART_DELAYS[min(self.restarts, len(RESTART_DELAYS) - 1)]
                    print(f"the Spark Connect server exited with {spark.returncode} (log: "
                          f"{self.log('spark-server')}); restarting it in {delay} s",
                          flush=True)  # fmt: skip
                    restart_at = time.monotonic() + delay
                elif time.monotonic() >= restart_at:
                    self.restarts += 1
                    restart_at = None
                    self._start_spark(mode="ab")  # the log keeps what the last one said

    def stop(self) -> None:
        """SIGTERM to every part's group at once, SIGKILL to what is left after ``GRACE``
        seconds, and to every process ever seen below them that still lives (the Spark server's
        JVM runs in a group of its own)."""
        self._cancel_runs_in_flight()
        for proc in self.procs.values():
            self.seen.update(descendants([proc.pid]))
            signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE
        sessions = {proc.pid for proc in self.procs.values()}
        while time.monotonic() < deadline and (_alive(self.seen) or in_sessions(sessions)):
            for proc in self.procs.values():
                proc.poll()
            time.sleep(0.2)
        # What is left, and what was started while the parts stopped (a run the daemon launched
        # on its way out, a code server it restarted): everything in their sessions.
        for _ in range(5):
            left = set(_alive(self.seen)) | set(in_sessions(sessions))
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                    print(f"process {pid} did not stop in {GRACE:g} s: killed", flush=True)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        for proc in self.procs.values():
            proc.wait()
        self._end_runs_left_in_flight()

    def _instance(self):  # -> dagster.DagsterInstance
        import dagster as dg  # here, not at the top: the stack's parts start without it

        return dg.DagsterInstance.from_config(str(self.settings.home))

    def _cancel_runs_in_flight(self) -> None:
        """Mark the runs in flight as being canceled before the signal reaches them: Dagster then
        ends a run it interrupts as canceled, not as failed "unexpectedly" (the Runs page stays
        green after a stop, and the next start does not take the stop for failed continuous
        runs, which it spaces out). A stop goes on whatever this meets."""
        if not (self.settings.home / "dagster.yaml").exists():
            return
        import dagster as dg

        in_flight = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]
        try:
            with self._instance() as instance:
                for run in instance.get_runs(filters=dg.RunsFilter(statuses=in_flight)):
                    instance.report_run_canceling(run, message="cdc-platform up is stopping")
        except Exception as e:  # noqa: BLE001  (the stop matters more than the runs' status)
            print(f"could not mark the runs in flight as canceling: {e}", flush=True)

    def _end_runs_left_in_flight(self) -> None:
        """Mark canceled the runs its stop left unfinished: a run the daemon launched on its way
        out, killed before its process could say so, would show as starting for good."""
        if not (self.settings.home / "dagster.yaml").exists():
            return
        import dagster as dg

        unfinished = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
                      dg.DagsterRunStatus.CANCELING]  # fmt: skip
        with self._instance() as instance:
            for run in instance.get_runs(filters=dg.RunsFilter(statuses=unfinished)):
                instance.report_run_canceled(
                    run, message="cdc-platform up stopped before the run could finish"
                )
                print(f"run {run.run_id} ({run.job_name}) was in flight: canceled", flush=True)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(seen: dict[int, int]) -> list[int]:
    """The processes of ``seen`` still running (same pid, same start time; zombies are dead)."""
    now = proc_table()
    return [
        pid
        for pid, started in seen.items()
        if pid in now and now[pid][1] == started and now[pid][2] != "Z"
    ]


def _stop_signal(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def up(settings: Settings) -> int:
    """Start the stack, watch it, stop it on a signal or a part's exit; the exit status."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop_signal)  # children start with the default handlers
    stack = Stack(settings)
    try:
        stack.start()
        return stack.watch()
    except KeyboardInterrupt:
        print("stopping the stack", flush=True)
        return 0
    except StackError as e:
        print(f"cdc-platform up: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C does not cut the stop short
        stack.stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
