"""Shared fixtures: one local SparkSession for the whole run, a fresh warehouse per test, a Kafka
broker when a test asks for one."""

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from pyspark.sql import SparkSession

from cdc_platform import broker
from cdc_platform.spark.session import get_spark

# Property and fuzz tests draw the same examples on every run ("ci", the default): a red run means
# the code changed, not the dice. `make fuzz` selects "fuzz": new random examples each run, many
# more of them (CDC_PROPERTY_EXAMPLES, QUALITY_FUZZ_EXAMPLES); pin what it finds as @example.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("fuzz", derandomize=False, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The team's reference material sits beside the clone (../shared), in CI too.
SHARED = Path(os.environ.get("CDC_SHARED", Path(__file__).resolve().parents[2] / "shared"))
CORPUS = SHARED / "corpus"
SEEDS = SHARED / "seeds"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    # local[2] with few shuffle partitions: the suite's frames are tiny, scheduling dominates.
    return get_spark(
        "local[2]", {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}
    )


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    return tmp_path / "warehouse"


@pytest.fixture(scope="session")
def expected() -> dict:
    return json.loads((CORPUS / "EXPECTED.json").read_text())


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a real Kafka-protocol broker (the embedded Tansu, cdc_platform.broker) on a
    free loopback port, stopped at the end; every test uses its own topics."""
    scratch = tmp_path_factory.mktemp("tansu")
    proc, bootstrap = broker.start(scratch / "tansu.log", scratch=scratch)
    try:
        yield bootstrap
    finally:
        broker.stop(proc)
