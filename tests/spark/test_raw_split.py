"""A micro-batch's raw file is parsed by every core, not one: raw is written in row groups of
``lake.RAW_ROW_GROUP_ROWS`` rows, and Spark splits a file of a few MB into a range per core
(the test session runs local[2]). With 64Ki-row groups and Spark's 4 MB open cost, a batch of
100,000 records was read by a single task."""

import datetime as dt
import json

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.ingest.landing import RAW_SCHEMA, raw_batch
from cdc_platform.steps.raw import ingest_landing

pytestmark = pytest.mark.spark
RECORDS = 100_000
DATE = "2026-03-01"


def _value(i: int) -> str:
    after = {"id": i, "name": f"customer {i}"}
    source = {"db": "app", "table": "t", "file": "bin.000001", "pos": i, "ts_ms": 1}
    return json.dumps({"before": None, "after": after, "source": source, "op": "c", "ts_ms": 1})


def _rows_per_task(spark, uri: str) -> list[int]:
    """How many of the table's rows each task of a read gets."""
    read = lake.read(spark, uri).groupBy(F.spark_partition_id().alias("task")).count()
    return sorted(r["count"] for r in read.collect())


def _shared(rows: list[int]) -> bool:
    """Every row read once, by two tasks, neither with more than 60% of them."""
    return len(rows) == 2 and sum(rows) == RECORDS and rows[0] >= 0.4 * RECORDS


def test_a_landing_file_is_read_by_a_task_per_core(spark, tmp_path):
    folder = tmp_path / "landing" / f"dt={DATE}"
    folder.mkdir(parents=True)
    (folder / "batch.jsonl").write_text("".join(_value(i) + "\n" for i in range(RECORDS)))
    ingest_landing(tmp_path / "warehouse", "s", tmp_path / "landing", [DATE])
    uri = lake.TableRef(lake.RAW, "s").uri(tmp_path / "warehouse")
    assert _shared(_rows_per_task(spark, uri))


def test_a_kafka_batch_is_read_by_a_task_per_core(spark, tmp_path):
    uri = lake.TableRef(lake.RAW, "k").uri(tmp_path / "warehouse")
    version, _ = lake.kafka_offsets(uri, RAW_SCHEMA, [("t", 0)])
    columns = {
        "ingest_date": pa.array([dt.date.fromisoformat(DATE)] * RECORDS, pa.date32()),
        "topic": pa.array(["t"] * RECORDS),
        "partition": pa.array([0] * RECORDS, pa.int32()),
        "offset": pa.array(range(RECORDS), pa.int64()),
        "value": pa.array([_value(i).encode() for i in range(RECORDS)], pa.binary()),
    }
    batch = pa.Table.from_batches([raw_batch(columns, RECORDS)])
    lake.append_kafka_batch(uri, batch, version, {("t", 0): RECORDS}, {"records": RECORDS})
    assert _shared(_rows_per_task(spark, uri))
