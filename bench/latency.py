"""End-to-end latency of `make demo`'s stack: events appended -> visible in the current table.

Starts what `make demo` starts, on a temporary folder: the embedded broker (`cdc-platform
broker`), the Spark Connect server (`cdc-platform spark-server`; runs reach it through
`CDC_SPARK_REMOTE`) and `dagster dev -w workspace.yaml` with a DAGSTER_HOME holding the demo's
run-queue settings (`deploy/dagster.yaml`). The catalog has two sources with the demo's sensor
intervals and Spark settings: `lat_files`, Debezium JSON landing files, and `lat_kafka`, a
Debezium topic on the broker. ROUNDS times, for each source: appends EVENTS inserts of new keys
(one landing file, or EVENTS records produced and flushed), each row stamped with its round,
starts the clock, and polls the current table with delta-rs until all of them are there. Prints
each round, the median and the max per source against the targets (median 10 s, no round over
20 s), the stack's CPU over the rounds, and where the time of each Dagster run went.

    .venv/bin/python bench/latency.py [--events 10000] [--rounds 5] [--sources files,kafka]
        [--sensor-interval S] [--warmup N] [--local-session] [--timeout 300] [--keep]

`--local-session` runs without the Spark Connect server: every run starts its own local Spark,
as `make demo` did before the server (the old default of this script).

`bench/soak.py` reuses this module's `DemoStack` and helpers.
"""

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import yaml

from cdc_platform.processes import descendants, proc_table, signal_group

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TOPIC = "bench.inventory.customers"
SOURCE_TABLE = "inventory.customers"
TABLE = "customers"
TARGET_MEDIAN_S = 10.0
TARGET_MAX_S = 20.0

# What a run queue needs when the repository has no deploy/dagster.yaml yet: at most 4 runs at a
# time, at most one per value of the run tag cdc/source.
MINIMAL_DAGSTER_YAML = """\
run_queue:
  max_concurrent_runs: 4
  tag_concurrency_limits:
    - key: cdc/source
      value:
        applyLimitPerUniqueValue: true
      limit: 1
telemetry:
  enabled: false
"""

QUEUED = ("QUEUED", "NOT_STARTED")
IN_FLIGHT = ("STARTING", "STARTED", "CANCELING")
SOURCE_TAG = "cdc/source"

RUNS_QUERY = """
query Runs($filter: RunsFilter, $limit: Int) {
  runsOrError(filter: $filter, limit: $limit) {
    __typename
    ... on Runs {
      results {
        runId jobName status creationTime startTime endTime
        tags { key value }
        %s
      }
    }
    ... on PythonError { message }
    ... on InvalidPipelineRunsFilterError { message }
  }
}
"""


class StackError(Exception):
    """A missing prerequisite or a process of the stack that failed; printed as one line."""


# --- the demo's settings -------------------------------------------------------------------


def demo_settings() -> dict:
    """What the demo catalog (sources.yaml) sets and a bench copies: the Spark block, and per
    transport the sensor interval, whether it runs continuously (its ``continuous`` block) and
    the Kafka batch bound of its first source."""
    from cdc_platform.catalog import CatalogError, load_catalog

    out = {"spark": {"master": "local[2]"}, "interval": {}, "continuous": {}, "max_records": None}
    try:
        demo = load_catalog(ROOT / "sources.yaml")
    except CatalogError:
        return out
    out["spark"] = demo.spark.model_dump(exclude_none=True, exclude_defaults=False)
    out["spark"].pop("remote", None)  # the bench points runs at its own server
    for s in demo.sources:
        out["interval"].setdefault(s.transport, s.sensor_interval_seconds)
        continuous = s.continuous.model_dump() if s.continuous else None
        out["continuous"].setdefault(s.transport, continuous)
        if s.kafka and out["max_records"] is None:
            out["max_records"] = s.kafka.max_records
    return out


