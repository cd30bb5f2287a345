"""One warehouse with the demo tables for the model tests: demo traffic replayed through the
pipeline (raw -> change log -> current) once per run. Tests that change it work on a copy."""

import shutil
from pathlib import Path

import pytest

from cdc_platform.catalog import Catalog, load_catalog
from cdc_platform.demo import write_demo_traffic
from cdc_platform.models.project import Project, catalog_tables, load_project
from cdc_platform.steps.replay import replay

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "dbt_like_models"
DAY = "2026-03-01"
NEXT_DAY = "2026-03-02"


def replay_demo_batch(
    spark, catalog: Catalog, warehouse: Path, landing: Path, batch: int, day: str, sources=None
) -> None:
    for path in map(Path, write_demo_traffic(landing, batch, day)):
        source = path.parent.parent.name
        if sources is None or source in sources:
            replay(spark, warehouse, [path], catalog.source(source), day)


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return load_catalog(ROOT / "sources.yaml")


@pytest.fixture(scope="session")
def demo_warehouse(spark, catalog, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models_demo")
    warehouse = root / "warehouse"
    replay_demo_batch(spark, catalog, warehouse, root / "landing", 0, DAY)
    return warehouse


@pytest.fixture
def warehouse_copy(demo_warehouse, tmp_path) -> Path:
    """The demo warehouse, copied: for tests that write to it."""
    return Path(shutil.copytree(demo_warehouse, tmp_path / "warehouse"))


@pytest.fixture(scope="session")
def project(catalog, demo_warehouse) -> Project:
    return load_project(MODELS, catalog_tables(catalog, demo_warehouse))
