"""Shared fixtures: one local SparkSession for the whole run, a fresh warehouse per test."""

import json
import os
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cdc_platform.spark.session import get_spark

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
