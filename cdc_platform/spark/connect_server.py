"""A local Spark Connect server: one warm JVM that every Dagster run connects to.

Each run of the default run launcher is a new process; with a local session each pays the JVM
start and Spark's first-query warm-up (BENCHMARKS.md, latency). Runs whose catalog says
``spark: {remote: sc://127.0.0.1:15002}`` (or ``CDC_SPARK_REMOTE``) use this server instead.
It is pyspark's own ``start-connect-server.sh`` in the foreground, with the platform's Spark
settings, the JDK ``ensure_java`` finds, and this interpreter for Python workers.
"""

import os
import sys
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from cdc_platform.spark.session import DEFAULT_CONF, ensure_java

DEFAULT_PORT = 15002


def command(
    master: str, conf: dict[str, str], port: int = DEFAULT_PORT
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run the server until it is stopped."""
    spark_home = Path(pyspark.__file__).parent
    # A client's settings would make the server's own Python workers Connect clients.
    client = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
    env = {
        **{k: v for k, v in os.environ.items() if k not in client},
        "JAVA_HOME": ensure_java(),
        "SPARK_HOME": str(spark_home),
        "PYSPARK_PYTHON": sys.executable,
    }
    # WARN: at INFO a busy server logs a megabyte every few minutes.
    settings = {
        **DEFAULT_CONF,
        "spark.log.level": "WARN",
        **conf,
        "spark.connect.grpc.binding.port": str(port),
    }
    args = ["bash", str(spark_home / "sbin" / "start-connect-server.sh"), "--wait"]
    args += ["--master", master]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    return args, env


# What `cdc-platform spark-server` prints when its warm-up is done: `make demo` and the benches
# wait for it.
WARM = "Spark Connect server warm"


def warm(spark: SparkSession, rounds: int = 2) -> float:
    """Replay the demo's Debezium traffic on ``spark`` ``rounds`` times, into a throwaway
    warehouse: parse, type, every write, the first build of the current tables, then a merge
    into them. A session's first queries are several times slower than later ones (code
    generation, the JIT): afterwards the first real run is about as fast as any. Returns the
    seconds it took."""
    import tempfile
    import time

    from cdc_platform.catalog import SourceConfig
    from cdc_platform.demo import write_demo_traffic
    from cdc_platform.steps.replay import replay

    shop = SourceConfig(name="shop", format="debezium")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cdc-warm-up-") as work:
        landing, warehouse = Path(work, "landing"), Path(work, "warehouse")
        for batch in range(rounds):
            path = next(p for p in write_demo_traffic(landing, batch) if p.parts[-3] == "shop")
            replay(spark, warehouse, [path], shop, path.parent.name.removeprefix("dt="))
    return time.monotonic() - start
