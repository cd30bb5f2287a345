"""Throughput per wire format: one logical change stream, encoded in each format, replayed.

Generates one change stream (inserts, updates, about 10% deletes; columns id int, name string,
amount double, updated_at bigint; fixed seed) and writes it in every format to its own landing
file (not timed). Then, in one process and one SparkSession:

- **parse**: each format's landing file ingested to raw (not timed), then its raw rows parsed by
  the named format and by ``auto``, every parsed column computed (a ``noop`` write), ``--reps``
  times each, alternating. Reported: events per CPU second (this process and its descendants:
  the Spark JVM and its Python workers, so the figure is per core and hardly moved by other work
  on the machine), wall seconds, and the ratio of auto's CPU time to the named format's. Both
  must parse every message into the same records (kinds and row changes counted).
- **pipeline** (``--no-pipeline`` skips it): raw ingest, normalize and merge per format into a
  fresh warehouse, with the format named and then with ``auto`` on the same file, the current
  table checked against the stream's final state (row count and a checksum of (id, name,
  amount)). Wall and CPU seconds, events/s (wall) and per core (CPU), and auto/named CPU.

    .venv/bin/python bench/formats.py [--events N] [--keys K] [--out DIR] [--formats a,b]
                                      [--reps R] [--no-pipeline]
"""

import argparse
import atexit
import base64
import io
import json
import os
import random
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import fastavro
from throughput import cpu_seconds  # bench/ is the script's folder, on sys.path

from cdc_platform import formats as registry
from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.formats import dts_avro
from cdc_platform.spark.session import get_spark
from cdc_platform.steps.changelog import normalize_source
from cdc_platform.steps.current import current_rows, merge_current
from cdc_platform.steps.raw import ingest_files

SOURCE = "bench"
DATE = "2026-01-01"
TYPES = {"id": "int", "name": "string", "amount": "double", "updated_at": "bigint"}
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms
COLS = ("id", "name", "amount", "updated_at")

# (index, op c/u/d, key, before image or None, after image or None)
Event = tuple[int, str, int, dict | None, dict | None]


def stream(events: int, keys: int) -> tuple[list[Event], dict[int, dict]]:
    """The change stream and its final state; a live key is deleted with probability 1/9."""
    rng = random.Random(42)
    live: dict[int, dict] = {}
    out: list[Event] = []
    for i in range(events):
        k = rng.randrange(keys)
        before = live.get(k)
        if before is not None and rng.random() < 1 / 9:
            out.append((i, "d", k, before, None))
            del live[k]
            continue
        amount = round(rng.uniform(0, 10_000), 2)
        after = live[k] = {"id": k, "name": f"customer-{k}-{i % 97}", "amount": amount,
                           "updated_at": T0 + i}  # fmt: skip
        out.append((i, "u" if before else "c", k, before, after))
    return out, live


def checksum(rows: Iterator[tuple]) -> tuple[int, int]:
    """(row count, order-independent checksum of (id, name, amount))."""
    n = total = 0
    for id_, name, amount in rows:
        n += 1
        total += zlib.crc32(f"{id_}|{name}|{float(amount)!r}".encode())
    return n, total


