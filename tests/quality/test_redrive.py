"""Redrive: quarantined messages re-processed after a configuration fix, idempotent, crash-safe."""

import shutil

import pyarrow.compute as pc
import pytest

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.quality import validations
from cdc_platform.steps import redrive as redrive_module
from cdc_platform.steps.changelog import normalize_source
from cdc_platform.steps.current import current_rows
from cdc_platform.steps.raw import ingest_files
from cdc_platform.steps.redrive import redrive
from tests.conftest import CORPUS

pytestmark = pytest.mark.spark
DATE = "2026-03-01"
# Debezium PostgreSQL without the schema envelope and without Kafka keys: no primary key.
NO_KEY = CORPUS / "debezium" / "debezium-postgres-data-schema-exclude.txt"
BEFORE_FIX = SourceConfig(name="rd")
AFTER_FIX = SourceConfig(
    name="rd", tables=[TableConfig(name="products", source_table="products", primary_key=["id"])]
)
NO_KEY_REASON = "no primary key known"


@pytest.fixture(scope="module")
def landed(tmp_path_factory):
    """A warehouse where the 16 change messages wait in quarantine (no key), beside one line
    of garbage: the state before the fix, copied for each test."""
    root = tmp_path_factory.mktemp("redrive")
    landing = root / "rd.jsonl"
    landing.write_text(NO_KEY.read_text().rstrip("\n") + "\nnot json at all\n")
    return root, landing


@pytest.fixture
def warehouse(spark, landed, tmp_path):
    root, landing = landed
    template = root / "warehouse"
    if not template.exists():
        ingest_files(template, "rd", [(landing, landing.name)], DATE, whole_date=True)
        normalize_source(spark, template, BEFORE_FIX, [DATE])
    shutil.copytree(template, tmp_path / "warehouse")
    return tmp_path / "warehouse"


def _quarantine(warehouse) -> list[dict]:
    return lake.read_arrow(lake.TableRef(lake.QUARANTINE, "rd").uri(warehouse)).to_pylist()


def _current_ids(spark, warehouse) -> list[str]:
    rows = current_rows(spark, warehouse, "rd", "products")
    return sorted(r["id"] for r in rows.toArrow().to_pylist())  # fmt: skip


def test_redrive_after_a_fix_moves_only_the_selected_reason(spark, warehouse):
    assert sum(q["reason"].startswith(NO_KEY_REASON) for q in _quarantine(warehouse)) == 16
    result = redrive(spark, warehouse, AFTER_FIX, reason="no primary key")
    assert (result.selected, result.redriven, result.remaining) == (16, 16, 0)
    assert result.changes == {"products": 16}
    left = _quarantine(warehouse)
    assert [q["reason"] for q in left] == ["no format recognises this message"]  # not selected
    assert _current_ids(spark, warehouse) == [str(i) for i in range(101, 111)]  # no types: text
    run = validations.validate_changelog(spark, warehouse, AFTER_FIX, "products", None)
    assert [r.rule for r in run.rules if not r.success] == []
    assert validations.validate_reconciliation(spark, warehouse, AFTER_FIX, [DATE]).success

    again = redrive(spark, warehouse, AFTER_FIX, reason="no primary key")
    assert (again.selected, again.redriven) == (0, 0)


def test_redrive_without_the_fix_keeps_messages_and_reasons(spark, warehouse):
    result = redrive(spark, warehouse, BEFORE_FIX)
    assert (result.selected, result.redriven, result.remaining) == (17, 0, 17)
    assert len(_quarantine(warehouse)) == 17
    assert not lake.tables_under(warehouse, lake.CHANGELOG, "rd")


def test_a_crash_between_the_commits_leaves_messages_twice_never_lost(
    spark, warehouse, monkeypatch
):
    def crash(*args):
        raise RuntimeError("killed before the quarantine commit")

    # Fault injection: the process dies after the change log commit, before the quarantine's.
    monkeypatch.setattr(redrive_module, "_requarantine", crash)
    with pytest.raises(RuntimeError):
        redrive(spark, warehouse, AFTER_FIX)
    monkeypatch.undo()
    assert len(_quarantine(warehouse)) == 17  # still there ...
    cl = lake.read_arrow(lake.TableRef(lake.CHANGELOG, "rd", "products").uri(warehouse))
    assert cl.num_rows == 16  # ... and applied: at worst in both places
    assert validations.validate_reconciliation(spark, warehouse, AFTER_FIX, [DATE]).success

    result = redrive(spark, warehouse, AFTER_FIX)  # the rerun finishes the job
    assert (result.redriven, result.remaining) == (16, 1)
    cl = lake.read_arrow(lake.TableRef(lake.CHANGELOG, "rd", "products").uri(warehouse))
    assert cl.num_rows == 16 and len(pc.unique(cl["sequence"])) == 16  # nothing twice
    assert len(_quarantine(warehouse)) == 1
