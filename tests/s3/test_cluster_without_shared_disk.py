"""A Spark standalone cluster whose workers share no disk (each its own work and local folders)
replays corpus files into a warehouse on the S3 server: the tables equal EXPECTED.json and the
accepted snapshot, and no process wrote a file of the warehouse to the local filesystem."""

import os
import time
from pathlib import Path

import pytest

from tests import corpus_snapshot as snap
from tests.spark.test_standalone_cluster import (  # noqa: F401  (cluster: the fixture)
    SOURCE,
    _check,
    _master_state,
    _quarantined,
    _replay,
    cluster,
)

pytestmark = [pytest.mark.spark, pytest.mark.s3]


def _warehouse_files_since(start: float, roots: list[Path]) -> list[Path]:
    """Files under ``roots`` changed since ``start`` that belong to a Delta table: data files
    and commit logs."""
    found = []
    for root in roots:
        for folder, _, names in os.walk(root):
            for name in names:
                path = Path(folder, name)
                lake_file = name.endswith(".parquet") or "_delta_log" in path.parts
                try:
                    if lake_file and path.stat().st_mtime >= start:
                        found.append(path)
                except OSError:  # gone while walking (a temporary file)
                    continue
    return found


def test_a_cluster_with_no_shared_disk_writes_the_warehouse_to_the_bucket(
    cluster,  # noqa: F811  (the fixture imported above)
    spark,
    expected,
    s3_server,
    s3_bucket,
    tmp_path,
    tmp_path_factory,
    monkeypatch,
):
    url, webui = cluster
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)  # the driver's (a process of its own) and this reader's
    (tmp_path / "sources.yaml").write_text("sources: []\n")
    warehouse = f"s3://{s3_bucket}/warehouse"
    start = time.time() - 1

    summary = _replay(url, tmp_path, warehouse)

    state = _master_state(webui)
    assert [a["cores"] for a in state["activeapps"] + state["completedapps"]][-1] == 2
    entries = [expected[f] for f in snap.REPLAYS[SOURCE][1]]
    for entry in entries:
        for qualified in [entry["table"], *entry.get("other_tables", {})]:
            _check(spark, warehouse, SOURCE, summary, entry, qualified)
    assert summary["quarantined"] == _quarantined(entries)
    snap.assert_accepted(snap.tables(warehouse), only=SOURCE)
    # The workers' work and local folders, the driver's folder, every folder of this test run
    # and Spark's in the temporary folder, and this checkout: no table file.
    spark_temp = [p for p in Path("/tmp").glob("*") if p.name.startswith(("spark-", "blockmgr-"))]
    roots = [tmp_path_factory.getbasetemp(), *spark_temp, Path(__file__).resolve().parents[2]]
    assert _warehouse_files_since(start, roots) == []
