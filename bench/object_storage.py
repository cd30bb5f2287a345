"""The lake on local disk against the lake on S3 (SeaweedFS on loopback, tests/s3_server.py), in
one process and one warm Spark session, each measured the same way, alternating:

1. ``make bench``'s replay: ``--events`` Debezium events (bench/throughput.py's generator) from
   one landing file through raw, the change log and the current table of a new warehouse;
2. a micro-batch: ``--batch`` more events (the same keys, later) in a second landing file into
   those tables, as a live run's micro-batch takes them: raw appended, the raw batch normalized
   (``normalize_new``), merged;
3. a sensor tick over a landing prefix of ``--objects`` files that raw already holds (what the
   landing sensor lists and compares every tick): an hourly whole listing, and a tick between
   them, which lists from the last name raw holds on.

``--parts`` picks them: ``pipeline`` (1 and 2), ``ticks`` (3); both by default.

For each S3 round it prints the requests the server served (the gateway's counters: LIST, GET
(HEAD counts as a GET), PUT, POST, DELETE), since a store bills requests. Loopback has no
network latency: a real store's round trips add to every request counted here.

    .venv/bin/python bench/object_storage.py [--events N] [--batch N] [--objects N] [--rounds N]
        [--parts pipeline,ticks]
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from throughput import DATE, SOURCE, TYPES, generate  # noqa: E402

from cdc_platform.catalog import SourceConfig  # noqa: E402
from cdc_platform.lake import storage  # noqa: E402
from cdc_platform.spark.session import get_spark  # noqa: E402
from cdc_platform.steps.changelog import normalize_new, normalize_source  # noqa: E402
from cdc_platform.steps.current import merge_current  # noqa: E402
from cdc_platform.steps.raw import ingest_files, ingest_landing, pending_landing_files  # noqa: E402
from tests.s3_server import S3Server  # noqa: E402

CONFIG = SourceConfig(name=SOURCE, format="debezium", primary_key=["id"], column_types=TYPES)


def pipeline(spark, landing: Path, warehouse: str, replay: bool) -> dict[str, float]:
    """Raw, change log and current from one landing file; seconds per step. ``replay``: the
    date's raw and change log replaced (``cdc-platform replay``), else the file appended and its
    raw batch normalized (a live run's micro-batch)."""
    times = {}
    start = time.perf_counter()
    # Named by its folder: a file of the same name would replace the first one's rows.
    name = f"{landing.parent.name}-{landing.name}"
    ingest_files(warehouse, SOURCE, [(landing, name)], DATE, whole_date=replay)
    times["raw"] = time.perf_counter() - start
    start = time.perf_counter()
    if replay:
        result = normalize_source(spark, warehouse, CONFIG, [DATE])
    else:
        result = normalize_new(spark, warehouse, CONFIG)
    times["normalize"] = time.perf_counter() - start
    start = time.perf_counter()
    for table in result.tables:
        merge_current(spark, warehouse, SOURCE, table)
    times["merge"] = time.perf_counter() - start
    times["total"] = sum(times.values())
    return times


def tick(warehouse: str, landing: str, full: bool) -> float:
    start = time.perf_counter()
    pending = pending_landing_files(warehouse, "ticks", storage.join(landing, "ticks"), full)
    assert pending == {}, "raw should hold every file"
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--objects", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=2, help="of each, alternating local and S3")
    ap.add_argument("--parts", default="pipeline,ticks", help="pipeline, ticks or both")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    server = S3Server(work / "seaweedfs", metrics=True).start()
    try:
        os.environ.update(server.env())
        server.create_bucket("bench")
        spark = get_spark("local[*]", {"spark.sql.shuffle.partitions": "4"})
        first, later = work / "first" / "events.jsonl", work / "later" / "events.jsonl"
        # One stream cut in two: the micro-batch continues the replay's events (newer
        # positions, the same keys' updates and deletes).
        whole = work / "whole" / "events.jsonl"
        generate(whole, args.events + args.batch, args.keys, with_schema=False)
        first.parent.mkdir(parents=True)
        later.parent.mkdir(parents=True)
        with whole.open() as events, first.open("w") as a, later.open("w") as b:
            for i, line in enumerate(events):
                (a if i < args.events else b).write(line)
        whole.unlink()
        # The tick's landing files: tiny, all held by raw before the tick is timed.
        warm = work / "warm" / "events.jsonl"
        generate(warm, 10_000, 1_000, with_schema=False)
        pipeline(spark, warm, str(work / "warm-warehouse"), True)  # JIT and caches, untimed

        results: dict[str, list[dict]] = {"local": [], "s3": []}
        parts = set(args.parts.split(","))
        for n in range(args.rounds if "pipeline" in parts else 0):
            for where in ("local", "s3") if n % 2 == 0 else ("s3", "local"):
                base = str(work / f"{where}{n}") if where == "local" else f"s3://bench/r{n}"
                warehouse = storage.join(base, "warehouse")
                before = server.requests()
                replay = pipeline(spark, first, warehouse, True)
                middle = server.requests()
                batch = pipeline(spark, later, warehouse, False)
                after = server.requests()
                round_ = {"replay": replay, "micro_batch": batch}
                if where == "s3":
                    round_["replay_requests"] = _diff(middle, before)
                    round_["micro_batch_requests"] = _diff(after, middle)
                results[where].append(round_)
                print(where, n, json.dumps(round_), flush=True)

        # The sensor tick over a prefix of --objects files raw holds.
        places = (("local", str(work / "ticks")), ("s3", "s3://bench/ticks"))
        for where, base in places if "ticks" in parts else ():
            landing, warehouse = storage.join(base, "landing"), storage.join(base, "warehouse")
            folder = storage.join(landing, "ticks", f"dt={DATE}")
            for i in range(args.objects):
                storage.write_whole(storage.join(folder, f"{i:06d}.jsonl"), b'{"op":"x"}\n')
            ingest_landing(warehouse, "ticks", storage.join(landing, "ticks"), [DATE])
            for kind, full in (("whole listing", True), ("from the last name", False)):
                times, before = [], server.requests()
                for _ in range(5):
                    times.append(tick(warehouse, landing, full))
                requests = _diff(server.requests(), before)
                per_tick = {k: v / 5 for k, v in requests.items()}
                print(
                    f"tick {where}, {kind}: median {sorted(times)[2]:.3f} s over 5"
                    + (f", requests per tick {per_tick}" if where == "s3" else ""),
                    flush=True,
                )
        if not results["local"]:
            return
        # The fastest round of each: the first rounds still pay the JIT's warm-up.
        print("\nfastest of the rounds (s):")
        for kind in ("replay", "micro_batch"):
            local = min(r[kind]["total"] for r in results["local"])
            s3 = min(r[kind]["total"] for r in results["s3"])
            print(f"  {kind}: local {local:.2f}, s3 {s3:.2f}, ratio {s3 / local:.2f}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def _diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {
        k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)
    }


if __name__ == "__main__":
    main()
