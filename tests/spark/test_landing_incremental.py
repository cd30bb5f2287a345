"""Landing files are ingested incrementally: a run reads the files raw does not hold as they are
now (new, grown, rewritten), records them in its commit, and replaces a re-ingested file's rows
in raw and in every output, so nothing is duplicated or left stale."""

import json
import os

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.lake import landing_files
from cdc_platform.quality import validations
from cdc_platform.steps.changelog import normalize_new, normalize_source
from cdc_platform.steps.current import current_rows, merge_current
from cdc_platform.steps.raw import ingest_landing, pending_landing_files

pytestmark = pytest.mark.spark
SOURCE = SourceConfig(
    name="inc",
    format="debezium",
    tables=[TableConfig(name="t", source_table="app.t", primary_key=["id"])],
)
DATE = "2026-03-01"


def _event(op: str, pos: int, key: int, name: str | None) -> str:
    source = {"db": "app", "table": "t", "file": "bin.000001", "pos": pos, "row": 0,
              "ts_ms": 1_700_000_000_000 + pos}  # fmt: skip
    after = None if op == "d" else {"id": key, "name": name}
    before = {"id": key, "name": None} if op in ("u", "d") else None
    return json.dumps({"before": before, "after": after, "source": source, "op": op, "ts_ms": 1})


def _land(landing, name: str, lines: list[str], append: bool = False) -> None:
    folder = landing / f"dt={DATE}"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / name).open("a" if append else "w") as f:
        f.writelines(line + "\n" for line in lines)


def _run(spark, warehouse, landing):
    ingested = ingest_landing(warehouse, "inc", landing, [DATE])
    normalized = normalize_new(spark, warehouse, SOURCE)
    for table in normalized.tables:
        merge_current(spark, warehouse, "inc", table)
    return ingested, normalized


def _last_commit_files(uri: str) -> list[str]:
    commit = DeltaTable(uri).history(1)[0]
    return [f["name"] for f in json.loads(commit[landing_files.LANDING_KEY])["files"]]


def _rows(spark, warehouse) -> list[tuple]:
    df = current_rows(spark, warehouse, "inc", "t")
    return sorted((int(r["id"]), r["name"]) for r in df.toArrow().to_pylist())


