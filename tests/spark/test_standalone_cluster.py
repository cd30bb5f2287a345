"""Corpus files of two formats replayed by ``cdc-platform replay`` on a real Spark standalone
cluster (a master and two one-core workers from pyspark's own jars, on 127.0.0.1), chosen with
``--spark-conf spark.master=spark://...`` over a sources file that says ``local[1]``; the
tables are checked against EXPECTED.json and the accepted snapshot.

The driver is a process of its own that runs the command (``cli.main``, as the
``cdc-platform`` script does); the tasks run in executor JVMs the workers start, with this
interpreter for their Python workers. All of them see the same warehouse folder: one machine.
What the cluster adds is the process boundary, so one small replay covers it (two files, two
tables: each table costs its own jobs, which a cluster's task round trips make dearer); the whole
corpus is replayed on the local session by tests/spark/test_corpus_snapshot.py.
"""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_platform.normalize import table_name
from cdc_platform.processes import stop_group
from cdc_platform.spark.session import ensure_java
from cdc_platform.steps.current import current_rows
from tests import corpus_snapshot as snap
from tests.conftest import CORPUS, SPARK_CONF
from tests.spark.test_format_canal import _comparable

pytestmark = pytest.mark.spark

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
# Short-lived JVMs spend their time compiling: C1 alone starts each (daemons, driver, executors)
# about twice as fast on two busy cores.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1"

# One of tests/corpus_snapshot.py's REPLAYS: a Debezium (PostgreSQL) file and a DataWorks file,
# typed from the command line.
SOURCE = "corpus_c"
FORMATS = {"debezium", "aliyun"}  # EXPECTED.json's names, shortened
# The license header atop each DataWorks file: quarantined, no format recognises it.
LICENSE_LINES = 17


# --- the cluster ------------------------------------------------------------------------------


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _master_state(webui: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{webui}/json/", timeout=5) as response:
        return json.load(response)


def _master_ports(procs: list[subprocess.Popen], logs: Path) -> tuple[int, int]:
    """(RPC port, web UI port) the master bound: it is started on port 0 for both, so no other
    process can take them between our choosing and its binding; its log names them."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert procs[0].poll() is None, _tails(logs)
        log = (logs / "master.log").read_text()
        rpc = re.search(r"Starting Spark master at spark://[^:]+:(\d+)", log)
        webui = re.search(r"Bound MasterWebUI to .*started at http://[^:]+:(\d+)", log)
        if rpc and webui:
            return int(rpc[1]), int(webui[1])
        time.sleep(0.5)
    raise AssertionError(f"the master did not start in 180 s: {_tails(logs)}")


def _wait_for_workers(webui: int, procs: list[subprocess.Popen], logs: Path, n: int) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        for proc in procs:
            assert proc.poll() is None, _tails(logs)
        if _master_state(webui)["aliveworkers"] == n:
            return
        time.sleep(0.5)
    raise AssertionError(f"no {n} workers registered after 180 s: {_tails(logs)}")


def _tails(logs: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(logs.glob("*.log")))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(spark://127.0.0.1:PORT, web UI port) of a standalone master with two workers of one core
    and 1 GB each, on loopback ports the OS picks, each worker with its own work and local
    folders; every process group stopped at the end."""
    scratch = tmp_path_factory.mktemp("standalone")
    logs = scratch / "logs"
    logs.mkdir()
    # A Connect client's variables would make the executors' Python workers Connect clients.
    client = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "CDC_SPARK_REMOTE")
    env = {
        **{k: v for k, v in os.environ.items() if k not in client},
        "JAVA_HOME": ensure_java(),
        "SPARK_HOME": str(SPARK_CLASS.parent.parent),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "JAVA_TOOL_OPTIONS": JVM_OPTIONS,  # the daemons and the executors the workers start
    }
    master = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
    master += ["--port", "0", "--webui-port", "0"]
    procs = [_start([str(SPARK_CLASS), *master], env, logs / "master.log")]
    try:
        port, webui = _master_ports(procs, logs)
        url = f"spark://127.0.0.1:{port}"
        for i in (1, 2):
            worker = ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1"]
            worker += ["--webui-port", "0", "--cores", "1", "--memory", "1g"]
            worker += ["--work-dir", str(scratch / f"work{i}"), url]  # executors' logs there
            # Each worker's scratch (shuffle, spills) in a folder of its own: no shared disk.
            local = {"SPARK_LOCAL_DIRS": str(scratch / f"local{i}")}
            procs.append(_start([str(SPARK_CLASS), *worker], env | local, logs / f"worker{i}.log"))
        _wait_for_workers(webui, procs, logs, 2)
        yield url, webui
    finally:
        for proc in reversed(procs):
            stop_group(proc)


