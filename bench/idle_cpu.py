"""What a running stack costs: the CPU and memory of a process tree over a window.

Meant for `make demo` under its own traffic (a batch per source every 30 s), the idle cost of
issue 22: start the demo, let it warm up, then point this at the `make` process:

    make demo &                                          # wait for "Dagster UI: ..."
    .venv/bin/python bench/idle_cpu.py $(pgrep -f 'make demo') --minutes 10

Every 30 s it prints the tree's CPU seconds since the start (user + system, ended children
included: /proc, as bench/latency.py counts them), the average cores, the resident memory summed
over the tree (pages shared with a fork count twice) and the number of processes.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from latency import cpu_seconds, descendants, rss_bytes  # noqa: E402  (bench/ is not a package)


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


if __name__ == "__main__":
    main()
