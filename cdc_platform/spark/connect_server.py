"""A local Spark Connect server: one warm JVM that every Dagster run connects to.

Each run of the default run launcher is a new process; with a local session each pays the JVM
start and Spark's first-query warm-up (BENCHMARKS.md, latency). Runs whose catalog says
``spark: {remote: sc://127.0.0.1:15002}`` (or ``CDC_SPARK_REMOTE``) use this server instead.

The server is a local Spark session (``get_spark``, the platform's settings and the JDK
``ensure_java`` finds) with Spark Connect as its plugin, in a process of its own (``python -m
cdc_platform.spark.connect_server``), not pyspark's ``start-connect-server.sh``. That script's
server gives every client session a class loader of its own (artifact isolation, forced on),
and Spark caches compiled code per class loader: each run, a new session, compiled all of its
generated code again, which made a run's first micro-batch's tasks 3.5x dearer (about 1 s).
The plugin's sessions share the server's class loader, so they share its compiled code, the
warm-up's included. Nothing of ours adds artifacts (jars, files) to a session, which is what
isolation is for.
"""

import argparse
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from cdc_platform.spark.session import ensure_java, get_spark

DEFAULT_PORT = 15002
_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"


def command(
    master: str, conf: dict[str, str], port: int = DEFAULT_PORT
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run the server until it is stopped."""
    # A client's settings would make the server (and its own Python workers) Connect clients.
    client = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
    env = {
        **{k: v for k, v in os.environ.items() if k not in client},
        "JAVA_HOME": ensure_java(),
        "PYSPARK_PYTHON": sys.executable,
    }
    # WARN: at INFO a busy server logs a megabyte every few minutes. ``serve`` builds the session
    # with ``get_spark``, which adds the platform's DEFAULT_CONF under these.
    settings = {"spark.log.level": "WARN", **conf, "spark.connect.grpc.binding.port": str(port)}
    args = [sys.executable, "-m", "cdc_platform.spark.connect_server", "--master", master]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    return args, env


def serve(master: str, conf: dict[str, str]) -> int:
    """Run the server in this process's JVM until the JVM ends; its exit status (128 + the
    signal that killed it, as a shell says). The JVM ends with this process too (pyspark's
    gateway quits when its parent's pipe closes)."""
    plugins = ",".join(filter(None, [conf.get("spark.plugins"), _PLUGIN]))
    spark = get_spark(master, {**conf, "spark.plugins": plugins}, app_name="Spark Connect server")
    spark.sparkContext.setLogLevel(conf.get("spark.log.level", "WARN"))
    code = spark.sparkContext._gateway.proc.wait()  # noqa: SLF001  (pyspark's JVM process)
    return code if code >= 0 else 128 - code


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
            written = map(Path, write_demo_traffic(str(landing), batch))
            path = next(p for p in written if p.parts[-3] == "shop")
            replay(spark, warehouse, [path], shop, path.parent.name.removeprefix("dt="))
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description="run a Spark Connect server (see `command`)")
    parser.add_argument("--master", required=True)
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    sys.exit(serve(args.master, dict(kv.split("=", 1) for kv in args.conf)))


if __name__ == "__main__":
    main()
