"""Throughput of landing -> raw -> change log -> current, against the same job written plainly
in PySpark and against one DuckDB query.

Generates Debezium (MySQL connector) JSON change events into one landing file, runs the pipeline
steps in this process and times each (JVM start-up apart), then, in the same warm session, a
plain PySpark job (read the JSON with a declared schema, keep the newest row per key, drop
deletes, write Parquet), the medallion job a Spark user would write by hand for our outputs
(bronze: the raw lines as Parquet; silver: the typed change log; gold: the newest row per key
read back from silver, deletes dropped), then DuckDB; checks that all agree and prints the
numbers. Last, a replay of ``--small`` events into a new warehouse, timed with its Spark jobs
counted: the fixed cost a small file pays. Generation
is not timed, nor is a warm-up: both Spark jobs first run once on a small file (``--warm-up``
events), so that neither pays the JVM's first compilation of its code alone (before, the plain
job ran second and found the JSON reader and Parquet writer already compiled).

    .venv/bin/python bench/throughput.py [--events N] [--keys K] [--out DIR] [--with-schema]
                                         [--warm-up N] [--small N]
"""

import argparse
import atexit
import json
import os
import random
import shutil
import tempfile
import time
from contextlib import contextmanager
from functools import wraps
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet
from pyspark.sql.classic.dataframe import DataFrame

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.lake import data_files
from cdc_platform.normalize import split
from cdc_platform.spark import apply
from cdc_platform.spark.session import get_spark
from cdc_platform.steps.changelog import normalize_source
from cdc_platform.steps.current import current_rows, merge_current
from cdc_platform.steps.raw import ingest_files

SOURCE = "bench"
DATE = "2026-01-01"
TYPES = {"id": "int", "name": "string", "amount": "double", "updated_at": "bigint"}
RESULT_SCHEMA = pa.schema(
    [
        ("id", pa.int32()),
        ("name", pa.string()),
        ("amount", pa.float64()),
        ("updated_at", pa.int64()),
    ]
)
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms


def _fields(*spec: tuple[str, str, bool]) -> list[dict]:
    return [{"type": t, "optional": o, "field": f} for f, t, o in spec]


_ROW = _fields(("id", "int32", False), ("name", "string", True), ("amount", "double", True),
               ("updated_at", "int64", True))  # fmt: skip
_SOURCE = _fields(
    ("version", "string", False), ("connector", "string", False), ("name", "string", False),
    ("ts_ms", "int64", False), ("snapshot", "string", True), ("db", "string", False),
    ("sequence", "string", True), ("table", "string", True), ("server_id", "int64", False),
    ("gtid", "string", True), ("file", "string", False), ("pos", "int64", False),
    ("row", "int32", False), ("thread", "int64", True), ("query", "string", True),
)  # fmt: skip
_IMAGE = {"type": "struct", "optional": True, "name": "bench.inventory.orders.Value"}
SCHEMA = {
    "type": "struct",
    "optional": False,
    "name": "bench.inventory.orders.Envelope",
    "fields": [
        {**_IMAGE, "fields": _ROW, "field": "before"},
        {**_IMAGE, "fields": _ROW, "field": "after"},
        {"type": "struct", "fields": _SOURCE, "optional": False,
         "name": "io.debezium.connector.mysql.Source", "field": "source"},
        *_fields(("op", "string", False), ("ts_ms", "int64", True)),
    ],
}  # fmt: skip


