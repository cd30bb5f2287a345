"""What a live batch costs the history step: in-order batches of updates into a large history.

It builds a change log of KEYS inserts and its history (`update_history`, the first run: every
key), then adds BATCHES day partitions of UPDATES updates, each newer than everything before
(keys spread over the whole key space), and runs `update_history` after each, as a live run
does: the touched keys' versions are extended from their open ones, compared with their old
rows, and the files holding the keys that changed are rewritten. Prints the seconds of each run
and what it wrote; checks nothing.

    .venv/bin/python bench/history_batch.py [--keys 1000000] [--updates 100000] [--batches 3]
"""

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cdc_platform import lake  # noqa: E402  (bench/ is not a package)
from cdc_platform.catalog import TableConfig  # noqa: E402
from cdc_platform.spark.session import get_spark  # noqa: E402
from cdc_platform.steps.history import update_history  # noqa: E402

TABLE = TableConfig(name="t", history=True)


def changes(spark, first: int, n: int, keys: int, op: str, day: str) -> DataFrame:
    """``n`` change records numbered from ``first`` (their sequence), of keys spread over
    ``keys``: inserts (``c``) or updates (``u``) of columns ``a`` and ``b``."""
    number = F.col("id")
    key = (number * 7919 % keys).cast("int")

    def image(a: Column, b: Column) -> Column:
        return F.struct(key.alias("id"), a.alias("a"), b.alias("b"))

    nothing = F.lit(None).cast("string")
    return spark.range(first, first + n).select(
        F.lit(op).alias("op"),
        F.struct(key.alias("id")).alias("key"),
        F.when(F.lit(op == "u"), image(nothing, nothing)).alias("before"),
        image(F.concat(F.lit("a"), number.cast("string")), F.lit("b")).alias("after"),
        F.lit(None).cast("array<string>").alias("after_columns"),
        F.lpad(number.cast("string"), 12, "0").alias("sequence"),
        F.timestamp_seconds(number + 1_700_000_000).alias("event_time"),
        F.lit(day).cast("date").alias("ingest_date"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--updates", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=3)
    args = parser.parse_args()
    spark = get_spark("local[2]")
    work = Path(tempfile.mkdtemp(prefix="history-batch-"))
    try:
        uri = lake.TableRef(lake.CHANGELOG, "s", TABLE.name).uri(work)
        state = lake.TableState(key=["id"])
        days = [f"2026-01-{d:02d}" for d in range(1, args.batches + 2)]
        inserts = changes(spark, 0, args.keys, args.keys, "c", days[0])
        lake.overwrite_partitions(inserts, uri, days[:1], state=state)
        started = time.monotonic()
        update_history(spark, work, "s", TABLE)
        print(f"history of {args.keys:,} keys built: {time.monotonic() - started:.2f} s")
        for i, day in enumerate(days[1:]):
            first = args.keys + i * args.updates
            batch = changes(spark, first, args.updates, args.keys, "u", day)
            lake.overwrite_partitions(batch, uri, [day], state=state)
            started = time.monotonic()
            result = update_history(spark, work, "s", TABLE)
            print(
                f"batch {i + 1} of {args.updates:,} updates: {time.monotonic() - started:.2f} s, "
                f"{result.versions_written:,} versions written, {result.rows:,} rows",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
