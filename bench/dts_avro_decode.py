"""CPU cost of decoding DTS Avro in Python: ``dts_avro.parse_batches`` alone, no Spark.

Builds the change stream of ``bench/formats.py`` (its ``dts_avro_`` encoder: MySQL, four columns,
inserts, updates and deletes) and, with ``--wide``, a wider MySQL row of eleven columns of mixed
types (decimal, datetime, timestamp, date, blob, JSON, TIME...). The messages go into Arrow
batches of the raw schema, ``--batch`` rows each (Spark's default ``maxRecordsPerBatch``), and
``parse_batches`` runs over all of them ``--reps`` times. Reported: the median CPU time
(``time.process_time``: the machine may be shared) per message and messages per CPU second.
``--profile`` prints the top functions of one more run under cProfile instead.

    .venv/bin/python bench/dts_avro_decode.py [--events N] [--batch B] [--reps R] [--wide]
                                              [--profile]
"""

import argparse
import base64
import cProfile
import json
import pstats
import statistics
import time

import pyarrow as pa
from formats import (
    NS,
    T0,
    dts_avro_,
    dts_record,
    stream,
)  # bench/ is the script's folder, on sys.path

from cdc_platform.formats import dts_avro
from cdc_platform.ingest.landing import RAW_SCHEMA

WIDE_FIELDS = [
    ("id", 3), ("name", 253), ("balance", 246), ("created", 12), ("updated", 7),
    ("birthday", 10), ("avatar", 252), ("score", 5), ("flags", 1), ("doc", 245), ("wake", 11),
]  # fmt: skip


def _wide_image(i: int, k: int) -> list:
    return [
        (NS + "Integer", {"precision": 11, "value": str(k)}),
        (NS + "Character", {"charset": "utf8mb4", "value": f"customer-{k}-{i % 97}".encode()}),
        (NS + "Decimal", {"value": f"{i % 10_000}.{i % 100:02d}", "precision": 10, "scale": 2}),
        (NS + "DateTime", {"year": 2023, "month": 10, "day": 11, "hour": i % 24,
                           "minute": i % 60, "second": i % 60, "millis": i % 1_000_000}),
        (NS + "Timestamp", {"timestamp": (T0 + i) // 1000, "millis": i % 1_000_000}),
        (NS + "DateTime", {"year": 1990, "month": 2, "day": 1 + i % 28}),
        (NS + "BinaryObject", {"type": "BLOB", "value": b"\x00\xffpng" * (1 + i % 3)}),
        (NS + "Float", {"value": i / 7, "precision": 22, "scale": 0}),
        (NS + "Integer", {"precision": 1, "value": str(i % 2)}),
        (NS + "TextObject", {"type": "JSON", "value": f'{{"vip": {i % 2}}}'}),
        (NS + "DateTime", {"hour": i % 24, "minute": 59, "second": 59}),
    ]  # fmt: skip


def wide(i: int, op: str, k: int) -> bytes:
    """A MySQL row change of WIDE_FIELDS; updates carry both images."""
    before = _wide_image(i - 1, k) if op in ("u", "d") else None
    after = _wide_image(i, k) if op in ("c", "u") else None
    fields = [{"name": n, "dataTypeNumber": c} for n, c in WIDE_FIELDS]
    born = (T0 + i) // 1000 * 1000 + i % 1000  # in ms, within the source second
    return dts_record(i, op, "customers", fields, before, after, born)


def messages(events: int, keys: int, wide_rows: bool) -> list[bytes]:
    """The message values of the change stream (``formats.py``'s seed 42)."""
    out = []
    for i, op, k, before, after in stream(events, keys)[0]:
        if wide_rows:
            out.append(wide(i, op, k))
        else:
            env = json.loads(next(dts_avro_((i, op, k, before, after))))
            out.append(base64.b64decode(env["value_b64"]))
    return out


def batches(values: list[bytes], size: int) -> list[pa.RecordBatch]:
    """Raw-schema batches as ``mapInArrow`` hands them over (coordinates filled in)."""
    out = []
    for start in range(0, len(values), size):
        chunk = values[start : start + size]
        n = len(chunk)
        micros = RAW_SCHEMA.field("timestamp").type
        cols = {
            "ingest_date": pa.array([19_723] * n, pa.date32()),
            "topic": pa.array(["dts"] * n),
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(start, start + n), pa.int64()),
            "timestamp": pa.array(range(T0 * 1000 + start, T0 * 1000 + start + n), micros),
            "key": pa.array([None] * n, pa.binary()),
            "value": pa.array(chunk, pa.binary()),
            "headers": pa.array([None] * n, RAW_SCHEMA.field("headers").type),
            "file": pa.array(["landing/dts/events.kafka.jsonl"] * n),
            "line": pa.array(range(start + 1, start + n + 1), pa.int64()),
        }
        out.append(pa.RecordBatch.from_pydict(cols, schema=RAW_SCHEMA))
    return out


def run(raw: list[pa.RecordBatch]) -> float:
    """CPU seconds of one ``parse_batches`` pass over every batch."""
    start = time.process_time()
    for _ in dts_avro.parse_batches(iter(raw)):
        pass
    return time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--keys", type=int, default=5_000)
    ap.add_argument("--batch", type=int, default=10_000, help="rows an Arrow batch")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--wide", action="store_true", help="eleven mixed-type columns, not four")
    ap.add_argument("--profile", action="store_true", help="cProfile one run instead")
    args = ap.parse_args()

    values = messages(args.events, args.keys, args.wide)
    raw = batches(values, args.batch)
    mean_bytes = sum(map(len, values)) / len(values)
    print(f"{len(values):,} messages ({'wide' if args.wide else 'formats.py'} rows, "
          f"{mean_bytes:.0f} bytes on average), batches of {args.batch:,}")  # fmt: skip
    run(raw[:1])  # warm-up: first-use costs (schema parse, caches)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in dts_avro.parse_batches(iter(raw)):
            pass
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
        return
    times = [run(raw) for _ in range(args.reps)]
    cpu = statistics.median(times)
    print(f"CPU s per pass: median {cpu:.3f} (min {min(times):.3f}, max {max(times):.3f}, "
          f"{args.reps} reps)")  # fmt: skip
    print(f"{cpu / len(values) * 1e6:.1f} us per message, "
          f"{len(values) / cpu:,.0f} messages/s per core")  # fmt: skip


if __name__ == "__main__":
    main()