# How a bench's sources run: as the demo's do, a run per batch, or continuously (defaults).
RUN_MODES = ("demo", "batches", "continuous")


def continuous_settings(mode: str, demo: dict) -> dict[str, dict | None]:
    """Per transport, the ``continuous`` block of the bench's source (None: a run per batch)."""
    if mode == "demo":
        return {t: demo["continuous"].get(t) for t in ("files", "kafka")}
    return {t: {} if mode == "continuous" else None for t in ("files", "kafka")}


def write_catalog(
    path: Path,
    *,
    bootstrap: str,
    files_source: str,
    kafka_source: str,
    column_types: dict[str, str],
    interval: dict[str, int],
    spark: dict,
    max_records: int | None,
    continuous: dict[str, dict | None] | None = None,
    warehouse: str | None = None,
    landing: str | None = None,
) -> Path:
    """A catalog with one Debezium landing source and one Debezium Kafka source (``continuous``:
    per transport, its ``continuous`` block, None for a run per batch). ``warehouse`` and
    ``landing``: locations (a folder, or ``s3://bucket/prefix``); default the folders
    ``warehouse`` and ``landing`` beside the catalog."""
    table = {
        "name": TABLE,
        "source_table": SOURCE_TABLE,
        "primary_key": ["id"],
        "column_types": column_types,
    }
    kafka = {"bootstrap_servers": bootstrap, "topics": [TOPIC]}
    if max_records:
        kafka["max_records"] = max_records
    catalog = {
        "warehouse": warehouse or str(path.parent / "warehouse"),
        "landing": landing or str(path.parent / "landing"),
        "spark": spark,
        "sources": [
            {"name": files_source, "transport": "files", "format": "debezium",
             "sensor_interval_seconds": interval["files"], "tables": [table]},
            {"name": kafka_source, "transport": "kafka", "format": "debezium",
             "sensor_interval_seconds": interval["kafka"], "kafka": kafka, "tables": [table]},
        ],
    }  # fmt: skip
    for source in catalog["sources"]:
        if (block := (continuous or {}).get(source["transport"])) is not None:
            source["continuous"] = block
    path.write_text(yaml.safe_dump(catalog, sort_keys=False))
    return path


# --- Debezium events -------------------------------------------------------------------------


def debezium_value(op: str, before: dict | None, after: dict | None, pos: int, ts_ms: int) -> str:
    """A Debezium MySQL change event without the schema envelope; `pos` orders the events."""
    db, table = SOURCE_TABLE.split(".")
    value = {
        "before": before,
        "after": after,
        "source": {"connector": "mysql", "db": db, "table": table, "file": "mysql-bin.000001",
                   "pos": pos, "row": 0, "ts_ms": ts_ms},
        "op": op,
        "ts_ms": ts_ms,
    }  # fmt: skip
    return json.dumps(value, separators=(",", ":"))


def today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


def write_landing_file(folder: Path, name: str, lines: Iterable[str]) -> Path:
    """Write atomically: a dot-file (the landing readers skip those) renamed into place."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    tmp = folder / f".{name}.tmp"
    with tmp.open("w") as f:
        for line in lines:
            f.write(line + "\n")
    tmp.rename(path)
    return path


# --- processes ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pids: Iterable[int]) -> int:
    """Sum of VmRSS (/proc/<pid>/status) of these processes."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
        except (OSError, ValueError):
            continue
    return total


def cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds (user + system) these processes used, with their children that have ended
    and been waited for (/proc/<pid>/stat utime, stime, cutime, cstime)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += sum(int(f) for f in fields[11:15])
    return total / ticks


