"""What reading a table's snapshot costs as its log grows, by checkpoint interval.

A reader (``DeltaTable(uri)`` and its add actions, as every ``lake`` snapshot fact is read)
loads the last checkpoint and replays each commit after it. Live operation commits to each
table every micro-batch, and a micro-batch reads about a hundred snapshots
(``bench/micro_batch_jobs.py`` counts them). This commits one small file at a time to a
partitioned table, as a micro-batch does, and times a snapshot read after each commit: with
delta-rs's default interval (100 commits) and with ours (``lake.TABLE_PROPERTIES``).

    .venv/bin/python bench/delta_log_reads.py [--commits 200] [--reads 10]
"""

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cdc_platform import lake  # noqa: E402


def read_ms(uri: str, reads: int) -> float:
    """Milliseconds of one snapshot read (the median of ``reads``)."""
    took = []
    for _ in range(reads):
        started = time.perf_counter()
        DeltaTable(uri).get_add_actions(flatten=True)
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


def by_version(folder: Path, configuration: dict, commits: int, reads: int) -> list[float]:
    uri = str(folder)
    rows = pa.table({"id": [1], "name": ["x"], lake.PARTITION_COLUMN: ["2026-11-28"]})
    costs = []
    for i in range(commits):
        write_deltalake(
            uri, rows, mode="append", partition_by=[lake.PARTITION_COLUMN],
            configuration=configuration if i == 0 else None,
        )  # fmt: skip
        costs.append(read_ms(uri, reads))
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--reads", type=int, default=10, help="reads timed after each commit")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="delta-log-reads-"))
    try:
        runs = {
            "delta-rs default (100)": {},
            f"ours ({lake.TABLE_PROPERTIES['delta.checkpointInterval']})": lake.TABLE_PROPERTIES,
        }
        print(f"one snapshot read, ms, over {args.commits} commits of one file each")
        print(f"  {'checkpoint interval':24} {'median':>7} {'mean':>7} {'max':>7}")
        for i, (name, configuration) in enumerate(runs.items()):
            costs = by_version(work / str(i), configuration, args.commits, args.reads)
            print(f"  {name:24} {statistics.median(costs):7.1f} {statistics.mean(costs):7.1f} "
                  f"{max(costs):7.1f}")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
