"""How many round trips to the Spark Connect server a small micro-batch makes, and where.

Every run of the demo talks to one Spark Connect server. Besides the queries it runs, a client
asks the server for a frame's schema (``columns``, ``schema``, an analysis each): a round trip
and an analysis of the plan on the server, paid per micro-batch whatever its size.

It starts a Spark Connect server (``cdc-platform spark-server``, no warm-up) on a free port,
then runs the demo catalog's continuous job of one source (``shop`` by default) in this process
against it, one micro-batch per batch of demo traffic, counting the client's calls (analyses,
queries, settings) and their seconds, where in the package the analyses come from, and the CPU
seconds of the server and of this process (the client): what each micro-batch of the demo costs
its stack. The first micro-batch also pays for code generation: the median is over the others.

    .venv/bin/python bench/connect_round_trips.py [--source shop] [--batches 4]
"""

import argparse
import atexit
import datetime as dt
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from latency import cpu_seconds  # noqa: E402  (bench/ is not a package)

from cdc_platform.processes import descendants  # noqa: E402

CALLS = {"_analyze": "analyses", "_execute_and_fetch": "queries", "config": "settings"}
# The server's threads by what they do (the first pattern its name matches; Linux keeps 15
# characters of a thread's name).
THREADS = (
    ("the JIT compiler", re.compile(r"^C\d CompilerThre|^Sweeper")),
    (
        "planning and driving queries",
        re.compile(r"^SparkConnectExe|^grpc|^ResultQuery|^shuffle-exch|^broadcast-exch|^dag-sched"),
    ),
    ("tasks", re.compile(r"^Executor task")),
    ("garbage collection", re.compile(r"^GC Thread|^G1 |^VM Thread")),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def by_thread(pids: Iterable[int]) -> Counter[str]:
    """CPU seconds so far of the live threads of ``pids``, by ``THREADS`` (the rest: "other")."""
    ticks, out = os.sysconf("SC_CLK_TCK"), Counter()
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            part = next((p for p, pattern in THREADS if pattern.search(name)), "other")
            out[part] += (int(fields[11]) + int(fields[12])) / ticks
    return out


def _server(work: Path) -> tuple[str, int]:
    """A Spark Connect server of this checkout, stopped at exit: its address and process."""
    port = _free_port()
    log = (work / "spark-server.log").open("w")
    cli = Path(sys.executable).parent / "cdc-platform"
    proc = subprocess.Popen(
        [str(cli), "spark-server", "--port", str(port), "--no-warm-up"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    atexit.register(os.killpg, proc.pid, signal.SIGTERM)  # the server and its JVM
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return f"sc://127.0.0.1:{port}", proc.pid
        except OSError:
            if proc.poll() is not None:
                sys.exit(f"the Spark Connect server ended: see {log.name}")
            time.sleep(1)
    sys.exit("the Spark Connect server did not answer within 300 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="shop", help="a landing source of sources.yaml")
    parser.add_argument("--batches", type=int, default=4)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="connect-round-trips-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    remote, server = _server(work)
    os.environ.update(
        CDC_WAREHOUSE=str(work / "warehouse"),
        CDC_LANDING=str(work / "landing"),
        CDC_REPORTS=str(work / "reports"),
        CDC_SPARK_REMOTE=remote,
    )

    def cpu() -> tuple[float, float, Counter[str]]:
        """CPU seconds so far of the server (its JVM included), of this process, and of the
        server's threads by what they do."""
        me, tree = resource.getrusage(resource.RUSAGE_SELF), descendants([server])
        return cpu_seconds(tree), me.ru_utime + me.ru_stime, by_thread(tree)

    from pyspark.sql.connect.client import core

    calls: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    sites: Counter[str] = Counter()

    def counted(name: str) -> None:
        method = getattr(core.SparkConnectClient, name)

        def wrapper(*a: object, **k: object) -> object:
            started = time.perf_counter()
            try:
                return method(*a, **k)
            finally:
                calls[CALLS[name]] += 1
                seconds[CALLS[name]] += time.perf_counter() - started
                if name == "_analyze":
                    frames = traceback.extract_stack()[:-1]
                    mine = [f for f in frames if "/cdc_platform/" in f.filename]
                    if mine:
                        f = mine[-1]
                        sites[f"{f.filename.split('/cdc_platform/')[-1]}:{f.lineno}"] += 1

        setattr(core.SparkConnectClient, name, wrapper)

    for name in CALLS:
        counted(name)

    import dagster as dg

    from cdc_platform.catalog import ContinuousConfig, load_catalog
    from cdc_platform.defs.cdc_tables import build_source_defs
    from cdc_platform.defs.resources import build_resources
    from cdc_platform.demo import write_demo_traffic

    catalog = load_catalog(ROOT / "sources.yaml")
    source = catalog.source(args.source)
    if source.transport != "files":
        sys.exit(f"source {args.source}: a landing-file source is needed (demo traffic)")
    # A run that ends after one micro-batch.
    source = source.model_copy(update={"continuous": ContinuousConfig(run_minutes=0.001)})
    defs = dg.Definitions.merge(
        build_source_defs(source, catalog),
        dg.Definitions(resources=build_resources(catalog), executor=dg.in_process_executor),
    )
    job = defs.resolve_job_def(f"{args.source}__continuous")
    day = dt.date.today().isoformat()
    rounds, walls, server_cpu, client_cpu, threads = [], [], [], [], []
    for batch in range(args.batches):
        write_demo_traffic(catalog.landing_uri, batch=batch, date=day)
        for counter in (calls, seconds, sites):
            counter.clear()
        started, (server_before, client_before, threads_before) = time.monotonic(), cpu()
        with dg.instance_for_test() as instance:
            assert job.execute_in_process(instance=instance).success
        walls.append(time.monotonic() - started)
        server_after, client_after, threads_after = cpu()
        server_cpu.append(server_after - server_before)
        client_cpu.append(client_after - client_before)
        threads.append(threads_after - threads_before)
        rounds.append({k: (calls[k], seconds[k]) for k in CALLS.values()})
        got = ", ".join(f"{n} {k} ({s:.2f} s)" for k, (n, s) in rounds[-1].items())
        jit = threads[-1]["the JIT compiler"]
        print(
            f"micro-batch {batch}: {walls[-1]:.1f} s; CPU: server {server_cpu[-1]:.1f} s (JIT "
            f"{jit:.1f} s), client {client_cpu[-1]:.1f} s; {got}",
            flush=True,
        )
    if args.batches < 2:
        return
    print(f"\nmedian of micro-batches 1-{args.batches - 1} ({args.source}):")
    server_s, client_s = statistics.median(server_cpu[1:]), statistics.median(client_cpu[1:])
    wall = statistics.median(walls[1:])
    print(f"  {wall:.1f} s; CPU: server {server_s:.1f} s, client {client_s:.1f} s")
    print("  the server's CPU seconds by thread:")
    for part in [*(p for p, _ in THREADS), "other"]:
        print(f"  {statistics.median(t[part] for t in threads[1:]):6.1f}  {part}")
    # Spark Connect runs each query in a thread of its own, gone when it ends: its CPU seconds
    # are the server's less those of the threads still there.
    pairs = zip(server_cpu[1:], threads[1:], strict=True)
    ended = statistics.median(c - sum(t.values()) for c, t in pairs)
    print(f"  {ended:6.1f}  threads that ended (a query's own thread, mostly)")
    for kind in CALLS.values():
        n = statistics.median(r[kind][0] for r in rounds[1:])
        s = statistics.median(r[kind][1] for r in rounds[1:])
        print(f"  {n:4.0f} {kind} ({s:.2f} s)")
    print("  analyses by call site (the last micro-batch):")
    for site, n in sites.most_common():
        print(f"  {n:4d}  {site}")


if __name__ == "__main__":
    main()
