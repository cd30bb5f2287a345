"""The lake on a real S3 server (SeaweedFS on loopback, tests/s3_server.py): the same tables as on
local disk, landing files listed and read from the bucket, commits that race, and a store the
platform cannot use told in one line with nothing written."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.demo import write_demo_traffic
from cdc_platform.lake import storage
from cdc_platform.steps.changelog import normalize_source
from cdc_platform.steps.current import merge_current
from cdc_platform.steps.raw import ingest_landing, pending_landing_files
from cdc_platform.steps.replay import replay
from tests import corpus_snapshot as snap
from tests.conftest import CORPUS

pytestmark = [pytest.mark.spark, pytest.mark.s3]
ROOT = Path(__file__).resolve().parents[2]
DAY = "2026-01-01"


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The server's AWS_* variables in this process's environment (where the lake reads them)."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server.env()


def _objects(bucket: str) -> list[str]:
    fs, path = storage.filesystem(f"s3://{bucket}")
    listed = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    return [i.path for i in listed if i.type == pafs.FileType.File]


def test_the_corpus_replayed_to_a_bucket_leaves_the_tables_it_leaves_on_disk(
    spark, s3_env, s3_bucket, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # a local folder named s3: would show here
    warehouse = f"s3://{s3_bucket}/warehouse"
    for source, (typed, files) in snap.REPLAYS.items():
        options = {"primary_key": snap.PRIMARY_KEY, "column_types": snap.COLUMN_TYPES}
        config = SourceConfig(name=source, format="auto", **(options if typed else {}))
        replay(spark, warehouse, [CORPUS / f for f in files], config, snap.DATE)
    snap.assert_accepted(snap.tables(warehouse))
    assert list(tmp_path.iterdir()) == []
    assert all(p.startswith(f"{s3_bucket}/warehouse/") for p in _objects(s3_bucket))


def test_landing_files_in_a_bucket_are_listed_read_and_merged(spark, s3_env, s3_bucket, tmp_path):
    """The demo's traffic lands in the bucket (dt= folders), the pending files are found there,
    ingested, normalized and merged: the same current tables as the same files on disk."""
    results = {}
    for where, base in (("s3", f"s3://{s3_bucket}"), ("disk", str(tmp_path))):
        landing, warehouse = storage.join(base, "landing"), storage.join(base, "warehouse")
        for batch in range(3):
            write_demo_traffic(landing, batch=batch, date=DAY)
        shop = storage.join(landing, "shop")
        assert pending_landing_files(warehouse, "shop", shop) == {
            DAY: [f"dt={DAY}/{b:05d}.kafka.jsonl" for b in range(3)]
        }
        source = SourceConfig(name="shop", format="debezium")
        ingest_landing(warehouse, "shop", shop, [DAY])
        assert pending_landing_files(warehouse, "shop", shop) == {}
        normalized = normalize_source(spark, warehouse, source, [DAY])
        tables = {}
        for t in normalized.tables.values():
            merge_current(spark, warehouse, "shop", t.name)
            uri = lake.TableRef(lake.CURRENT, "shop", t.name).uri(warehouse)
            columns = [c for c in lake.arrow_schema(uri).names if not c.startswith("__")]
            tables[t.name] = sorted(map(str, lake.read_arrow(uri, columns).to_pylist()))
        results[where] = tables
    assert results["s3"] == results["disk"] and results["s3"]


def test_two_writers_racing_on_a_table_in_the_bucket_both_land(spark, s3_env, s3_bucket):
    """Two merges of one table from the same version: one commit wins, the other finds its
    conflict, runs again on the new version, and both changes are in the table."""
    uri = f"s3://{s3_bucket}/warehouse/current/s/t"
    rows = spark.range(0, 1000).select(F.col("id"), F.lit("old").alias("v"))
    lake.replace(rows, uri, lake.TableState(key=["id"]), key=["id"], rows=1000)
    start = lake.version(uri)
    barrier, errors = threading.Barrier(2), []

    def writer(first: int) -> None:
        try:
            keys = spark.range(first, first + 10).select("id")
            new = keys.select("id", F.lit(f"new{first}").alias("v"))
            barrier.wait()
            lake.replace_keys(spark, uri, new, keys, ["id"], lake.TableState(key=["id"]))
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in (0, 500)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert lake.version(uri) == start + 2
    values = {r["id"]: r["v"] for r in lake.read_arrow(uri).to_pylist()}
    assert len(values) == 1000
    assert {values[i] for i in range(10)} == {"new0"}
    assert {values[i] for i in range(500, 510)} == {"new500"}
    assert values[100] == "old"


def test_vacuum_deletes_the_replaced_files_from_the_bucket(spark, s3_env, s3_bucket):
    uri = f"s3://{s3_bucket}/warehouse/current/s/v"
    for n in range(2):  # the second replaces the first's file
        rows = spark.range(0, 10).select("id", F.lit(n).alias("v"))
        lake.replace(rows, uri, lake.TableState(key=["id"]), key=["id"], rows=10)
    data = [p for p in _objects(s3_bucket) if p.endswith(".parquet")]
    assert len(data) == 2
    assert lake.vacuum(uri, 0).files == 1
    assert [p for p in _objects(s3_bucket) if p.endswith(".parquet")] == [
        lake.storage.filesystem(f)[1] for f in lake.files(uri)
    ]


@pytest.mark.parametrize("problem", ["wrong secret", "missing bucket", "unknown endpoint"])
def test_a_store_the_platform_cannot_use_is_one_line_and_nothing_is_written(
    s3_server, s3_env, s3_bucket, tmp_path, problem
):
    env = dict(s3_server.env())
    bucket = s3_bucket
    if problem == "wrong secret":
        env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
        expected = "refused the credentials"
    elif problem == "missing bucket":
        bucket = "no-such-bucket"
        expected = "bucket 'no-such-bucket' does not exist"
    else:
        env["AWS_ENDPOINT_URL"] = "http://127.0.0.1:9"  # discard: nothing listens
        expected = "cannot reach the object store at http://127.0.0.1:9"
    done = subprocess.run(
        [sys.executable, "-m", "cdc_platform", "replay", "--warehouse",
         f"s3://{bucket}/warehouse", "--source", "s", str(CORPUS / snap.REPLAYS["corpus_c"][1][0])],
        env={**_plain_env(), **env}, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], done.stderr
    assert env["AWS_SECRET_ACCESS_KEY"] not in done.stderr
    assert list(tmp_path.iterdir()) == []
    assert _objects(s3_bucket) == []


def _plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
