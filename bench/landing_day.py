"""Cost per landing file over a day: does a run cost the same at the end of a day as at its start?

A day of ``--files`` small landing files (one every 30 s is 2,880), each of ``--events`` Debezium
events over a bounded key space. At the start of the day (the date holds ``--measure`` files)
and at its end (it holds ``--files``), ``--measure`` runs each land one more file and carry it
raw -> change log -> current, timed in wall and CPU seconds, two ways:

- before: the date replaced whole, as every landing run did until incremental ingestion
  (``ingest_landing(whole_date=True)`` + ``normalize_source`` of the date, what a backfill does);
- after: incremental, as a sensor run does now (``ingest_landing`` of the pending files +
  ``normalize_new``).

Both then merge the current table. The end-of-day state is built quickly: the raw table gets one
commit per file (as a day of runs leaves it); the change log and current table are built in
batches of ``--prefill-batch`` files. Prints numbers, checks nothing but that both ways leave the
same current table.

    .venv/bin/python bench/landing_day.py                 # 2,880 files of 10 events
    .venv/bin/python bench/landing_day.py --files 500 --measure 5
"""

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from throughput import cpu_seconds  # bench/ is the script's folder, on sys.path

from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.spark.session import get_spark
from cdc_platform.steps.changelog import normalize_new, normalize_source
from cdc_platform.steps.current import current_rows, merge_current
from cdc_platform.steps.raw import ingest_landing

DATE = "2026-05-01"
SOURCE = SourceConfig(
    name="day",
    format="debezium",
    tables=[TableConfig(name="t", source_table="app.t", primary_key=["id"])],
)


def _events(n: int, events: int, keys: int) -> str:
    lines = []
    for i in range(events):
        pos = n * events + i
        key = (pos * 7919) % keys
        source = {"db": "app", "table": "t", "file": "bin.000001", "pos": pos, "row": 0,
                  "ts_ms": 1_700_000_000_000 + pos}  # fmt: skip
        after = {"id": key, "name": f"v{pos}", "amount": pos * 0.5}
        lines.append(json.dumps({"before": None, "after": after, "source": source,
                                 "op": "c" if pos < keys else "u", "ts_ms": 1}))  # fmt: skip
    return "".join(line + "\n" for line in lines)


def _land(landing: Path, n: int, args: argparse.Namespace) -> None:
    folder = landing / f"dt={DATE}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"f{n:05d}.jsonl").write_text(_events(n, args.events, args.keys))


def _run(spark, warehouse: Path, landing: Path, whole_date: bool) -> None:
    ingest_landing(warehouse, SOURCE.name, landing, [DATE], whole_date=whole_date)
    if whole_date:
        normalize_source(spark, warehouse, SOURCE, [DATE])
    else:
        normalize_new(spark, warehouse, SOURCE)
    merge_current(spark, warehouse, SOURCE.name, "t")


def _prefill(spark, base: Path, files: int, args: argparse.Namespace) -> None:
    """A date of ``files`` files, raw with one commit per file, the rest in batches."""
    warehouse, landing = base / "warehouse", base / "landing"
    for n in range(files):
        _land(landing, n, args)
        ingest_landing(warehouse, SOURCE.name, landing, [DATE])
        if (n + 1) % args.prefill_batch == 0 or n + 1 == files:
            normalize_new(spark, warehouse, SOURCE)
            merge_current(spark, warehouse, SOURCE.name, "t")


def _measure(spark, base: Path, start: int, whole_date: bool, args) -> list[tuple[float, float]]:
    """Copies ``base`` and times ``--measure`` runs, each landing one more file."""
    work = Path(tempfile.mkdtemp(prefix="landing-day-"))
    try:
        shutil.copytree(base, work, dirs_exist_ok=True)
        times = []
        for n in range(start, start + args.measure):
            _land(work / "landing", n, args)
            wall, cpu = time.perf_counter(), cpu_seconds()
            _run(spark, work / "warehouse", work / "landing", whole_date)
            times.append((time.perf_counter() - wall, cpu_seconds() - cpu))
        rows = current_rows(spark, work / "warehouse", SOURCE.name, "t").count()
        print(f"    live rows after: {rows}", flush=True)
        return times
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=2880, help="files of the day at its end")
    parser.add_argument("--events", type=int, default=10, help="events per file")
    parser.add_argument("--keys", type=int, default=5000, help="distinct keys")
    parser.add_argument("--measure", type=int, default=10, help="timed runs at each point")
    parser.add_argument("--prefill-batch", type=int, default=100)
    parser.add_argument(
        "--before-end-runs", type=int, default=3, help="timed whole-date runs at the day's end"
    )
    args = parser.parse_args()
    spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": "2"})
    spark.range(1).count()  # JVM warm-up outside the timings
    root = Path(tempfile.mkdtemp(prefix="landing-day-base-"))
    try:
        results = {}
        for point, files in (("start", args.measure), ("end", args.files - args.measure)):
            base = root / point
            t = time.perf_counter()
            _prefill(spark, base, files, args)
            print(f"{point} of day: {files} files prefilled in {time.perf_counter() - t:.0f} s",
                  flush=True)  # fmt: skip
            for way, whole in (("before", True), ("after", False)):
                measure = args.before_end_runs if (whole and point == "end") else args.measure
                print(f"  {way} ({'whole date' if whole else 'incremental'}), {measure} runs",
                      flush=True)  # fmt: skip
                timed = argparse.Namespace(**{**vars(args), "measure": measure})
                results[(point, way)] = _measure(spark, base, files, whole, timed)
        print()
        print(f"{'':8} {'':12} {'wall s/file (median)':>22} {'CPU s/file (median)':>21}")
        for (point, way), times in results.items():
            wall = statistics.median(w for w, _ in times)
            cpu = statistics.median(c for _, c in times)
            print(f"{point:8} {way:12} {wall:22.2f} {cpu:21.2f}")
        for way in ("before", "after"):
            start = statistics.median(w for w, _ in results[("start", way)])
            end = statistics.median(w for w, _ in results[("end", way)])
            print(f"{way}: end of day / start of day = {end / start:.2f}x (wall)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