# --- the replays ------------------------------------------------------------------------------


def _replay(url: str, cwd: Path, warehouse: Path | str) -> dict:
    """``cdc-platform replay`` of ``SOURCE``'s files on the cluster, in a driver process of its
    own; the summary it prints."""
    spark_conf = {
        "spark.master": url,
        # The executors connect back to the driver: on the loopback address, not the host name.
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.extraJavaOptions": JVM_OPTIONS,
        # Tiny tasks: waiting for a task's preferred executor costs more than running it anywhere.
        "spark.locality.wait": "0s",
        **SPARK_CONF,
    }
    typed, files = snap.REPLAYS[SOURCE]
    argv = ["replay", *(str(CORPUS / f) for f in files), "--warehouse", str(warehouse)]
    argv += ["--format", "auto", "--source", SOURCE, "--date", snap.DATE]
    argv += snap.TYPED if typed else []
    argv += [arg for kv in spark_conf.items() for arg in ("--spark-conf", "=".join(kv))]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CDC_", "SPARK_"))}
    env |= {"SPARK_LOCAL_IP": "127.0.0.1", "JAVA_TOOL_OPTIONS": JVM_OPTIONS}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdc_platform", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        stop_group(proc)  # the driver's JVM too, should the command hang
    assert proc.returncode == 0, err[-3000:]
    # The replay prints its summary (one JSON line) last.
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def _rows(spark, warehouse: Path | str, source: str, qualified: str, key: list[str]) -> list[dict]:
    """Current rows by key, timestamps as epoch ms (EXPECTED.json keeps DataWorks' wire value)."""
    df = current_rows(spark, warehouse, source, table_name(qualified))
    as_ms = [
        F.unix_millis(f.name).alias(f.name) if f.dataType == T.TimestampType() else F.col(f.name)
        for f in df.schema.fields
    ]
    return df.select(*as_ms).orderBy(*key).toArrow().to_pylist()


def _check(
    spark, warehouse: Path | str, source: str, summary: dict, entry: dict, qualified: str
) -> None:
    """Table ``qualified`` of a replay against ``entry`` of EXPECTED.json (its own table or one
    of its ``other_tables``): the current rows and the replayed changes by op."""
    want = entry if qualified == entry["table"] else entry["other_tables"][qualified]
    rows = want["final_state"]
    columns = list(rows[0] if rows else entry["column_types"])
    key = entry["primary_key"] if want is entry else columns[:1]
    got = _rows(spark, warehouse, source, qualified, key)
    assert _comparable(got, entry, columns) == _comparable(rows, entry, columns), qualified
    unappliable = len(entry.get("unappliable_messages", []))
    counts = want["counts"]
    assert summary["tables"][qualified] == {
        "inserted": counts["insert"],
        "updated": counts["update"],
        "deleted": counts["delete"] - unappliable,
        "rows": len(rows),
    }, qualified


def _quarantined(entries: list[dict]) -> int:
    """Messages a replay of ``entries`` quarantines: unidentifiable deletes and DataWorks'
    license lines."""
    return sum(
        len(e.get("unappliable_messages", [])) + LICENSE_LINES * e["format"].startswith("aliyun")
        for e in entries
    )


def test_corpus_files_replay_on_a_standalone_cluster(cluster, spark, expected, tmp_path):
    url, webui = cluster
    # A sources file that says local: the command line's master must win.
    (tmp_path / "sources.yaml").write_text("spark: {master: 'local[1]'}\nsources: []\n")
    warehouse = tmp_path / "warehouse"

    summary = _replay(url, tmp_path, warehouse)

    # The replay ran as an application of the cluster, with executors on both workers.
    state = _master_state(webui)
    apps = state["activeapps"] + state["completedapps"]
    assert [a["cores"] for a in apps] == [2], apps
    entries = [expected[f] for f in snap.REPLAYS[SOURCE][1]]
    assert {e["format"].split("-")[0] for e in entries} == FORMATS
    for entry in entries:
        for qualified in [entry["table"], *entry.get("other_tables", {})]:
            _check(spark, warehouse, SOURCE, summary, entry, qualified)
    assert summary["quarantined"] == _quarantined(entries)
    # And every table equals what a local session leaves (tests/spark/test_corpus_snapshot.py).
    snap.assert_accepted(snap.tables(warehouse), only=SOURCE)