class DemoStack:
    """The processes `make demo` runs, on a work folder: broker, Spark Connect server (unless
    `spark_connect` is false), `dagster dev`. Each is started in its own session (process
    group); `stop()` ends the groups and then any process that was below them."""

    def __init__(self, work: Path, catalog: Path, spark_connect: bool = True) -> None:
        self.work = work
        self.catalog = catalog
        self.spark_connect = spark_connect
        self.procs: dict[str, subprocess.Popen] = {}
        self.seen: dict[int, int] = {}  # every process ever found below ours -> start time
        self.home = work / "dagster_home"
        self.dagster_yaml = ""
        self.url = ""
        self.spark_url = ""
        self.env = {
            **os.environ,
            "CDC_SOURCES": str(catalog),
            "CDC_WAREHOUSE": str(work / "warehouse"),
            "CDC_LANDING": str(work / "landing"),
            "PYTHONUNBUFFERED": "1",
        }
        for var in ("CDC_SPARK_REMOTE", "CDC_SPARK_MASTER", "DAGSTER_HOME"):
            self.env.pop(var, None)

    @property
    def warehouse(self) -> Path:
        return self.work / "warehouse"

    @property
    def landing(self) -> Path:
        return self.work / "landing"

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = (self.work / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        log.close()
        self.procs[name] = proc
        return proc

    def _wait(self, name: str, ready, what: str, timeout: float) -> None:
        proc = self.procs[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise StackError(f"{what} exited with {proc.returncode}; see {self.log(name)}")
            if ready():
                return
            time.sleep(0.5)
        raise StackError(f"{what} did not come up in {timeout:.0f} s; see {self.log(name)}")

    def log(self, name: str) -> Path:
        return self.work / f"{name}.log"

    def start(self, bootstrap: str) -> None:
        from cdc_platform import broker

        port = int(bootstrap.rsplit(":", 1)[1])
        cli = str(BIN / "cdc-platform")
        self._spawn("broker", [cli, "broker", "--sources", str(self.catalog), "--port", str(port)],
                    self.env)  # fmt: skip
        self._wait("broker", lambda: broker.answers(bootstrap), "the broker", 60)
        dagster_env = dict(self.env)
        if self.spark_connect:
            spark_port = free_port()
            self._spawn("spark-server",
                        [cli, "spark-server", "--sources", str(self.catalog), "--port",
                         str(spark_port)], self.env)  # fmt: skip
            self.spark_url = f"sc://127.0.0.1:{spark_port}"

            def answers() -> bool:
                with socket.socket() as s:
                    return s.connect_ex(("127.0.0.1", spark_port)) == 0

            self._wait("spark-server", answers, "the Spark Connect server", 300)

            def warm() -> bool:  # the server's own warm-up (cdc-platform spark-server)
                text = self.log("spark-server").read_text(errors="replace")
                return "Spark Connect server warm" in text or "warm-up failed" in text

            self._wait("spark-server", warm, "the Spark Connect server's warm-up", 600)
            dagster_env["CDC_SPARK_REMOTE"] = self.spark_url
        self.home.mkdir(parents=True, exist_ok=True)
        self.dagster_yaml = install_dagster_yaml(self.home)
        dagster_env["DAGSTER_HOME"] = str(self.home)
        web_port = free_port()
        self.url = f"http://127.0.0.1:{web_port}"
        self._spawn("dagster", [str(BIN / "dagster"), "dev", "-w", "workspace.yaml",
                                "-h", "127.0.0.1", "-p", str(web_port)], dagster_env)  # fmt: skip

        def serves() -> bool:
            try:
                urllib.request.urlopen(f"{self.url}/server_info", timeout=2).close()
                return True
            except OSError:
                return False

        self._wait("dagster", serves, "dagster dev", 300)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise StackError(f"{name} exited with {proc.returncode}; see {self.log(name)}")

    def rss(self) -> dict[str, int]:
        """Resident bytes per started process and everything below it (runs included)."""
        out = {}
        for name, proc in self.procs.items():
            tree = descendants([proc.pid])
            self.seen.update(tree)
            out[name] = rss_bytes(tree)
        return out

    def cpu_seconds(self) -> float:
        """CPU seconds the stack has used so far: every started process and everything below it,
        ended runs included (they are waited for inside the tree). A difference of two readings
        is the stack's CPU over that time."""
        total = 0.0
        for proc in self.procs.values():
            tree = descendants([proc.pid])
            self.seen.update(tree)
            total += cpu_seconds(tree)
        return total

    def stop(self) -> None:
        """End every process this stack started, newest first: SIGTERM to its group, SIGKILL
        after 30 s; then SIGKILL whatever was ever seen below them and still lives."""
        from cdc_platform.processes import stop_group

        for proc in self.procs.values():
            self.seen.update(descendants([proc.pid]))
        for name, proc in reversed(list(self.procs.items())):
            if proc.poll() is None and not stop_group(proc):
                print(f"{name} did not stop in 30 s: killed", file=sys.stderr)
            signal_group(proc.pid, signal.SIGKILL)  # stragglers of its group
            proc.wait()
        now = proc_table()
        for pid, started in self.seen.items():
            if now.get(pid, (0, None))[1] == started:  # the same process, still alive
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.procs.clear()

    def graphql(self, query: str, variables: dict | None = None, timeout: float = 20) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            out = json.loads(resp.read())
        if out.get("errors"):
            raise StackError(f"GraphQL: {out['errors'][0].get('message')}")
        return out["data"]

    def runs(
        self, statuses: Iterable[str] | None = None, steps: bool = False, limit: int = 1000
    ) -> list[dict]:
        """Runs of the instance (newest first) through the webserver's GraphQL API."""
        fields = "stepStats { stepKey status startTime endTime }" if steps else ""
        flt = {"statuses": list(statuses)} if statuses else {}
        data = self.graphql(RUNS_QUERY % fields, {"filter": flt, "limit": limit})["runsOrError"]
        if data["__typename"] != "Runs":
            raise StackError(f"GraphQL runsOrError: {data.get('message')}")
        return data["results"]


def install_dagster_yaml(home: Path) -> str:
    """The demo's dagster.yaml (deploy/dagster.yaml) in DAGSTER_HOME, else a minimal run queue."""
    repo = ROOT / "deploy" / "dagster.yaml"
    if repo.is_file():
        shutil.copy(repo, home / "dagster.yaml")
        return str(repo.relative_to(ROOT))
    (home / "dagster.yaml").write_text(MINIMAL_DAGSTER_YAML)
    return "minimal run queue (no deploy/dagster.yaml in the repository)"


def run_source(run: dict) -> str:
    """The source a run works for: its cdc/source tag, else its job `<source>__ingest`."""
    tags = {t["key"]: t["value"] for t in run.get("tags") or []}
    if SOURCE_TAG in tags:
        return tags[SOURCE_TAG]
    job = run.get("jobName") or ""
    return job.removesuffix("__ingest") if job.endswith("__ingest") else f"other ({job})"


def check_prerequisites(java: bool = True) -> None:
    """One StackError naming the first thing missing."""
    for exe in ("cdc-platform", "dagster"):
        if not (BIN / exe).exists():
            raise StackError(f"{BIN / exe} is missing: run `make install` (pip install -e .)")
    if not (ROOT / "workspace.yaml").is_file():
        raise StackError(f"{ROOT / 'workspace.yaml'} is missing")
    from cdc_platform import broker

    try:
        broker.tansu_binary()
    except broker.BrokerError as e:
        raise StackError(str(e)) from None
    if java:
        from cdc_platform.spark.session import ensure_java

        try:
            ensure_java()
        except RuntimeError as e:
            raise StackError(f"no JDK for Spark: {e}") from None


def create_topic(bootstrap: str, topic: str = TOPIC) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)


def install_signal_handlers() -> None:
    """SIGTERM and SIGHUP end the bench like Ctrl-C, so its `finally` stops the stack. SIGINT
    gets the same handler: a bench started with `&` has SIGINT ignored, its children inherit
    that, and a `dagster dev` that ignores SIGINT ignores SIGTERM too (it was killed after 30 s
    at every stop)."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


# --- the latency rounds ----------------------------------------------------------------------

FILES, KAFKA = "lat_files", "lat_kafka"


def _rows(round_no: int, events: int) -> list[dict]:
    first = round_no * 1_000_000
    return [{"id": first + i, "name": f"customer {first + i}", "round": round_no}
            for i in range(events)]  # fmt: skip


def append_files(landing: Path, round_no: int, events: int, pos: int) -> int:
    now = int(time.time() * 1000)
    lines = []
    for row in _rows(round_no, events):
        pos += 1
        lines.append(debezium_value("c", None, row, pos, now))
    write_landing_file(landing / FILES / f"dt={today()}", f"round-{round_no:03d}.jsonl", lines)
    return pos


def append_kafka(bootstrap: str, round_no: int, events: int, pos: int) -> int:
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 1 << 30}
    )
    now = int(time.time() * 1000)
    # Encoded first, then produced at once: the run finds the round whole more often (a round
    # it finds while it is being written goes through in more than one micro-batch).
    messages = []
    for row in _rows(round_no, events):
        pos += 1
        messages.append((json.dumps({"id": row["id"]}), debezium_value("c", None, row, pos, now)))
    for i, (key, value) in enumerate(messages):
        producer.produce(TOPIC, key=key, value=value)
        if i % 5000 == 0:
            producer.poll(0)
    if producer.flush(60):
        raise StackError(f"{events} records not delivered to {bootstrap} within 60 s")
    return pos


def visible(warehouse: Path, source: str, round_no: int) -> int:
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    current = warehouse / "current" / source / TABLE
    if not (current / "_delta_log").is_dir():
        return 0
    table = DeltaTable(str(current)).to_pyarrow_table(columns=["round", "__deleted"])
    live = pc.and_(pc.equal(table["round"], round_no), pc.invert(table["__deleted"]))
    return pc.sum(live).as_py() or 0


def print_breakdown(runs: list[dict]) -> None:
    """Per finished run: queue + launch time, run time, and each step's time."""
    print("\nruns (oldest first): created -> started (queue + launch), started -> ended, steps")
    for r in sorted(runs, key=lambda r: r["creationTime"]):
        if not (r.get("startTime") and r.get("endTime")):
            print(f"  {r['runId'][:8]} {r['jobName']:<22} {r['status']}")
            continue
        source = run_source(r)
        steps = ", ".join(
            f"{'/'.join(p for p in s['stepKey'].split('__') if p != source)} "
            f"{s['endTime'] - s['startTime']:.1f}"
            for s in sorted(r.get("stepStats") or [], key=lambda s: s.get("startTime") or 0)
            if s.get("startTime") and s.get("endTime")
        )
        print(f"  {r['runId'][:8]} {r['jobName']:<22} {r['status']:<8} "
              f"launch {r['startTime'] - r['creationTime']:5.1f} s  "
              f"run {r['endTime'] - r['startTime']:5.1f} s  [{steps}]")  # fmt: skip


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000, help="per round and source")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sources", default="files,kafka", help="files, kafka or both")
    parser.add_argument(
        "--sensor-interval", type=int, default=None,
        help="seconds; default: the demo catalog's (sources.yaml) per transport",
    )  # fmt: skip
    parser.add_argument(
        "--runs", choices=RUN_MODES, default="demo",
        help="the sources run as the demo's do (default), a run per batch, or continuously",
    )  # fmt: skip
    parser.add_argument("--warmup", type=int, default=0, help="uncounted rounds first")
    parser.add_argument("--timeout", type=float, default=300, help="per round, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, tables)")
    parser.add_argument(
        "--local-session", action="store_true",
        help="no Spark Connect server: each run starts its own local Spark (the old default)",
    )  # fmt: skip
    parser.add_argument(
        "--spark-connect", action="store_true", help="the default now; kept for old command lines"
    )
    args = parser.parse_args()
    kinds = [k.strip() for k in args.sources.split(",") if k.strip()]
    if not kinds or set(kinds) - {"files", "kafka"}:
        parser.error("--sources takes files, kafka or files,kafka")
    install_signal_handlers()

    try:
        check_prerequisites()
    except StackError as e:
        sys.exit(f"latency: error: {e}")
    work = Path(tempfile.mkdtemp(prefix="cdc-latency-"))
    stack = None
    ok = False
    try:
        demo = demo_settings()
        interval = {t: args.sensor_interval or demo["interval"].get(t, 15)
                    for t in ("files", "kafka")}  # fmt: skip
        bootstrap = f"127.0.0.1:{free_port()}"
        catalog = write_catalog(
            work / "sources.yaml", bootstrap=bootstrap, files_source=FILES, kafka_source=KAFKA,
            column_types={"id": "bigint", "name": "string", "round": "int"},
            interval=interval, spark=demo["spark"], max_records=demo["max_records"],
            continuous=continuous_settings(args.runs, demo),
        )  # fmt: skip
        stack = DemoStack(work, catalog, spark_connect=not args.local_session)
        stack.start(bootstrap)
        create_topic(bootstrap)
        spark = f"Spark Connect server {stack.spark_url}" if stack.spark_url else "local sessions"
        print(f"stack up: broker {bootstrap}, {spark}, dagster dev {stack.url}; "
              f"dagster.yaml: {stack.dagster_yaml}; sensor intervals {interval}; "
              f"runs: {args.runs}; work {work}",
              flush=True)  # fmt: skip
        times: dict[str, list[float]] = {k: [] for k in kinds}
        pos = {"files": 4, "kafka": 4}
        total = args.warmup + args.rounds
        cpu0, wall0 = stack.cpu_seconds(), time.monotonic()
        for round_no in range(1, total + 1):
            for kind in kinds:
                source = FILES if kind == "files" else KAFKA
                if kind == "files":
                    pos[kind] = append_files(stack.landing, round_no, args.events, pos[kind])
                else:
                    pos[kind] = append_kafka(bootstrap, round_no, args.events, pos[kind])
                start = time.monotonic()
                while (seen := visible(stack.warehouse, source, round_no)) < args.events:
                    if time.monotonic() - start > args.timeout:
                        raise StackError(f"round {round_no} {kind}: {seen} of {args.events} "
                                         f"visible after {args.timeout:.0f} s")  # fmt: skip
                    stack.check_alive()
                    time.sleep(0.5)
                took = time.monotonic() - start
                warm = round_no <= args.warmup
                if not warm:
                    times[kind].append(took)
                print(f"round {round_no}{' (warm-up)' if warm else ''} {kind}: {args.events} "
                      f"events visible after {took:.1f} s", flush=True)  # fmt: skip
        cpu, wall = stack.cpu_seconds() - cpu0, time.monotonic() - wall0
        print(f"\nstack CPU over the rounds: {cpu:.0f} s in {wall:.0f} s ({cpu / wall:.2f} cores)")
        print(f"targets: median <= {TARGET_MEDIAN_S:.0f} s, no round over {TARGET_MAX_S:.0f} s")
        for kind, values in times.items():
            med, top = statistics.median(values), max(values)
            print(f"{kind:<5} rounds {' '.join(f'{v:.1f}' for v in values)} | median {med:.1f} s "
                  f"({verdict(med <= TARGET_MEDIAN_S)}), max {top:.1f} s "
                  f"({verdict(top <= TARGET_MAX_S)})")  # fmt: skip
        print_breakdown(stack.runs(steps=True))
        ok = True
    except StackError as e:
        print(f"latency: error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print("latency: interrupted", file=sys.stderr)
    finally:
        if stack is not None:
            stack.stop()
        if args.keep or not ok:
            print(f"work folder (logs, tables): {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
