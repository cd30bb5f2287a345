"""What a running stack costs: the CPU and memory of a process tree over a window.

Meant for `make demo` under its own traffic (a batch per source every 30 s), the idle cost of
issue 22: start the demo, let it warm up, then point this at the `make` process:

    make demo &                                          # wait for "Dagster UI: ..."
    .venv/bin/python bench/idle_cpu.py $(pgrep -f 'make demo') --minutes 10

Every 30 s it prints the tree's CPU seconds since the start (user + system, ended children
included: /proc, as bench/latency.py counts them), the average cores, the resident memory summed
over the tree (pages shared with a fork count twice) and the number of processes. At the end
it splits the CPU seconds by part of the stack (a process's own, and its ended children's).
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from latency import cpu_seconds, descendants, rss_bytes  # noqa: E402  (bench/ is not a package)

# Parts of the stack, by what their command line contains (the first that matches). The daemon
# launches runs from its forkserver (deploy/dagster.yaml), so an ended run's time stays there.
PARTS = (
    ("Spark Connect server", ("cdc_platform.spark.connect_server", "org.apache.spark")),
    ("runs (the daemon's forkserver)", ("multiprocessing.forkserver",)),
    ("daemon", ("_daemon run", "dagster-daemon")),
    ("code server", ("api grpc", "code-server")),
    ("webserver", ("dagster_webserver", "dagster-webserver")),
    ("broker", ("tansu",)),
    ("demo traffic", ("cdc-platform demo",)),
)


def part(pid: int) -> str:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "gone"
    return next((name for name, marks in PARTS if any(m in command for m in marks)), "other")


def by_part(tree: list[int]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pid in tree:
        name = part(pid)
        out[name] = out.get(name, 0.0) + cpu_seconds([pid])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pid", type=int, help="the root of the tree (e.g. make demo)")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--every", type=float, default=30, help="seconds between lines")
    args = parser.parse_args()

    def sample() -> tuple[float, int, int]:
        # An ended run still counts, through its waiting parent's cutime and cstime.
        tree = descendants([args.pid])
        return cpu_seconds(tree), rss_bytes(tree), len(tree)

    first, _, _ = sample()
    parts_first = by_part(descendants([args.pid]))
    start = time.monotonic()
    peak = 0
    while (elapsed := time.monotonic() - start) < args.minutes * 60:
        time.sleep(min(args.every, args.minutes * 60 - elapsed))
        cpu, rss, procs = sample()
        elapsed = time.monotonic() - start
        peak = max(peak, rss)
        print(f"t={elapsed:5.0f} s  cpu={cpu - first:7.1f} s  cores={(cpu - first) / elapsed:.2f}"
              f"  rss={rss / 2**30:.2f} GiB  procs={procs}", flush=True)  # fmt: skip
    print(f"over {elapsed / 60:.1f} min: {cpu - first:.0f} CPU s, {(cpu - first) / elapsed:.2f} "
          f"cores; RSS at most {peak / 2**30:.2f} GiB")  # fmt: skip
    for name, seconds in sorted(by_part(descendants([args.pid])).items(), key=lambda p: -p[1]):
        spent = seconds - parts_first.get(name, 0.0)  # a run started meanwhile had none
        print(f"  {name:28} {spent:7.0f} CPU s  {spent / elapsed:.2f} cores")


if __name__ == "__main__":
    main()
