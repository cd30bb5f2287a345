"""Does a live run cost the same at the end of a day as at its start? Every step of a sensor run.

A landing source with one table (history kept), fed a small file every 30 s: a day is 2,880
files. At the start of the day (``--measure`` files so far) and at its end (``--files``),
``--measure`` runs each land one more file and carry it through every step a sensor run does,
timed apart: raw (``ingest_landing``), change log (``normalize_new``) and its checks
(``validate_changelog``, ``validate_reconciliation`` on what the run wrote), current table
(``merge_current``), its checks (``validate_current``) and preview, and history
(``update_history``).

The end of the day is built quickly but has the files a day of runs leaves: raw gets one
commit per landing file; the change log, current and history tables are built in one go and
then rewritten as one data file per landing file (the change log in arrival order, the others
by key), as one run per file leaves them when nothing compacts them. Prints numbers and the
data files of each table; checks nothing but that every run's checks pass.

    .venv/bin/python bench/live_day.py                      # 2,880 files of 10 events
    .venv/bin/python bench/live_day.py --files 500 --measure 3
    .venv/bin/python bench/live_day.py --day /tmp/day   # keeps the built day for the next run
"""

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.lake import commit, data_files
from cdc_platform.quality import validations
from cdc_platform.spark.session import get_spark
from cdc_platform.steps.changelog import normalize_new
from cdc_platform.steps.current import current_rows, merge_current
from cdc_platform.steps.history import update_history
from cdc_platform.steps.raw import ingest_landing

DATE = "2026-05-01"
TABLE = TableConfig(name="t", source_table="app.t", primary_key=["id"])
SOURCE = SourceConfig(name="day", format="debezium", tables=[TABLE])
STEPS = ["raw", "changelog", "changelog checks", "current", "current checks", "preview", "history"]


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


def _one_file_per_run(spark, uri: str, files: int, order: str, partition_by=None) -> None:
    """Rewrite the table as ``files`` data files by ``order``, its state and transaction ids
    kept: the shape a day of one commit per run leaves."""
    raw_version = lake.normalized_raw_version(uri)
    txns = {} if raw_version is None else {lake.NORMALIZED_APP: raw_version}
    rows = lake.read(spark, uri)
    out = rows.repartitionByRange(files, F.col(order)).sortWithinPartitions(order)
    adds = data_files.write(out, uri, partition_by)
    commit.commit(
        uri, adds, schema=lake.arrow_schema(uri), partition_by=partition_by,
        props=lake.properties(lake.state(uri), txns), replace=True,
    )  # fmt: skip


def _prefill(spark, base: Path, files: int, args: argparse.Namespace) -> None:
    warehouse, landing = base / "warehouse", base / "landing"
    for n in range(files):
        _land(landing, n, args)
        ingest_landing(warehouse, SOURCE.name, landing, [DATE])
    normalize_new(spark, warehouse, SOURCE)
    log = lake.TableRef(lake.CHANGELOG, SOURCE.name, TABLE.name).uri(warehouse)
    _one_file_per_run(spark, log, files, "sequence", [lake.PARTITION_COLUMN])
    merge_current(spark, warehouse, SOURCE.name, TABLE.name, options=TABLE)
    update_history(spark, warehouse, SOURCE.name, TABLE)
    for layer in (lake.CURRENT, lake.HISTORY):
        uri = lake.TableRef(layer, SOURCE.name, TABLE.name).uri(warehouse)
        _one_file_per_run(spark, uri, files, "id")


