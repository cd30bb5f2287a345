"""Cost of an incremental merge into a large current table, next to a full rebuild.

Builds a change log of ``--rows`` inserts (canonical change-log rows generated with Arrow, written
with delta-rs: set-up, not timed), builds the current table from it with
``steps.current.merge_current`` (the full rebuild: ``full_refresh=True``, then the ordinary path
into an empty table, whose last run is the base), then writes a second change-log partition
updating ``--changed`` keys and times the incremental ``merge_current``, for two key distributions:

- ``uniform``: keys drawn uniformly at random from the whole key range (the hard case);
- ``clustered``: the most recent keys (the highest ids), as in an auto-increment table where
  recent rows change most.

Each incremental merge starts from a fresh copy of the same base warehouse. Every timed run prints
the load average at its start; the summary gives medians. It prints numbers, it checks nothing
(but the row counts it prints should read: ``--rows`` live rows, ``--changed`` updated). Files:
the files and bytes removed and added according to the Delta log, and the deletion vector files
written (a merge-on-read merge removes no file: it gives files new deletion vectors).

    .venv/bin/python bench/incremental_merge.py            # --rows 10000000 --changed 100000
    .venv/bin/python bench/incremental_merge.py --rows 1000000 --changed 10000 --repeat 1
"""

import argparse
import atexit
import os
import shutil
import statistics
import tempfile
import time
from functools import wraps
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from throughput import cpu_seconds  # bench/ is the script's folder, on sys.path

from cdc_platform import lake
from cdc_platform.spark.session import get_spark
from cdc_platform.steps import current as merge_step
from cdc_platform.steps.current import merge_current

