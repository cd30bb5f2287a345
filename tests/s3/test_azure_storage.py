"""The lake on Azure Blob Storage (Azurite on loopback, tests/azure_server.py), through the same
storage layer as S3: the corpus gives the same tables, landing files are listed and read from a
container, commits that race both land, and a store the platform cannot use is one line."""

import os
import subprocess
import sys
import threading

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
DAY = "2026-01-01"


@pytest.fixture
def azure_env(azure_server, monkeypatch):
    """The server's AZURE_* variables in this process's environment (where the lake reads them)."""
    for name, value in azure_server.env().items():
        monkeypatch.setenv(name, value)
    return azure_server.env()


@pytest.fixture
def container(azure_server) -> str:
    return azure_server.create_container()


def _blobs(server, container: str) -> list[str]:
    listed = server.filesystem().get_file_info(pafs.FileSelector(container, recursive=True))
    return [i.path for i in listed if i.type == pafs.FileType.File]


def test_the_corpus_replayed_to_a_container_leaves_the_tables_it_leaves_on_disk(
    spark, azure_server, azure_env, container, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # a local folder named az: would show here
    warehouse = f"az://{container}/warehouse"
    for source, (typed, files) in snap.REPLAYS.items():
        options = {"primary_key": snap.PRIMARY_KEY, "column_types": snap.COLUMN_TYPES}
        config = SourceConfig(name=source, format="auto", **(options if typed else {}))
        replay(spark, warehouse, [CORPUS / f for f in files], config, snap.DATE)
    snap.assert_accepted(snap.tables(warehouse))
    assert list(tmp_path.iterdir()) == []
    assert all(p.startswith(f"{container}/warehouse/") for p in _blobs(azure_server, container))


def test_an_abfss_uri_names_the_same_tables(spark, azure_env, azure_server, container):
    """abfss://container@account.dfs.core.windows.net/… is the same place as az://container/…
    (the account from the URI's host; the endpoint, here Azurite's, from the options)."""
    rows = spark.range(0, 5).select("id", F.lit("x").alias("v"))
    lake.replace(rows, f"az://{container}/w/t", lake.TableState(key=["id"]), key=["id"], rows=5)
    abfss = f"abfss://{container}@{azure_server.account}.dfs.core.windows.net/w/t"
    assert sorted(r["id"] for r in lake.read_arrow(abfss).to_pylist()) == [0, 1, 2, 3, 4]


def test_landing_files_in_a_container_are_listed_read_and_merged(
    spark, azure_env, container, tmp_path
):
    results = {}
    for where, base in (("azure", f"az://{container}"), ("disk", str(tmp_path))):
        landing, warehouse = storage.join(base, "landing"), storage.join(base, "warehouse")
        for batch in range(3):
            write_demo_traffic(landing, batch=batch, date=DAY)
        shop = storage.join(landing, "shop")
        assert pending_landing_files(warehouse, "shop", shop) == {
            DAY: [f"dt={DAY}/{b:05d}.kafka.jsonl" for b in range(3)]
        }
        ingest_landing(warehouse, "shop", shop, [DAY])
        assert pending_landing_files(warehouse, "shop", shop) == {}
        normalized = normalize_source(spark, warehouse, SourceConfig(name="shop"), [DAY])
        tables = {}
        for t in normalized.tables.values():
            merge_current(spark, warehouse, "shop", t.name)
            uri = lake.TableRef(lake.CURRENT, "shop", t.name).uri(warehouse)
            columns = [c for c in lake.arrow_schema(uri).names if not c.startswith("__")]
            tables[t.name] = sorted(map(str, lake.read_arrow(uri, columns).to_pylist()))
        results[where] = tables
    assert results["azure"] == results["disk"] and results["azure"]


def test_two_writers_racing_on_a_table_in_a_container_both_land(spark, azure_env, container):
    uri = f"az://{container}/warehouse/current/s/t"
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
    assert {values[i] for i in range(10)} | {values[i] for i in range(500, 510)} == {
        "new0",
        "new500",
    }
    assert values[100] == "old"
    assert lake.vacuum(uri, 0).files == 2  # the two replaced files, deleted from the container


@pytest.mark.parametrize("problem", ["wrong key", "missing container", "unknown endpoint"])
def test_a_container_the_platform_cannot_use_is_one_line_and_nothing_is_written(
    azure_server, container, tmp_path, problem
):
    env, name = azure_server.env(), container
    if problem == "wrong key":
        env = azure_server.env(key="bm90LXRoZS1rZXk=")
        expected = (
            "refused the credentials (AZURE_STORAGE_ACCOUNT_NAME / AZURE_STORAGE_ACCOUNT_KEY)"
        )
    elif problem == "missing container":
        name = "no-such-container"
        expected = "container 'no-such-container' does not exist at http://127.0.0.1:"
    else:
        env["AZURE_STORAGE_ENDPOINT"] = f"http://127.0.0.1:9/{azure_server.account}"
        expected = "cannot reach the object store at http://127.0.0.1:9/"
    plain = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_"))}
    done = subprocess.run(
        [sys.executable, "-m", "cdc_platform", "replay", "--warehouse",
         f"az://{name}/warehouse", "--source", "s", str(CORPUS / snap.REPLAYS["corpus_c"][1][0])],
        env={**plain, **env}, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], done.stderr
    assert azure_server.key not in done.stderr
    assert list(tmp_path.iterdir()) == []
    assert _blobs(azure_server, container) == []