def _run(spark, warehouse: Path, landing: Path) -> dict[str, float]:
    """One sensor run's steps on the pending landing file, seconds each."""
    times: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(step: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        times[step] = now - clock
        clock = now

    ingest_landing(warehouse, SOURCE.name, landing, [DATE])
    lap("raw")
    result = normalize_new(spark, warehouse, SOURCE)
    lap("changelog")
    written = result.written
    checks = [
        validations.validate_changelog(spark, warehouse, SOURCE, TABLE.name, [DATE], written),
        validations.validate_reconciliation(spark, warehouse, SOURCE, [DATE], written),
    ]
    lap("changelog checks")
    merged = merge_current(spark, warehouse, SOURCE.name, TABLE.name, options=TABLE)
    lap("current")
    balance = {"live_before": merged.live_before, "made_live": merged.made_live,
               "made_dead": merged.made_dead, "truncated_live": merged.truncated_live,
               "live_after": merged.rows}  # fmt: skip
    checks += validations.validate_current(
        spark, warehouse, SOURCE, TABLE.name, balance, merged.written, merged.merged_changes
    )
    lap("current checks")
    current_rows(spark, warehouse, SOURCE.name, TABLE.name, merged.written).limit(10).toArrow()
    lap("preview")
    update_history(spark, warehouse, SOURCE.name, TABLE)
    lap("history")
    failed = [r.rule for run in checks if run for r in run.rules if not r.success]
    assert not failed, failed
    return times


def _files(warehouse: Path) -> str:
    counts = []
    for layer in (lake.RAW, lake.CHANGELOG, lake.CURRENT, lake.HISTORY):
        table = None if layer == lake.RAW else TABLE.name
        uri = lake.TableRef(layer, SOURCE.name, table).uri(warehouse)
        counts.append(f"{layer} {len(lake.files(uri))}")
    return ", ".join(counts)


def _measure(spark, base: Path, start: int, args) -> list[dict[str, float]]:
    """Copies ``base`` and times ``--measure`` runs, each landing one more file."""
    work = Path(tempfile.mkdtemp(prefix="live-day-"))
    try:
        shutil.copytree(base, work, dirs_exist_ok=True)
        print(f"    data files before: {_files(work / 'warehouse')}", flush=True)
        runs = []
        for n in range(start, start + args.measure):
            _land(work / "landing", n, args)
            runs.append(_run(spark, work / "warehouse", work / "landing"))
            print("    " + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items()), flush=True)
        print(f"    data files after: {_files(work / 'warehouse')}", flush=True)
        return runs
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=2880, help="files of the day at its end")
    parser.add_argument("--events", type=int, default=10, help="events per file")
    parser.add_argument("--keys", type=int, default=20_000, help="distinct keys")
    parser.add_argument("--measure", type=int, default=5, help="timed runs at each point")
    parser.add_argument(
        "--day", help="keep the built day in this folder, or reuse it if it is there (building "
        "the end of a 2,880-file day takes about 20 minutes): before and after a change run on "
        "the same tables",
    )  # fmt: skip
    args = parser.parse_args()
    spark = get_spark("local[2]", {"spark.sql.shuffle.partitions": "2"})
    spark.range(1).count()  # JVM warm-up outside the timings
    root = Path(args.day) if args.day else Path(tempfile.mkdtemp(prefix="live-day-base-"))
    try:
        results = {}
        for point, files in (("start", args.measure), ("end", args.files - args.measure)):
            base = root / point
            if not (base / "warehouse").is_dir():
                t = time.perf_counter()
                _prefill(spark, base, files, args)
                print(f"{point} of day: {files} files, built in {time.perf_counter() - t:.0f} s",
                      flush=True)  # fmt: skip
            # The first run warms this point's code paths up: not counted.
            results[point] = _measure(spark, base, files, args)[1:]
        print(f"\nmedian seconds of {args.measure - 1} runs (the first not counted)")
        print(f"{'step':<18} {'start':>7} {'end':>7} {'end/start':>10}")
        for step in [*STEPS, "total"]:
            start, end = (
                statistics.median(sum(r.values()) if step == "total" else r[step] for r in runs)
                for runs in (results["start"], results["end"])
            )
            print(f"{step:<18} {start:7.2f} {end:7.2f} {end / start:9.2f}x")
    finally:
        if not args.day:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