def _j(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _text(img: dict | None) -> dict | None:
    """All values as strings (formats whose values are text)."""
    return None if img is None else {c: str(v) for c, v in img.items()}


# --- one encoder per format: Event -> landing lines ---------------------------------------------


def debezium(e: Event) -> Iterator[str]:
    i, op, _, before, after = e
    source = {"version": "2.7.3.Final", "connector": "mysql", "name": "bench", "ts_ms": T0 + i,
              "snapshot": "false", "db": "inventory", "table": "orders", "server_id": 223344,
              "file": "mysql-bin.000003", "pos": 154 + 400 * i, "row": 0}  # fmt: skip
    yield _j({"before": before, "after": after, "source": source, "op": op, "ts_ms": T0 + i + 3})


_DEBEZIUM_FIELDS = [
    {"field": "id", "type": "int32", "optional": False},
    {"field": "name", "type": "string", "optional": True},
    {"field": "amount", "type": "bytes", "optional": True,
     "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "2", "connect.decimal.precision": "10"}},
    {"field": "updated_at", "type": "int64", "optional": True},
]  # fmt: skip
_DEBEZIUM_IMAGE = {"type": "struct", "fields": _DEBEZIUM_FIELDS, "optional": True}
_DEBEZIUM_SCHEMA = {"type": "struct", "name": "bench.inventory.orders.Envelope", "fields": [
    {**_DEBEZIUM_IMAGE, "field": "before"}, {**_DEBEZIUM_IMAGE, "field": "after"},
    {"type": "struct", "field": "source", "fields": []}, {"type": "string", "field": "op"},
]}  # fmt: skip


def _decimal_image(img: dict | None) -> dict | None:
    """``amount`` as Kafka Connect writes a Decimal by default: base64 of the unscaled value."""
    if img is None:
        return None
    cents = round(img["amount"] * 100)
    raw = cents.to_bytes(max(1, (cents.bit_length() + 8) // 8), "big", signed=True)
    return {**img, "amount": base64.b64encode(raw).decode()}


def debezium_schema(e: Event) -> Iterator[str]:
    """Debezium as Kafka Connect's JsonConverter writes it by default (schemas.enable): the
    schema envelope, and the amount a Connect Decimal."""
    i, op, _, before, after = e
    line = next(debezium((i, op, _, _decimal_image(before), _decimal_image(after))))
    yield '{"schema":' + _j(_DEBEZIUM_SCHEMA) + ',"payload":' + line + "}"


def debezium_numeric(e: Event) -> Iterator[str]:
    """The same with the JsonConverter's ``decimal.format=NUMERIC``: the Decimal a JSON number."""
    yield '{"schema":' + _j(_DEBEZIUM_SCHEMA) + ',"payload":' + next(debezium(e)) + "}"


def lindorm(e: Event) -> Iterator[str]:
    i, op, _, before, after = e
    source = {"version": "v1.0", "db": "ld-bench", "namespace": "default", "table": "orders",
              "ts_ms": T0 + i}  # fmt: skip
    payload = {"op": op, "ts_ms": T0 + i + 3, "before": _text(before), "after": _text(after),
               "source": source}  # fmt: skip
    yield _j({"schema": {}, "payload": payload})


DW_TYPES = {"id": "LONG", "name": "STRING", "amount": "DOUBLE", "updated_at": "LONG"}
DW_COLUMNS = [{"name": c, "type": t} for c, t in DW_TYPES.items()]


def dataworks(e: Event) -> Iterator[str]:
    i, op, _, before, after = e
    payload = {
        "before": {"dataColumn": before} if before else None,
        "after": {"dataColumn": after} if after else None,
        "sequenceId": str(1000 + i),
        "timestamp": {"eventTime": T0 + i, "systemTime": T0 + i + 5, "checkpointTime": -1},
        "op": {"c": "INSERT", "u": "UPDATE_AFTER", "d": "DELETE"}[op],  # one update message
        "ddl": None,
    }
    source = {"dbType": "MySQL", "dbName": "inventory", "tableName": "orders"}
    schema = {"dataColumn": DW_COLUMNS, "primaryKey": ["id"], "source": source}
    yield _j({"schema": schema, "payload": payload, "version": "0.0.1"})


def datahub_tuple(e: Event) -> Iterator[str]:
    i, op, _, before, after = e
    meta = {"_sequence_id_": str(1000 + i), "_excute_time_": T0 + i,
            "_source_table_": "inventory.orders"}  # fmt: skip
    if op == "c":
        yield _j({**meta, "_operation_type_": "I", "_before_image_": "N", "_after_image_": "Y",
                  **after})  # fmt: skip
    elif op == "d":
        yield _j({**meta, "_operation_type_": "D", "_before_image_": "Y", "_after_image_": "N",
                  **before})  # fmt: skip
    else:  # two records sharing _sequence_id_
        yield _j({**meta, "_operation_type_": "U", "_before_image_": "Y", "_after_image_": "N",
                  **before})  # fmt: skip
        yield _j({**meta, "_operation_type_": "U", "_before_image_": "N", "_after_image_": "Y",
                  **after})  # fmt: skip


NS = "com.alibaba.dts.formats.avro."
AVRO_SCHEMA = dts_avro.parsed_schema()
AVRO_FIELDS = [{"name": "id", "dataTypeNumber": 3}, {"name": "name", "dataTypeNumber": 253},
               {"name": "amount", "dataTypeNumber": 5},
               {"name": "updated_at", "dataTypeNumber": 8}]  # fmt: skip


def _avro_image(img: dict | None) -> list | None:
    if img is None:
        return None
    return [
        (NS + "Integer", {"precision": 11, "value": str(img["id"])}),
        (NS + "Character", {"charset": "utf8mb4", "value": img["name"].encode()}),
        (NS + "Float", {"value": img["amount"], "precision": 22, "scale": 0}),
        (NS + "Integer", {"precision": 20, "value": str(img["updated_at"])}),
    ]


def dts_record(
    i: int, op: str, table: str, fields: list, before: list | None, after: list | None,
    born: int | None = None,
) -> bytes:  # fmt: skip
    """Event ``i`` as one DTS Avro Record: a MySQL row change of ``inventory.<table>``, keyed by
    ``id``, with ``fields`` and the two images (lists of union values); ``born``: the
    ``bornTimestamp`` (default: the source timestamp, in seconds)."""
    ts = (T0 + i) // 1000
    rec = {
        "version": 0, "id": 1000 + i, "sourceTimestamp": ts,
        "sourcePosition": f"{4000 + i * 100}@3", "safeSourcePosition": f"{4000 + i * 100}@3",
        "sourceTxid": "0", "source": {"sourceType": "MySQL", "version": "8.0.28"},
        "operation": {"c": "INSERT", "u": "UPDATE", "d": "DELETE"}[op],
        "objectName": f"inventory.{table}", "processTimestamps": None,
        "tags": {"pk_uk_info": '{"PRIMARY":["id"]}'}, "fields": fields,
        "beforeImages": before, "afterImages": after, "bornTimestamp": ts if born is None else born,
    }  # fmt: skip
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, AVRO_SCHEMA, rec)
    return buf.getvalue()


def dts_avro_(e: Event) -> Iterator[str]:
    i, op, _, before, after = e
    value = dts_record(i, op, "orders", AVRO_FIELDS, _avro_image(before), _avro_image(after))
    env = {"topic": "dts", "partition": 0, "offset": i, "timestamp": T0 + i,
           "value_b64": base64.b64encode(value).decode()}  # fmt: skip
    yield _j(env)


def shareplex(e: Event) -> Iterator[str]:
    i, op, k, before, after = e
    meta = {"time": "2026-01-01T00:00:00", "userid": 84, "op": {"c": "ins", "u": "upd",
            "d": "del"}[op], "scn": str(100_000 + i), "rowid": f"AAATGpAAIAA{k:07d}",
            "trans": f"5.1.{100_000 + i}", "seq": 1, "size": 1, "table": "INVENTORY.ORDERS",
            "idx": "1/1", "posttime": "2026-01-01T00:00:05"}  # fmt: skip
    if op == "c":  # inserts carry no key
        yield _j({"meta": meta, "data": _text(after)})
    elif op == "d":
        yield _j({"meta": meta, "data": _text(before), "key": {"id": str(k)}})
    else:  # only the changed columns
        changed = {c: str(v) for c, v in after.items() if before[c] != v}
        yield _j({"meta": meta, "data": changed, "key": {"id": str(k)}})


CANAL_TYPES = {"id": "int(11)", "name": "varchar(255)", "amount": "double",
               "updated_at": "bigint(20)"}  # fmt: skip


def canal(e: Event) -> Iterator[str]:
    i, op, _, before, after = e
    old = None
    if op == "u":
        old = [{c: str(v) for c, v in before.items() if after[c] != v}]
    es = T0 + i
    yield _j({"data": [_text(after or before)], "database": "inventory", "es": es, "id": i,
              "isDdl": False, "mysqlType": CANAL_TYPES, "old": old, "pkNames": ["id"],
              "sql": "", "table": "orders", "ts": es + 500,
              "type": {"c": "INSERT", "u": "UPDATE", "d": "DELETE"}[op]})  # fmt: skip


def maxwell(e: Event) -> Iterator[str]:
    i, op, _, before, after = e
    m = {"database": "inventory", "table": "orders",
         "type": {"c": "insert", "u": "update", "d": "delete"}[op], "ts": (T0 + i) // 1000,
         "xid": 5000 + i, "commit": True, "data": after or before,
         "primary_key_columns": ["id"]}  # fmt: skip
    if op == "u":
        m["old"] = {c: v for c, v in before.items() if after[c] != v}
    yield _j(m)


def ogg(e: Event) -> Iterator[str]:
    i, op, _, before, after = e
    ms = i % 1000
    m = {"table": "INVENTORY.ORDERS", "op_type": {"c": "I", "u": "U", "d": "D"}[op],
         "op_ts": f"2026-01-01 00:{i // 60000 % 60:02d}:{i // 1000 % 60:02d}.{ms:03d}000",
         "current_ts": "2026-01-01T01:00:00.000000", "pos": f"{i:020d}",
         "primary_keys": ["id"]}  # fmt: skip
    if before:
        m["before"] = before
    if after:
        m["after"] = after
    yield _j(m)


ENCODERS: dict[str, tuple[Callable[[Event], Iterator[str]], str]] = {
    "debezium": (debezium, ".jsonl"),
    "debezium-schema": (debezium_schema, ".jsonl"),
    "debezium-numeric": (debezium_numeric, ".jsonl"),
    "lindorm": (lindorm, ".jsonl"),
    "dataworks": (dataworks, ".jsonl"),
    "datahub-tuple": (datahub_tuple, ".jsonl"),
    "dts-avro": (dts_avro_, ".kafka.jsonl"),
    "shareplex": (shareplex, ".jsonl"),
    "canal": (canal, ".jsonl"),
    "maxwell": (maxwell, ".jsonl"),
    "ogg": (ogg, ".jsonl"),
}


# Encodings of one format: the parser that reads them.
PARSER = {"debezium-schema": "debezium", "debezium-numeric": "debezium"}
# Encodings whose messages carry their column types (the catalog declares none for them).
SELF_TYPED = {"debezium-schema", "debezium-numeric"}


def encode(fmt: str, events: list[Event], out: Path) -> Path:
    encoder, suffix = ENCODERS[fmt]
    path = out / "landing" / fmt / f"events{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for e in events:
            for line in encoder(e):
                f.write(line + "\n")
    return path


def run(
    spark, out: Path, encoding: str, parser: str, path: Path, expected: tuple[int, int]
) -> dict:
    """``encoding``'s file through ingest, normalize and merge with ``parser``, into a fresh
    warehouse; times and the check."""
    fmt = PARSER.get(parser, parser)
    types = {} if encoding in SELF_TYPED else TYPES
    warehouse = out / f"warehouse-{encoding}-{parser}"
    shutil.rmtree(warehouse, ignore_errors=True)
    source = SourceConfig(name=SOURCE, format=fmt, primary_key=["id"], column_types=types)
    t: dict[str, float] = {}
    cpu = cpu_seconds()
    start = time.perf_counter()
    ingest_files(warehouse, SOURCE, [(path, str(path.resolve()))], DATE, whole_date=True)
    t["ingest"] = time.perf_counter() - start
    start = time.perf_counter()
    result = normalize_source(spark, warehouse, source, [DATE])
    t["normalize"] = time.perf_counter() - start
    start = time.perf_counter()
    for table in result.tables:
        merge_current(spark, warehouse, SOURCE, table)
    t["merge"] = time.perf_counter() - start
    t["cpu"] = cpu_seconds() - cpu
    got: tuple[int, int] = (0, 0)
    if len(result.tables) == 1:
        cur = current_rows(spark, warehouse, SOURCE, next(iter(result.tables)))
        data = cur.select("id", "name", "amount").toArrow().to_pydict()
        got = checksum(zip(data["id"], data["name"], data["amount"], strict=True))
    t["total"] = t["ingest"] + t["normalize"] + t["merge"]
    ok = got == expected and result.quarantined == 0
    note = "" if ok else f" (rows {got[0]} vs {expected[0]}, quarantined {result.quarantined}"
    note += f", tables {list(result.tables)})" if note else ""
    return {**t, "check": ("OK" if ok else "MISMATCH") + note}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _parsed(raw, parser: str):
    return registry.parser_for(parser).parse(raw, {})


def _summary(raw, parser: str) -> dict:
    """What a parse produced: records per kind and source format (untimed)."""
    rows = _parsed(raw, parser).groupBy("kind", "source_format").count().collect()
    return {(r["kind"], r["source_format"]): r["count"] for r in rows}


def parse_stage(spark, out: Path, fmt: str, path: Path, reps: int) -> dict:
    """Parse the raw rows of ``fmt``'s landing file with ``fmt`` and with ``auto``: the median
    wall and CPU seconds of ``reps`` alternating runs each, and whether both agree."""
    warehouse = out / f"warehouse-parse-{fmt}"
    shutil.rmtree(warehouse, ignore_errors=True)
    ingest_files(warehouse, SOURCE, [(path, str(path.resolve()))], DATE, whole_date=True)
    raw = lake.read(spark, lake.TableRef(lake.RAW, SOURCE).uri(warehouse))
    named_parser = PARSER.get(fmt, fmt)
    times: dict[str, list[tuple[float, float]]] = {named_parser: [], "auto": []}
    for _ in range(reps):
        for parser in (named_parser, "auto"):
            start, cpu = time.perf_counter(), cpu_seconds()
            _parsed(raw, parser).write.format("noop").mode("overwrite").save()
            times[parser].append((time.perf_counter() - start, cpu_seconds() - cpu))
    named, auto = _summary(raw, named_parser), _summary(raw, "auto")
    errors = sum(n for (kind, _), n in named.items() if kind == "error")
    check = "OK" if named == auto and not errors else f"DIFFER: {fmt} {named} auto {auto}"
    result = {"check": check}
    for parser, label in ((named_parser, "named"), ("auto", "auto")):
        result[label] = {
            "wall": _median([w for w, _ in times[parser]]),
            "cpu": _median([c for _, c in times[parser]]),
        }
    return result


def print_parse_table(results: dict[str, dict], events: int) -> None:
    print(
        "\n| format | events | named CPU s | named events/s/core | auto CPU s | "
        "auto events/s/core | auto/named CPU | named wall s | auto wall s | check |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for fmt, r in results.items():
        n, a = r["named"], r["auto"]
        print(f"| {fmt} | {events:,} | {n['cpu']:.1f} | {events / n['cpu']:,.0f} | "
              f"{a['cpu']:.1f} | {events / a['cpu']:,.0f} | {a['cpu'] / n['cpu']:.2f} | "
              f"{n['wall']:.1f} | {a['wall']:.1f} | {r['check']} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=20_000)
    ap.add_argument("--out", type=Path, help="kept (default: a temp dir, removed at the end)")
    ap.add_argument("--formats", default=",".join(ENCODERS), help="comma list")
    ap.add_argument("--reps", type=int, default=3, help="parse runs per format and parser")
    ap.add_argument(
        "--pipeline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time ingest, normalize and merge per format",
    )
    args = ap.parse_args()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = [f for f in formats if f not in ENCODERS]
    if unknown:
        raise SystemExit(f"unknown formats: {unknown}; known: {list(ENCODERS)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="cdc-bench-formats-", dir="/tmp"))
    if args.out is None:  # gigabytes at 10M rows: gone when the script ends
        atexit.register(shutil.rmtree, out, ignore_errors=True)

    events, final = stream(args.events, args.keys)
    expected = checksum((r["id"], r["name"], r["amount"]) for r in final.values())
    ops = {op: sum(1 for e in events if e[1] == op) for op in "cud"}
    print(f"{args.events:,} events over {args.keys:,} keys, ops {ops}, {expected[0]:,} live rows")
    paths = {}
    for fmt in formats:
        paths[fmt] = encode(fmt, events, out)
        lines = sum(1 for _ in paths[fmt].open())
        print(f"  {fmt:<14} {lines:>9,} messages {paths[fmt].stat().st_size / 1e6:>7.1f} MB")

    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    start = time.perf_counter()
    spark = get_spark()
    print(f"spark start: {time.perf_counter() - start:.1f} s")
    # warm-up (not reported): JIT and first-use costs would otherwise land on the first format
    first = formats[0]
    small = encode(first, events[:1000], out / "warmup")
    warm = run(spark, out / "warmup", first, first, small, (0, 0))["total"]
    print(f"warm-up ({first}, 1,000 events, not reported): {warm:.1f} s")

    print(f"\nparse: {args.reps} runs each of the named format and auto, medians")
    parsed = {}
    for fmt in formats:
        small = encode(fmt, events[:1000], out / "warmup")
        parse_stage(spark, out / "warmup", fmt, small, 1)  # compiles the plans: not reported
        parsed[fmt] = r = parse_stage(spark, out, fmt, paths[fmt], args.reps)
        print(f"  {fmt}: {r['named']['cpu']:.1f} s CPU, auto {r['auto']['cpu']:.1f} s CPU, "
              f"{r['check']}", flush=True)  # fmt: skip
    print_parse_table(parsed, args.events)
    print(f"\nload average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not args.pipeline:
        if any(r["check"] != "OK" for r in parsed.values()):
            raise SystemExit(1)
        return

    print("\npipeline: each format's file replayed with the format named, then with auto")
    rows = []
    for fmt in formats:
        for label, parser in ((fmt, fmt), (f"auto ({fmt} file)", "auto")):
            r = run(spark, out, fmt, parser, paths[fmt], expected)
            rows.append((label, r))
            print(f"  {label}: {r['total']:.1f} s, {r['cpu']:.1f} s CPU, {r['check']}", flush=True)

    print("\n| format | events | ingest s | normalize s | merge s | total s | CPU s | events/s | "
          "events/s/core | auto/named CPU | check |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for i, (label, r) in enumerate(rows):
        ratio = f"{r['cpu'] / rows[i - 1][1]['cpu']:.2f}" if i % 2 else ""
        print(f"| {label} | {args.events:,} | {r['ingest']:.1f} | {r['normalize']:.1f} | "
              f"{r['merge']:.1f} | {r['total']:.1f} | {r['cpu']:.1f} | "
              f"{args.events / r['total']:,.0f} | {args.events / r['cpu']:,.0f} | {ratio} | "
              f"{r['check']} |")  # fmt: skip
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if any(not r["check"].startswith("OK") for _, r in rows) or any(
        r["check"] != "OK" for r in parsed.values()
    ):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
