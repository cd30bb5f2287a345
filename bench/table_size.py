"""Does a live run's merge cost follow its batch or the table? The same 1,000-event batch merged
into current tables of 10,000 and of 10,000,000 rows.

For each table size N it builds a change log of N inserts (keys 0..N-1) and the current table
from it (files sorted by key, `lake.ROWS_PER_FILE` rows each), then merges ROUNDS batches of
1,000 change events the way a sensor run does: `merge_current` (the live-effect count, the
MERGE, the live and tombstone counts kept in the table's state), the current table's checks
(`validate_current` on what the merge wrote) and the preview of the rows it wrote. Two batch
shapes:

- `recent`: 500 updates of the newest keys and 500 inserts of new keys, as an OLTP table with
  an increasing key sees them (clustered);
- `uniform`: 1,000 updates of keys drawn uniformly from the whole table.

It prints, per size and shape, the median seconds of each part and the files rewritten. A
copy-on-write merge rewrites every file that holds a changed key: `uniform` touches every
file of a large table, whatever the code around it does (see BENCHMARKS.md).

    .venv/bin/python bench/table_size.py [--sizes 10000,10000000] [--rounds 3]
        [--shapes recent,uniform]
"""

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.quality import validations
from cdc_platform.spark.session import get_spark
from cdc_platform.steps.current import current_rows, merge_current

BATCH = 1_000
DAY = "2026-01-01"


def changes(spark, ids, op: str, seq_base: int, version: int):
    """Change-log rows for the ids of ``ids`` (a frame with ``id``), sequence seq_base + id."""
    after = F.struct(
        F.col("id"), F.concat(F.lit(f"v{version}-"), F.col("id").cast("string")).alias("a")
    )
    return ids.select(
        F.lit(op).alias("op"),
        F.struct(F.col("id")).alias("key"),
        F.lit(None).cast("struct<id:bigint,a:string>").alias("before"),
        after.alias("after"),
        F.lit(None).cast("array<string>").alias("after_columns"),
        F.format_string("%015d", F.col("id") + F.lit(seq_base)).alias("sequence"),
        F.current_timestamp().alias("event_time"),
        F.lit(DAY).cast("date").alias(lake.PARTITION_COLUMN),
    )


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def preview(spark, warehouse: Path, written: list[str] | None):
    """What the current asset shows: the first rows the merge wrote, by key."""
    return current_rows(spark, warehouse, "s", "t", written).orderBy("id").limit(10).toArrow()


def measure(spark, work: Path, size: int, shape: str, rounds: int) -> dict[str, float]:
    warehouse = work / f"{shape}-{size}"
    cl = lake.TableRef(lake.CHANGELOG, "s", "t").uri(warehouse)
    first = changes(spark, spark.range(size), "c", 0, 0)
    props = lake.properties(lake.TableState(key=["id"], qualified="t"))
    lake.append(first, cl, partition_by=[lake.PARTITION_COLUMN], props=props)
    merge_current(spark, warehouse, "s", "t")
    source = SourceConfig(name="s", format="debezium", tables=[TableConfig(name="t")])
    parts: dict[str, list[float]] = {"merge": [], "checks": [], "preview": [], "files": []}
    for r in range(1, rounds + 1):
        seq = 10 * size * r
        if shape == "recent":
            updates = spark.range(size - BATCH // 2, size)
            inserts = spark.range(size + (r - 1) * BATCH // 2, size + r * BATCH // 2)
            batch = changes(spark, updates, "u", seq, r).unionByName(
                changes(spark, inserts, "c", seq, r)
            )
        else:
            ids = spark.range(size).sample(fraction=min(1.0, 2.0 * BATCH / size), seed=r)
            batch = changes(spark, ids.limit(BATCH), "u", seq, r)
        lake.append(batch, cl, partition_by=[lake.PARTITION_COLUMN], props=props)
        before = set(lake.files(lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse)))
        merged, t_merge = timed(lambda: merge_current(spark, warehouse, "s", "t"))
        balance = {"live_before": merged.live_before, "made_live": merged.made_live,
                   "made_dead": merged.made_dead, "truncated_live": merged.truncated_live,
                   "live_after": merged.rows}  # fmt: skip
        runs, t_checks = timed(
            validations.validate_current, spark, warehouse, source, "t", balance,
            merged.written, merged.merged_changes,
        )  # fmt: skip
        assert all(run.success for run in runs), [r.rule for run in runs for r in run.rules]

        _, t_preview = timed(preview, spark, warehouse, merged.written)
        after = set(lake.files(lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse)))
        parts["merge"].append(t_merge)
        parts["checks"].append(t_checks)
        parts["preview"].append(t_preview)
        parts["files"].append(len(before - after))
        print(f"  {shape:<8} {size:>11,} rows, round {r}: merge {t_merge:5.2f} s, checks "
              f"{t_checks:5.2f} s, preview {t_preview:5.2f} s, files rewritten "
              f"{len(before - after)} of {len(before)}", flush=True)  # fmt: skip
    shutil.rmtree(warehouse, ignore_errors=True)
    return {k: statistics.median(v) for k, v in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,10000000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", default="recent,uniform")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    shapes = [s for s in args.shapes.split(",") if s]
    if set(shapes) - {"recent", "uniform"}:
        sys.exit("table_size: error: --shapes takes recent, uniform or both")
    spark = get_spark("local[2]", {"spark.driver.memory": "4g"})
    work = Path(tempfile.mkdtemp(prefix="cdc-table-size-"))
    results = {}
    try:
        for shape in shapes:
            for size in sizes:
                results[(shape, size)] = measure(spark, work, size, shape, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmedian of {args.rounds} merges of {BATCH:,} events (seconds)")
    print(f"{'shape':<8} {'table rows':>12} {'merge':>7} {'checks':>7} {'preview':>8} "
          f"{'files rewritten':>16}")  # fmt: skip
    for (shape, size), r in results.items():
        print(f"{shape:<8} {size:>12,} {r['merge']:>7.2f} {r['checks']:>7.2f} "
              f"{r['preview']:>8.2f} {r['files']:>16.0f}")  # fmt: skip
    for shape in shapes:
        small, large = results[(shape, sizes[0])], results[(shape, sizes[-1])]
        total = [sum(r[k] for k in ("merge", "checks", "preview")) for r in (small, large)]
        print(f"{shape}: {sizes[-1]:,} rows against {sizes[0]:,}: {total[1] / total[0]:.2f}x")


if __name__ == "__main__":
    main()
