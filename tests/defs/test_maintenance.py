"""The maintenance job vacuums every table: replaced files and crashed writes' files go once older
than the retention, younger ones and every live file stay, and nothing is committed; a table an
older release made gets our table properties, once."""

import os
import time
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import RemoveAction

from cdc_platform.catalog import MaintenanceConfig
from cdc_platform.defs.maintenance import JOB_NAME, build_maintenance_defs
from cdc_platform.defs.resources import LakeResource, SparkResource
from cdc_platform.lake.tables import TABLE_PROPERTIES, add_actions

HOUR_MS = 3600 * 1000


def _replace_first_file(uri: str, hours_ago: float) -> Path:
    """Add a row and remove the table's first file ``hours_ago``, as a merge then would have:
    the removed file."""
    dt = DeltaTable(uri)
    gone = add_actions(dt).to_pylist()[0]
    write_deltalake(uri, pa.table({"id": [len(dt.file_uris()) + 100]}), mode="append")
    dt = DeltaTable(uri)
    removed = RemoveAction(
        path=gone["path"], data_change=True, size=gone["size_bytes"], partition_values={},
        deletion_timestamp=int(time.time() * 1000 - hours_ago * HOUR_MS),
    )  # fmt: skip
    dt.create_write_transaction([removed], mode="append", schema=dt.schema(), partition_by=[])
    return Path(uri, gone["path"])


def _crashed_write(uri: str, hours_ago: float) -> Path:
    """A data file a write left in its folder and never committed, ``hours_ago``."""
    path = Path(uri, f"write-{hours_ago:g}h", "ingest_date=2026-11-01", "part-0.parquet")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"PAR1 never committed")
    then = time.time() - hours_ago * 3600
    os.utime(path, (then, then))
    return path


def _run(warehouse: Path, hours: int = 24) -> dg.ExecuteInProcessResult:
    lake = LakeResource(warehouse=str(warehouse), landing=str(warehouse))
    defs = dg.Definitions.merge(
        build_maintenance_defs(MaintenanceConfig(retention_hours=hours)),
        # Lazy: no session starts unless a purge rewrites files (these tables have no DVs).
        dg.Definitions(resources={"lake": lake, "spark": SparkResource(spark_config={})}),
    )
    return defs.resolve_job_def(JOB_NAME).execute_in_process(raise_on_error=False)


@pytest.fixture
def warehouse(tmp_path) -> Path:
    for layer in ("current/shop/customers", "raw/shop", "models/daily"):
        for n in range(3):
            write_deltalake(
                tmp_path / layer, pa.table({"id": [n]}), mode="append",
                configuration=TABLE_PROPERTIES,
            )  # fmt: skip
    return tmp_path


def _metadata(result: dg.ExecuteInProcessResult) -> dict:
    output = next(e for e in result.events_for_node("maintain_tables") if e.is_successful_output)
    return {k: v.value for k, v in output.step_output_data.metadata.items()}


def test_vacuum_deletes_what_is_older_than_the_retention_and_commits_nothing(warehouse):
    current, raw = str(warehouse / "current/shop/customers"), str(warehouse / "raw/shop")
    old_replaced = _replace_first_file(current, hours_ago=48)
    young_replaced = _replace_first_file(current, hours_ago=2)
    old_crash, young_crash = _crashed_write(raw, 48), _crashed_write(raw, 2)
    staged = warehouse / "_staging" / "abc" / "part-0.parquet"  # a step's, not a table's
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"PAR1")
    versions = {uri: DeltaTable(uri).version() for uri in (current, raw)}
    rows = {uri: DeltaTable(uri).to_pyarrow_table().sort_by("id") for uri in (current, raw)}

    result = _run(warehouse)

    assert result.success
    counts = _metadata(result)
    assert counts["tables"] == 3 and counts["files_deleted"] == 2
    assert counts["tables_upgraded"] == 0
    assert not old_replaced.exists() and not old_crash.exists()
    assert not old_crash.parents[1].exists(), "the crashed write's folder is gone"
    assert young_replaced.exists() and young_crash.exists() and staged.exists()
    for uri in (current, raw):
        assert DeltaTable(uri).version() == versions[uri], "vacuum commits nothing"
        assert DeltaTable(uri).to_pyarrow_table().sort_by("id") == rows[uri]
        for live in DeltaTable(uri).file_uris():
            assert Path(live).exists()


def test_a_table_that_fails_is_named_and_the_others_are_still_vacuumed(warehouse):
    current = str(warehouse / "current/shop/customers")
    old_replaced = _replace_first_file(current, hours_ago=48)
    broken = warehouse / "raw" / "crm"
    (broken / "_delta_log").mkdir(parents=True)
    (broken / "_delta_log" / "00000000000000000000.json").write_text("not a commit")

    result = _run(warehouse)

    assert not result.success
    failure = result.failure_data_for_node("maintain_tables").error.message
    assert "1 of 4 tables failed their maintenance" in failure
    assert f"\n{broken}: " in failure
    assert not old_replaced.exists()


def test_a_table_an_older_release_made_gets_our_properties_once(warehouse):
    old = warehouse / "history" / "shop" / "customers"
    write_deltalake(old, pa.table({"id": [1]}))  # delta-rs's defaults: a checkpoint every 100
    rows = DeltaTable(old).to_pyarrow_table()

    first, second = _run(warehouse), _run(warehouse)

    assert _metadata(first)["tables_upgraded"] == 1
    assert _metadata(second)["tables_upgraded"] == 0
    dt = DeltaTable(old)
    assert dt.metadata().configuration.items() >= TABLE_PROPERTIES.items()
    assert dt.version() == 1 and dt.to_pyarrow_table() == rows