def generate(path: Path, events: int, keys: int, with_schema: bool) -> dict[str, int]:
    """Write the events; about 10% deletes (a live key is deleted with probability 1/9)."""
    rng = random.Random(42)
    live: dict[int, dict] = {}
    ops = {"c": 0, "u": 0, "d": 0}
    head, tail = (
        ('{"schema":' + json.dumps(SCHEMA) + ',"payload":', "}") if with_schema else ("", "")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for i in range(events):
            k = rng.randrange(keys)
            before = live.get(k)
            ts = T0 + i
            if before is not None and rng.random() < 1 / 9:
                op, after = "d", None
                del live[k]
            else:
                op = "u" if before else "c"
                amount = round(rng.uniform(0, 10_000), 2)
                after = live[k] = {"id": k, "name": f"customer-{k}-{i % 97}", "amount": amount,
                                   "updated_at": ts}  # fmt: skip
            ops[op] += 1
            source = {"version": "2.7.3.Final", "connector": "mysql", "name": "bench",
                      "ts_ms": ts, "snapshot": "false", "db": "inventory", "sequence": None,
                      "table": "orders", "server_id": 223344, "gtid": None,
                      "file": "mysql-bin.000003", "pos": 154 + 400 * i, "row": 0,
                      "thread": 7, "query": None}  # fmt: skip
            payload = {"before": before, "after": after, "source": source, "op": op,
                       "ts_ms": ts + 3, "transaction": None}  # fmt: skip
            out.write(head + json.dumps(payload, separators=(",", ":")) + tail + "\n")
    return ops


_IMG = "STRUCT(id INTEGER, name VARCHAR, amount DOUBLE, updated_at BIGINT)"
_SRC = 'STRUCT(pos BIGINT, "row" INTEGER)'
_ENV = f"STRUCT(before {_IMG}, after {_IMG}, op VARCHAR, source {_SRC})"
DUCKDB_SQL = """
WITH e AS (SELECT {select} FROM read_json(?, format = 'newline_delimited', columns = {columns})),
latest AS (
    SELECT arg_max({{'op': op, 'img': after}}, (source.pos, source."row")) AS n
    FROM e GROUP BY CASE WHEN op = 'd' THEN before.id ELSE after.id END
)
SELECT n.img.id, n.img.name, n.img.amount, n.img.updated_at FROM latest WHERE n.op <> 'd'
"""


def plain_pyspark(spark, path: Path, with_schema: bool, out: Path) -> None:
    """The job a user would write by hand: declared schema, newest row per key, no deletes."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    image = T.StructType(
        [T.StructField("id", T.IntegerType()), T.StructField("name", T.StringType()),
         T.StructField("amount", T.DoubleType()), T.StructField("updated_at", T.LongType())]
    )  # fmt: skip
    envelope = T.StructType(
        [T.StructField("before", image), T.StructField("after", image),
         T.StructField("op", T.StringType()),
         T.StructField("source", T.StructType([T.StructField("pos", T.LongType()),
                                                T.StructField("row", T.IntegerType())]))]
    )  # fmt: skip
    schema = T.StructType([T.StructField("payload", envelope)]) if with_schema else envelope
    events = spark.read.schema(schema).json(str(path))
    if with_schema:
        events = events.select("payload.*")
    key = F.when(F.col("op") == "d", F.col("before.id")).otherwise(F.col("after.id"))
    newest = events.groupBy(key.alias("k")).agg(
        F.max_by(F.struct("op", "after"), F.struct("source.pos", "source.row")).alias("n")
    )
    newest.where(F.col("n.op") != "d").select("n.after.*").write.mode("overwrite").parquet(str(out))


def medallion_pyspark(spark, path: Path, with_schema: bool, out: Path) -> Path:
    """The job a user would write by hand for our outputs: bronze (the raw lines as Parquet),
    silver (the typed change log: op, key, sequence, event time, both images), gold (the newest
    row per key read back from silver, deletes dropped). Returns gold's folder."""
    from pyspark.sql import functions as F

    image = "struct<id:int,name:string,amount:double,updated_at:bigint>"
    source = "struct<ts_ms:bigint,pos:bigint,row:int>"
    envelope = f"struct<before:{image},after:{image},op:string,source:{source}>"
    schema = f"struct<payload:{envelope}>" if with_schema else envelope
    spark.read.text(str(path)).write.mode("overwrite").parquet(str(out / "bronze"))
    e = F.from_json("value", schema)
    e = e.payload if with_schema else e
    silver = spark.read.parquet(str(out / "bronze")).select(
        e.op.alias("op"),
        F.when(e.op == "d", e.before.id).otherwise(e.after.id).alias("id"),
        F.struct(e.source.pos.alias("pos"), e.source.row.alias("row")).alias("sequence"),
        F.timestamp_millis(e.source.ts_ms).alias("event_time"),
        e.before.alias("before"),
        e.after.alias("after"),
    )
    silver.write.mode("overwrite").parquet(str(out / "silver"))
    newest = (
        spark.read.parquet(str(out / "silver"))
        .groupBy("id")
        .agg(F.max_by(F.struct("op", "after"), "sequence").alias("n"))
    )
    gold = out / "gold"
    newest.where(F.col("n.op") != "d").select("n.after.*").write.mode("overwrite").parquet(
        str(gold)
    )
    return gold


def duckdb_current(path: Path, with_schema: bool) -> pa.Table:
    if with_schema:
        select, columns = "unnest(payload)", f"{{payload: '{_ENV}'}}"
    else:
        fields = {"before": _IMG, "after": _IMG, "op": "VARCHAR", "source": _SRC}
        select, columns = "*", "{" + ", ".join(f"{k}: '{v}'" for k, v in fields.items()) + "}"
    sql = DUCKDB_SQL.format(select=select, columns=columns)
    return duckdb.connect().sql(sql, params=[str(path)]).to_arrow_table()


class Probes:
    """Wall time of the outermost calls of a few pipeline internals, by stage (a poor man's
    profiler: nested calls are part of their caller's time)."""

    TARGETS = [(lake, "overwrite_partitions"), (lake, "upsert_newer"), (lake, "replace"),
               (lake.Staging, "keep"),
               (data_files, "write"), (split, "schema_groups"), (apply, "latest_truncate"),
               (DataFrame, "collect"), (DataFrame, "toArrow"), (DataFrame, "first"),
               (DataFrame, "count")]  # fmt: skip

    def __init__(self) -> None:
        self.stage = ""
        self.depth = 0
        self.spans: dict[str, dict[str, list[float]]] = {}
        for obj, name in self.TARGETS:
            label = f"{obj.__name__.rsplit('.', 1)[-1]}.{name}"
            setattr(obj, name, self._wrap(getattr(obj, name), label))

    def _wrap(self, fn, label: str):
        @wraps(fn)
        def timed(*args, **kwargs):
            self.depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    spans = self.spans.setdefault(self.stage, {})
                    spans.setdefault(label, []).append(time.perf_counter() - start)

        return timed


_SEEN: dict[int, int] = {}  # pid -> its CPU ticks at the last call
_TOTAL = [0]


def cpu_seconds() -> float:
    """CPU seconds of this process and its descendants (the Spark JVM and its Python workers)
    so far: unlike wall time, hardly affected by other work on the machine. A clock that never
    goes back: each call adds what each process of the tree used since the previous one (a
    descendant that ended within counts through its parent's cutime/cstime; one that has gone
    takes nothing away)."""
    children: dict[int, list[int]] = {}
    ticks_of: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            f = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        children.setdefault(int(f[1]), []).append(pid)
        ticks_of[pid] = sum(int(t) for t in f[11:15])  # utime, stime, cutime, cstime
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        ticks = ticks_of.get(pid, 0)
        _TOTAL[0] += max(0, ticks - _SEEN.get(pid, 0))
        _SEEN[pid] = ticks
        todo += children.get(pid, [])
    return _TOTAL[0] / os.sysconf("SC_CLK_TCK")


@contextmanager
def timed(times: dict[str, tuple[float, float]], stage: str, probes: Probes | None = None):
    """Record (wall seconds, CPU seconds) of the block as ``times[stage]``."""
    if probes:
        probes.stage = stage
    start, cpu = time.perf_counter(), cpu_seconds()
    try:
        yield
    finally:
        times[stage] = (time.perf_counter() - start, cpu_seconds() - cpu)
        if probes:
            probes.stage = ""


def check(ours: pa.Table, theirs: pa.Table) -> bool:
    ours, theirs = (t.cast(RESULT_SCHEMA).sort_by("id") for t in (ours, theirs))
    if ours.equals(theirs):
        print(f"check: OK, both give the same {ours.num_rows:,} live rows")
        return True
    a, b = (
        set(zip(*t.select(["id", "name", "amount"]).to_pydict().values(), strict=True))
        for t in (ours, theirs)
    )
    print(f"check: MISMATCH: ours {ours.num_rows:,} rows, DuckDB {theirs.num_rows:,} rows")
    print(f"  only ours: {len(a - b):,}, e.g. {sorted(a - b)[:3]}")
    print(f"  only DuckDB: {len(b - a):,}, e.g. {sorted(b - a)[:3]}")
    return False


def ours_job(spark, landing: Path, warehouse: Path, with_schema: bool, times=None, probes=None):
    """Ingest, normalize and merge ``landing`` (timed into ``times`` when given)."""
    times = {} if times is None else times
    with timed(times, "ingest", probes):
        ingest_files(warehouse, SOURCE, [(landing, str(landing))], DATE, whole_date=True)
    with timed(times, "normalize", probes):
        result = normalize_source(
            spark, warehouse,
            SourceConfig(name=SOURCE, format="debezium", primary_key=["id"],
                         column_types={} if with_schema else TYPES),
            [DATE],
        )  # fmt: skip
    table = next(iter(result.tables))
    with timed(times, "merge", probes):
        merged = merge_current(spark, warehouse, SOURCE, table)
    return result, table, merged


def small_replay(spark, out: Path, events: int, with_schema: bool):
    """A replay of ``events`` events into a new warehouse: its times by stage and its Spark jobs
    (the status tracker's, so a local session only)."""
    landing = out / "landing" / f"dt={DATE}" / "events.jsonl"
    generate(landing, events, max(1, events // 10), with_schema)
    spark.sparkContext.setJobGroup("small replay", "the small replay's jobs, counted")
    times: dict[str, tuple[float, float]] = {}
    try:
        ours_job(spark, landing, out / "warehouse", with_schema, times)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    return times, len(spark.sparkContext.statusTracker().getJobIdsForGroup("small replay"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--out", type=Path, help="kept (default: a temp dir, removed at the end)")
    ap.add_argument("--with-schema", action="store_true", help="JsonConverter schema envelope")
    ap.add_argument("--warm-up", type=int, default=50_000, help="events of the untimed first run")
    ap.add_argument("--small", type=int, default=1_000, help="events of the small replay")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="cdc-bench-", dir="/tmp"))
    if args.out is None:  # gigabytes at 10M rows: gone when the script ends
        atexit.register(shutil.rmtree, out, ignore_errors=True)
    landing = out / "landing" / SOURCE / f"dt={DATE}" / "events.jsonl"
    warehouse = out / "warehouse"
    shutil.rmtree(warehouse, ignore_errors=True)

    print(f"generating {args.events:,} events over {args.keys:,} keys -> {landing}")
    ops = generate(landing, args.events, args.keys, args.with_schema)
    size = landing.stat().st_size
    print(f"  ops {ops}, {size / 1e6:,.0f} MB, schema envelope: {args.with_schema}")

    print(f"  load average before the run: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    times: dict[str, tuple[float, float]] = {}
    with timed(times, "spark start"):
        spark = get_spark()
    if args.warm_up:
        small = out / "warm-up" / f"dt={DATE}" / "events.jsonl"
        generate(small, args.warm_up, max(1, args.keys * args.warm_up // args.events),
                 args.with_schema)  # fmt: skip
        with timed(times, "warm-up"):
            shutil.rmtree(out / "warm-up" / "warehouse", ignore_errors=True)
            ours_job(spark, small, out / "warm-up" / "warehouse", args.with_schema)
            plain_pyspark(spark, small, args.with_schema, out / "warm-up" / "plain")
            medallion_pyspark(spark, small, args.with_schema, out / "warm-up" / "medallion")
        took = times.pop("warm-up")[0]
        print(f"  warm-up ({args.warm_up:,} events, every Spark job, not timed): {took:.1f} s")
    probes = Probes()
    result, table, merged = ours_job(spark, landing, warehouse, args.with_schema, times, probes)
    print(f"  normalize: {result.tables[table].ops}, quarantined {result.quarantined}")
    print(f"  merge: {merged.rows:,} live rows, {merged.deleted_rows:,} tombstones")
    with timed(times, "plain pyspark"):
        plain_pyspark(spark, landing, args.with_schema, out / "plain")
    with timed(times, "medallion pyspark"):
        gold = medallion_pyspark(spark, landing, args.with_schema, out / "medallion")
    with timed(times, "duckdb"):
        theirs = duckdb_current(landing, args.with_schema)
    ok = check(current_rows(spark, warehouse, SOURCE, table).toArrow(), theirs)
    ok = check(pa.parquet.read_table(out / "plain"), theirs) and ok
    ok = check(pa.parquet.read_table(gold), theirs) and ok
    small_times, small_jobs = small_replay(spark, out / "small", args.small, args.with_schema)

    n = args.events
    ours = [sum(times[s][i] for s in ("ingest", "normalize", "merge")) for i in (0, 1)]
    print(f"\n{f'{n:,} events':<30}{'wall s':>8}{'CPU s':>8}{'events/s':>10}")
    for stage in ("spark start", "ingest", "normalize", "merge"):
        print(f"{stage:<30}{times[stage][0]:>8.2f}{times[stage][1]:>8.2f}")
        for label, spans in probes.spans.get(stage, {}).items():
            print(f"  {label:<28}{sum(spans):>8.2f}  ({len(spans)} calls)")
    cores = os.cpu_count() or 1
    rows = (("ours (without spark start)", ours), ("plain pyspark", times["plain pyspark"]),
            ("medallion pyspark", times["medallion pyspark"]),
            ("duckdb", times["duckdb"]))  # fmt: skip
    for name, (wall, cpu) in rows:
        per_core = n / wall / cores
        print(f"{name:<30}{wall:>8.2f}{cpu:>8.2f}{n / wall:>10,.0f}  ({per_core:,.0f}/core)")
    for other in ("plain pyspark", "medallion pyspark", "duckdb"):
        wall_ratio, cpu_ratio = (ours[i] / times[other][i] for i in (0, 1))
        print(f"ratio ours/{other}: {wall_ratio:.2f} wall, {cpu_ratio:.2f} CPU")
    wall, cpu = (sum(small_times[s][i] for s in ("ingest", "normalize", "merge")) for i in (0, 1))
    print(f"a replay of {args.small:,} events: {wall:.2f} s wall, {cpu:.2f} s CPU, "
          f"{small_jobs} Spark jobs")  # fmt: skip
    print("targets: ours/medallion pyspark <= 1.5; a 1,000-event replay <= 3 s")
    print(f"load average after the run: {os.getloadavg()[0]:.2f}")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