def test_a_second_file_ingests_only_that_file(spark, warehouse, tmp_path):
    landing = tmp_path / "landing"
    raw = lake.TableRef(lake.RAW, "inc").uri(warehouse)
    _land(landing, "a.jsonl", [_event("c", 1, 1, "one"), _event("c", 2, 2, "two")])
    first, _ = _run(spark, warehouse, landing)
    assert [f.name for f in first.files] == [f"dt={DATE}/a.jsonl"]
    assert DeltaTable(raw).metadata().configuration == lake.TABLE_PROPERTIES
    assert pending_landing_files(warehouse, "inc", landing) == {}

    _land(landing, "b.jsonl", [_event("u", 3, 1, "uno")])
    assert pending_landing_files(warehouse, "inc", landing) == {DATE: [f"dt={DATE}/b.jsonl"]}
    second, normalized = _run(spark, warehouse, landing)
    assert [f.name for f in second.files] == [f"dt={DATE}/b.jsonl"]
    assert second.messages == {DATE: 1} and normalized.messages == 1
    # The commit records the file with its size and mtime; raw's files say which it holds.
    assert _last_commit_files(raw) == [f"dt={DATE}/b.jsonl"]
    stat = (landing / f"dt={DATE}" / "b.jsonl").stat()
    held = landing_files.Held(raw).of_date(DATE)[f"dt={DATE}/b.jsonl"]
    assert (held.size, held.mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    assert _rows(spark, warehouse) == [(1, "uno"), (2, "two")]
    # The run's checks look at what it wrote: one message, one change record, not the day's 3.
    changes = validations.validate_changelog(
        spark, warehouse, SOURCE, "t", [DATE], normalized.written
    )
    reconciled = validations.validate_reconciliation(
        spark, warehouse, SOURCE, [DATE], normalized.written
    )
    assert changes.rows == reconciled.rows == 1 and changes.success and reconciled.success
    assert validations.validate_changelog(spark, warehouse, SOURCE, "t", [DATE]).rows == 3
    # An empty file is held too (its name is in its data file's statistics), not read again.
    _land(landing, "empty.jsonl", [])
    assert _run(spark, warehouse, landing)[0].messages == {DATE: 0}
    assert pending_landing_files(warehouse, "inc", landing) == {}
    # Nothing new: nothing read, nothing written.
    assert _run(spark, warehouse, landing)[0].files == []


@pytest.mark.slow
def test_a_grown_file_is_ingested_again_without_duplicates(spark, warehouse, tmp_path):
    landing = tmp_path / "landing"
    _land(landing, "a.jsonl", [_event("c", 1, 1, "one"), _event("c", 2, 2, "two")])
    _run(spark, warehouse, landing)
    _land(landing, "a.jsonl", [_event("d", 3, 2, None), _event("c", 4, 3, "three")], append=True)
    grown, normalized = _run(spark, warehouse, landing)
    assert [f.name for f in grown.files] == [f"dt={DATE}/a.jsonl"]
    assert normalized.messages == 4  # the file's rows are replaced, all four read again

    raw = lake.read(spark, lake.TableRef(lake.RAW, "inc").uri(warehouse)).toArrow()
    assert sorted(raw["line"].to_pylist()) == [1, 2, 3, 4]
    changes = lake.read_arrow(lake.TableRef(lake.CHANGELOG, "inc", "t").uri(warehouse))
    assert pc.count_distinct(changes["sequence"]).as_py() == changes.num_rows == 4
    assert _rows(spark, warehouse) == [(1, "one"), (3, "three")]

    # A rewrite that drops a change: its change record and its effect go.
    _land(landing, "a.jsonl", [_event("c", 1, 1, "one"), _event("c", 2, 2, "two")])
    os.utime(landing / f"dt={DATE}" / "a.jsonl", ns=(1, 1))  # a rewrite that keeps no mtime
    _run(spark, warehouse, landing)
    changes = lake.read_arrow(lake.TableRef(lake.CHANGELOG, "inc", "t").uri(warehouse))
    assert changes.num_rows == 2
    assert _rows(spark, warehouse) == [(1, "one"), (2, "two")]


def test_a_date_written_before_files_were_tracked_is_replaced_once(spark, warehouse, tmp_path):
    landing = tmp_path / "landing"
    _land(landing, "a.jsonl", [_event("c", 1, 1, "one")])
    _land(landing, "b.jsonl", [_event("c", 2, 2, "two")])
    # Raw as the whole-date writer of earlier releases left it: one data file, two landing files.
    raw_uri = lake.TableRef(lake.RAW, "inc").uri(warehouse)
    from cdc_platform.ingest import landing as landing_io

    folder = landing / f"dt={DATE}"
    old = landing_io.read_files(
        [(folder / n, f"dt={DATE}/{n}") for n in ("a.jsonl", "b.jsonl")], DATE, topic="inc"
    )
    lake.overwrite_partitions(spark.createDataFrame(old).coalesce(1), raw_uri, [DATE])
    normalize_source(spark, warehouse, SOURCE, [DATE])
    assert landing_files.Held(raw_uri).of_date(DATE) is None
    assert sorted(pending_landing_files(warehouse, "inc", landing)[DATE]) == [
        f"dt={DATE}/a.jsonl",
        f"dt={DATE}/b.jsonl",
    ]

    ingested, _ = _run(spark, warehouse, landing)
    assert ingested.replaced_dates == [DATE]
    assert set(landing_files.Held(raw_uri).of_date(DATE)) == {
        f"dt={DATE}/a.jsonl",
        f"dt={DATE}/b.jsonl",
    }
    changes = lake.read_arrow(lake.TableRef(lake.CHANGELOG, "inc", "t").uri(warehouse))
    assert changes.num_rows == 2
    assert _rows(spark, warehouse) == [(1, "one"), (2, "two")]
    assert pa.table(DeltaTable(raw_uri).get_add_actions(flatten=True)).num_rows == 2
