"""What deletion vectors cost a read: a current table whose merges marked 10% and 30% of its rows
deleted, scanned whole, against the same rows compacted (every file rewritten without its
deleted rows, ``lake.purge`` with share 0).

Builds a change log of ``--rows`` inserts and the current table from it (``merge_current``, set
up, not timed), then for each share merges that share of the keys, drawn uniformly, as updates
(merge-on-read: the old rows marked, the new ones in new files). Each table is read with
``lake.read`` and every column hashed (``xxhash64``, xor-ed: no column pruned away, no row
count from footers), ``--repeat`` times; the summary gives medians and the ratio.

    .venv/bin/python bench/dv_reads.py                 # --rows 10000000 --shares 0.1,0.3
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from incremental_merge import DAY1, DAY2, SOURCE, TABLE, changes, load, write_changes
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.spark.session import get_spark
from cdc_platform.steps.current import merge_current


def scan(spark, uri: str) -> tuple[float, int]:
    df = lake.read(spark, uri)
    t = time.perf_counter()
    row = df.agg(F.count("*"), F.bit_xor(F.xxhash64(*df.columns))).first()
    return time.perf_counter() - t, row[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--shares", default="0.1,0.3")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench-dv-"))
    print(f"cores {os.cpu_count()}, load {load()}, out {out}", flush=True)
    spark = get_spark("local[2]")
    base = out / "base"
    write_changes(base, changes(np.arange(args.rows), "c", 1, DAY1, seed=1), DAY1)
    merge_current(spark, base, SOURCE, TABLE)
    try:
        for share in (float(s) for s in args.shares.split(",")):
            wh = out / f"share-{share}"
            shutil.copytree(base, wh)
            n = int(args.rows * share)
            ids = np.sort(np.random.default_rng(2).choice(args.rows, n, replace=False))
            write_changes(wh, changes(ids, "u", args.rows + 1, DAY2, seed=3), DAY2)
            merge_current(spark, wh, SOURCE, TABLE)
            uri = lake.TableRef(lake.CURRENT, SOURCE, TABLE).uri(wh)
            marked = sum(d.cardinality for d in lake.deletion_vectors_of(uri).values())
            with_dvs = [scan(spark, uri) for _ in range(args.repeat)]
            lake.purge(lambda: spark, uri, share=0.0)
            assert not lake.deletion_vectors_of(uri)
            compacted = [scan(spark, uri) for _ in range(args.repeat)]
            assert with_dvs[0][1] == compacted[0][1] == args.rows
            a = statistics.median(t for t, _ in with_dvs)
            b = statistics.median(t for t, _ in compacted)
            print(
                f"{share:.0%} of {args.rows:,} rows marked ({marked:,}): with DVs {a:.2f} s, "
                f"compacted {b:.2f} s, {a / b:.2f}x (load {load()})",
                flush=True,
            )
            shutil.rmtree(wh, ignore_errors=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
