"""``lake.head``: the first rows of some data files of a table, read with Arrow (the previews a
step shows of what its commit wrote): only those files, in their order, with the table's schema
(a column an older file lacks is null) and the partition values of their paths."""

import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from cdc_platform import lake


def _write(uri: str, table: pa.Table, **options) -> list[str]:
    """Append ``table``; the data files the commit added."""
    before = set(lake.files(uri)) if lake.exists(uri) else set()
    write_deltalake(uri, table, mode="append", **options)
    return [f for f in lake.files(uri) if f not in before]


def test_the_first_rows_of_the_files_named_with_their_partition_values(tmp_path):
    uri = str(tmp_path / "t")
    day = dt.date(2026, 11, 29)
    first = pa.table({"id": list(range(100)), "ingest_date": [day] * 100})
    _write(uri, first, partition_by=["ingest_date"])
    added = _write(
        uri,
        pa.table({"id": [1000, 1001], "ingest_date": [day, day]}),
        partition_by=["ingest_date"],
    )
    rows = lake.head(uri, added, 10)
    assert rows.column_names == ["id", "ingest_date"]
    assert rows.to_pylist() == [
        {"id": 1000, "ingest_date": day},
        {"id": 1001, "ingest_date": day},
    ]
    assert lake.head(uri, lake.files(uri), 3).num_rows == 3  # no more than asked


def test_a_filter_and_a_column_an_older_file_lacks(tmp_path):
    uri = str(tmp_path / "t")
    old = _write(uri, pa.table({"id": [1, 2, 3], "gone": [True, False, False]}))
    new = _write(
        uri,
        pa.table({"id": [4], "gone": [False], "note": ["new column"]}),
        schema_mode="merge",
    )
    rows = lake.head(uri, old + new, 10, where=~pc.field("gone"))
    assert rows.to_pylist() == [
        {"id": 2, "gone": False, "note": None},
        {"id": 3, "gone": False, "note": None},
        {"id": 4, "gone": False, "note": "new column"},
    ]