SOURCE, TABLE = "bench", "t"
DAY1, DAY2 = "2026-01-01", "2026-01-02"
T0 = np.datetime64("2026-01-01T00:00:00", "us")
SEQ_WIDTH = 20
IMAGE = pa.struct(
    [
        ("id", pa.int32()),
        ("name", pa.string()),
        ("amount", pa.float64()),
        ("qty", pa.int32()),
        ("status", pa.string()),
        ("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)
SCHEMA = pa.schema(
    [
        ("op", pa.string()),
        ("key", pa.struct([("id", pa.int32())])),
        ("before", IMAGE),
        ("after", IMAGE),
        ("after_columns", pa.list_(pa.string())),
        ("sequence", pa.string()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("ingest_date", pa.date32()),
    ]
)
STATUSES = pa.array(["new", "paid", "shipped", "done"])


def changes(ids: np.ndarray, op: str, first_seq: int, day: str, seed: int) -> pa.Table:
    """Change-log rows: one ``op`` per id, full images, sequences from ``first_seq`` on."""
    rng = np.random.default_rng(seed)
    n = len(ids)
    id_arr = pa.array(ids.astype(np.int32))
    seq = np.arange(first_seq, first_seq + n, dtype=np.int64)
    when = pa.array(T0 + seq.astype("timedelta64[ms]"), pa.timestamp("us", tz="UTC"))
    after = pa.StructArray.from_arrays(
        [
            id_arr,
            pc.binary_join_element_wise(f"{op}-", pc.cast(id_arr, pa.string()), ""),
            pa.array(np.round(rng.uniform(0, 1000, n), 2)),
            pa.array(rng.integers(1, 100, n, dtype=np.int32)),
            pc.take(STATUSES, pa.array(rng.integers(0, len(STATUSES), n))),
            when,
        ],
        fields=list(IMAGE),
    )
    nulls = pa.nulls(n, IMAGE)
    before = (
        nulls
        if op == "c"
        else pa.StructArray.from_arrays(
            [id_arr, *[pa.nulls(n, f.type) for f in list(IMAGE)[1:]]], fields=list(IMAGE)
        )
    )
    return pa.table(
        [
            pa.array(np.full(n, op), pa.string()),
            pa.StructArray.from_arrays([id_arr], names=["id"]),
            before,
            after,
            pa.nulls(n, pa.list_(pa.string())),
            pc.utf8_lpad(pc.cast(pa.array(seq), pa.string()), SEQ_WIDTH, "0"),
            when,
            pa.array(np.full(n, np.datetime64(day, "D"))).cast(pa.date32()),
        ],
        schema=SCHEMA,
    )


def write_changes(warehouse: Path, data: pa.Table, day: str) -> None:
    uri = lake.TableRef(lake.CHANGELOG, SOURCE, TABLE).uri(warehouse)
    write_deltalake(
        uri, data, partition_by=[lake.PARTITION_COLUMN], mode="overwrite",
        predicate=f"{lake.PARTITION_COLUMN} = '{day}'" if lake.exists(uri) else None,
        commit_properties=lake.properties(lake.TableState(key=["id"])),
    )  # fmt: skip


def changed_ids(rows: int, changed: int, dist: str, seed: int) -> np.ndarray:
    if dist == "uniform":
        return np.sort(np.random.default_rng(seed).choice(rows, changed, replace=False))
    return np.arange(rows - changed, rows)


# Timers around the internal calls, installed at run time (cdc_platform is not changed).
CALLS: dict[str, float] = {}
LAST_METRICS: dict = {}


def _timed(owner, name: str, label: str) -> None:
    fn = getattr(owner, name)

    @wraps(fn)
    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            out = fn(*a, **kw)
        finally:
            CALLS[label] = CALLS.get(label, 0.0) + time.perf_counter() - t
        if name == "upsert_newer":
            LAST_METRICS.clear()
            LAST_METRICS.update(out)
        return out

    setattr(owner, name, wrapper)


def install_timers() -> None:
    _timed(lake, "upsert_newer", "merge (Spark)")
    _timed(lake, "replace", "write (replace)")
    _timed(merge_step, "_counts", "live counts (Spark)")
    _timed(merge_step, "_live_effect", "live effect (Spark)")


def file_layout(uri: str) -> dict:
    """Files, bytes and how much of the key range a file's min/max covers on average."""
    adds = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pydict()
    n = len(adds["path"])
    lo, hi = adds.get("min.id"), adds.get("max.id")
    span = None
    if lo and hi and n:
        full = max(hi) - min(lo) + 1
        span = sum((b - a + 1) / full for a, b in zip(lo, hi, strict=True)) / n
    return {"files": n, "bytes": sum(adds["size_bytes"]), "mean_key_span": span}


def files_diff(uri: str, before: int) -> dict:
    dt_old, dt_new = DeltaTable(uri, version=before), DeltaTable(uri)
    a_old = pa.table(dt_old.get_add_actions(flatten=True)).to_pydict()
    a_new = pa.table(dt_new.get_add_actions(flatten=True)).to_pydict()
    old = dict(zip(a_old["path"], a_old["size_bytes"], strict=True))
    new = dict(zip(a_new["path"], a_new["size_bytes"], strict=True))
    removed = [p for p in old if p not in new]
    added = [p for p in new if p not in old]
    return {
        "files_removed": len(removed),
        "bytes_removed": sum(old[p] for p in removed),
        "files_added": len(added),
        "bytes_added": sum(new[p] for p in added),
        "files_total_before": len(old),
        "bytes_total_before": sum(old.values()),
        # Merge-on-read: the deletion vector files it wrote (the base has none).
        "dv_bytes": sum(p.stat().st_size for p in Path(uri).glob("deletion_vector_*.bin")),
    }


def load() -> str:
    return "{:.2f}/{:.2f}/{:.2f}".format(*os.getloadavg())


def run(label: str, fn) -> dict:
    CALLS.clear()
    LAST_METRICS.clear()
    la = load()
    t = time.perf_counter()
    cpu = cpu_seconds()
    result = fn()
    wall = time.perf_counter() - t
    cpu_s = cpu_seconds() - cpu
    inner = ", ".join(f"{k} {v:.1f}s" for k, v in CALLS.items())
    print(f"  {label}: {wall:.1f}s wall, {cpu_s:.1f}s CPU (load {la}); {inner}", flush=True)
    print(f"    result: {result}", flush=True)
    return {"wall": wall, "cpu": cpu_s, "load": la, "calls": dict(CALLS)}


def human(b: float) -> str:
    return f"{b / 2**20:,.0f} MiB"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--changed", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dist", default="uniform,clustered")
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark conf, e.g. spark.driver.memory=8g",
    )
    p.add_argument("--out", type=Path, help="kept (default: a temp dir, removed at the end)")
    p.add_argument("--skip-refresh", action="store_true", help="do not time full_refresh=True")
    args = p.parse_args()

    out = args.out or Path(tempfile.mkdtemp(prefix="bench-merge-"))
    if args.out is None:  # gigabytes at 10M rows: gone when the script ends
        atexit.register(shutil.rmtree, out, ignore_errors=True)
    base = out / "base"
    shutil.rmtree(out / "base", ignore_errors=True)
    print(f"cores {os.cpu_count()}, load {load()}, out {out}", flush=True)

    t = time.perf_counter()
    inserts = changes(np.arange(args.rows), "c", 1, DAY1, seed=1)
    write_changes(base, inserts, DAY1)
    cl_uri = lake.TableRef(lake.CHANGELOG, SOURCE, TABLE).uri(base)
    print(
        f"change log: {args.rows:,} inserts, {file_layout(cl_uri)['files']} files, "
        f"{human(file_layout(cl_uri)['bytes'])} (generated and written in "
        f"{time.perf_counter() - t:.1f}s, not timed)",
        flush=True,
    )
    del inserts

    t = time.perf_counter()
    spark = get_spark("local[2]", dict(c.split("=", 1) for c in args.conf))
    spark.range(1).count()
    print(f"Spark session: {time.perf_counter() - t:.1f}s (not timed)", flush=True)
    install_timers()
    cur_uri = lake.TableRef(lake.CURRENT, SOURCE, TABLE).uri(base)

    def build():
        shutil.rmtree(cur_uri, ignore_errors=True)
        return merge_current(spark, base, SOURCE, TABLE)

    refreshes = []
    if not args.skip_refresh:
        print("full rebuild (merge_current full_refresh=True):", flush=True)
        refreshes = [
            run(
                f"full_refresh #{i + 1}",
                lambda: merge_current(spark, base, SOURCE, TABLE, full_refresh=True),
            )
            for i in range(args.repeat)
        ]
    # The last build is the base of the incremental merges.
    print("full rebuild (merge_current into an empty current table):", flush=True)
    rebuilds = [run(f"build #{i + 1}", build) for i in range(args.repeat)]
    layout = file_layout(cur_uri)
    print(
        f"  current table: {layout['files']} files, {human(layout['bytes'])}, a file's min/max "
        f"covers {layout['mean_key_span']:.1%} of the key range on average",
        flush=True,
    )
    base_version = lake.version(cur_uri)

    merges: dict[str, list[dict]] = {}
    for dist in args.dist.split(","):
        ids = changed_ids(args.rows, args.changed, dist, seed=2)
        batch = changes(ids, "u", args.rows + 1, DAY2, seed=3)
        print(f"incremental merge, {len(ids):,} {dist} keys (ids {ids[0]}..{ids[-1]}):", flush=True)
        merges[dist] = []
        for i in range(args.repeat):
            wh = out / dist
            shutil.rmtree(wh, ignore_errors=True)
            shutil.copytree(base, wh)
            write_changes(wh, batch, DAY2)
            uri = lake.TableRef(lake.CURRENT, SOURCE, TABLE).uri(wh)
            r = run(f"{dist} #{i + 1}", lambda wh=wh: merge_current(spark, wh, SOURCE, TABLE))
            r["metrics"] = dict(LAST_METRICS)
            r["files"] = files_diff(uri, base_version)
            m, f = r["metrics"], r["files"]
            print(
                "    merge: rows updated {} inserted {}".format(
                    m.get("num_target_rows_updated"), m.get("num_target_rows_inserted")
                ),
                flush=True,
            )
            print(
                f"    log: {f['files_removed']}/{f['files_total_before']} files removed "
                f"({human(f['bytes_removed'])} of {human(f['bytes_total_before'])}), "
                f"{f['files_added']} added ({human(f['bytes_added'])}), deletion vectors "
                f"{f['dv_bytes']:,} bytes",
                flush=True,
            )
            merges[dist].append(r)
            layout = file_layout(uri)
            print(
                f"    after: {layout['files']} files, mean min/max span "
                f"{layout['mean_key_span']:.1%} of the key range",
                flush=True,
            )

    def med(runs: list[dict], what: str = "wall") -> float:
        return statistics.median(r[what] for r in runs)

    print(f"\nsummary: medians of {args.repeat} runs, wall seconds (CPU seconds)")
    full, full_cpu = med(rebuilds), med(rebuilds, "cpu")
    print(f"  full rebuild (empty table)  {full:7.1f} ({full_cpu:.1f})  loads {_loads(rebuilds)}")
    if refreshes:
        print(
            f"  full rebuild (full_refresh) {med(refreshes):7.1f} ({med(refreshes, 'cpu'):.1f})  "
            f"loads {_loads(refreshes)}"
        )
    for dist, runs in merges.items():
        w, c = med(runs), med(runs, "cpu")
        rewritten = statistics.median(r["files"]["bytes_removed"] for r in runs)
        total = runs[0]["files"]["bytes_total_before"]
        wrote = statistics.median(r["files"]["bytes_added"] + r["files"]["dv_bytes"] for r in runs)
        print(
            f"  incremental, {dist:9s}      {w:7.1f} ({c:.1f}) = {w / full:.1%} of the rebuild "
            f"wall ({c / full_cpu:.1%} CPU); rewrote {rewritten / total:.1%} of the bytes, "
            f"wrote {human(wrote)} (deletion vectors included); loads {_loads(runs)}"
        )


def _loads(runs: list[dict]) -> str:
    return ", ".join(r["load"].split("/")[0] for r in runs)


if __name__ == "__main__":
    main()
