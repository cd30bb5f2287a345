"""Our tables are standard Delta: data files written by Spark's executors and committed by
delta-rs (``cdc_platform.lake``) read the same in Spark (``lake.read``), in delta-rs, and in
DuckDB's own Delta reader.

DuckDB reads them with ``delta_scan``, the ``delta`` extension (on delta-kernel-rs), not through
delta-rs: ``INSTALL delta`` downloads from extensions.duckdb.org, so the extension comes from
PyPI instead (``duckdb-extension-delta`` in the dev extra, built for one exact duckdb version,
which it pins) and is loaded from its file.

Two tables, built through our own write paths: a partitioned change-log-style table (partition
overwrite, append with a null partition value, overwrite again: removes must be honoured) and a
current-style table (``replace`` sorted by key, then a MERGE, ``upsert_newer``). Columns: int,
string, decimal(10,2), timestamp (UTC), date, a struct with a timestamp inside, and the
``ingest_date`` date partition. Timestamps must be Parquet INT64 TIMESTAMP(MICROS, UTC), never
INT96; the add actions' statistics must hold the files' true row counts and bounds.
"""

import datetime as dt
import json
import re
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import types as T

from cdc_platform import lake
from cdc_platform.lake import data_files
from tests.delta_readers import delta_rs, delta_scan, duckdb_connection

pytestmark = pytest.mark.spark

SEQ, PARTIAL = "__sequence", "__columns"
TIMESTAMPS = ("ts", "info.at")  # Parquet column paths of the timestamp columns
DAY1, DAY2 = dt.date(2024, 3, 1), dt.date(2024, 3, 2)


def _ts(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=dt.UTC)


INFO = T.StructType([T.StructField("tag", T.StringType()), T.StructField("at", T.TimestampType())])
BASE = [
    T.StructField("id", T.IntegerType()),
    T.StructField("name", T.StringType()),
    T.StructField("amount", T.DecimalType(10, 2)),
    T.StructField("ts", T.TimestampType()),
    T.StructField("day", T.DateType()),
    T.StructField("info", INFO),
]
HISTORY = T.StructType([*BASE, T.StructField("ingest_date", T.DateType())])
CURRENT = T.StructType([*BASE, T.StructField(SEQ, T.StringType())])
MERGE = T.StructType([*CURRENT.fields, T.StructField(PARTIAL, T.ArrayType(T.StringType()))])

# Rows as (id, name, amount, ts, day, info): non-ASCII text, pre-epoch and sub-millisecond
# times, a leap day, the largest decimal(10,2), and nulls everywhere (a whole-null struct too).
R1 = (1, "alice", Decimal("12.34"), _ts(2024, 3, 1, 8, 0, 0, 1), dt.date(1990, 5, 17),
      {"tag": "a", "at": _ts(2024, 3, 1, 8, 0, 0, 500_000)})  # fmt: skip
R2 = (2, "bøb ü €", Decimal("-0.05"), _ts(1969, 12, 31, 23, 59, 59, 999_999),
      dt.date(1969, 7, 20), None)  # fmt: skip
R3 = (3, None, None, None, None, {"tag": "c", "at": None})
R4 = (4, "dave", Decimal("99999999.99"), _ts(2024, 3, 2, 23, 59, 59, 999_999),
      dt.date(2024, 2, 29), {"tag": None, "at": _ts(2000, 1, 1)})  # fmt: skip
R5 = (5, "", Decimal("0.00"), _ts(2024, 3, 2, 0, 0, 0, 123_457), dt.date(2024, 3, 2),
      {"tag": "e", "at": _ts(2024, 3, 2, 12)})  # fmt: skip
R6 = (6, "no date", Decimal("1.00"), _ts(2030, 1, 1), None, None)
R1_NEW = (1, "alice 2", Decimal("43.21"), _ts(2024, 3, 1, 9, 30, 0, 250), dt.date(1990, 5, 17),
          {"tag": "a2", "at": _ts(2024, 3, 1, 9, 30)})  # fmt: skip
R7 = (7, "zed", Decimal("7.77"), _ts(2024, 3, 1, 23, 59, 59, 999_999), dt.date(2024, 3, 1),
      {"tag": "g", "at": None})  # fmt: skip
R2_NEW = (2, "bob updated", Decimal("2.50"), _ts(2024, 3, 3, 1, 2, 3, 456_789),
          dt.date(2024, 3, 3), {"tag": "b2", "at": _ts(2024, 3, 3)})  # fmt: skip
R3_OLD = (3, "stale", Decimal("3.00"), _ts(2099, 1, 1), dt.date(2099, 1, 1), None)
R8 = (8, "new key", Decimal("8.80"), _ts(2024, 3, 3, 4, 5, 6, 7), dt.date(2024, 3, 3), None)

NAMES = [f.name for f in BASE]


def _expected_history() -> list[dict]:
    rows = [(R1_NEW, DAY1), (R4, DAY2), (R5, DAY2), (R6, None), (R7, DAY1)]
    return [dict(zip(NAMES, r, strict=True)) | {"ingest_date": d} for r, d in rows]


def _expected_current() -> list[dict]:
    rows = [(R1, "00001"), (R2_NEW, "00002"), (R3, "00001"), (R8, "00002")]
    return [dict(zip(NAMES, r, strict=True)) | {SEQ: s} for r, s in rows]


@pytest.fixture(scope="module")
def tables(spark, tmp_path_factory) -> dict[str, str]:
    """The two tables, written through ``cdc_platform.lake``: name -> uri."""
    root = tmp_path_factory.mktemp("delta-compat")
    history, current = str(root / "history"), str(root / "current")

    def dated(rows, day):
        return spark.createDataFrame([(*r, day) for r in rows], HISTORY)

    lake.overwrite_partitions(dated([R1, R2, R3], DAY1), history, [DAY1.isoformat()])
    # A null partition value (Spark's __HIVE_DEFAULT_PARTITION__ folder, null in the log).
    lake.append(dated([R4, R5], DAY2).union(dated([R6], None)), history)
    # Replaces DAY1's files: R2 and R3 are gone from the snapshot, still on disk.
    lake.overwrite_partitions(dated([R1_NEW, R7], DAY1), history, [DAY1.isoformat()])

    first = spark.createDataFrame([(*r, "00001") for r in (R1, R2, R3)], CURRENT)
    lake.replace(first, current, lake.TableState(changelog_version=1), key=["id"], rows=3)
    batch = [(*R2_NEW, "00002", None), (*R3_OLD, "00000", None), (*R8, "00002", None)]
    lake.upsert_newer(
        spark,
        current,
        spark.createDataFrame(batch, MERGE),
        ["id"],
        SEQ,
        PARTIAL,
        lake.TableState(changelog_version=2),
    )
    return {"history": history, "current": current}


def _sorted(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: r["id"])


def _files(uri: str) -> list[str]:
    return DeltaTable(uri).file_uris()


@pytest.mark.parametrize("name", ["history", "current"])
def test_spark_delta_rs_and_duckdb_read_the_same_rows(spark, tables, name):
    uri = tables[name]
    expected = _expected_history() if name == "history" else _expected_current()
    ours = delta_rs(uri)
    assert _sorted(ours) == expected
    spark_rows = lake.read(spark, uri).toArrow()
    assert spark_rows.column_names == ours.column_names
    assert _sorted(spark_rows) == expected
    theirs = delta_scan(uri)
    assert sorted(theirs.column_names) == sorted(ours.column_names)
    assert _sorted(theirs) == expected


@pytest.mark.parametrize("name", ["history", "current"])
def test_types_are_the_same_in_every_reader(spark, tables, name):
    uri = tables[name]
    ours = pa.schema(DeltaTable(uri).schema())
    assert ours.field("ts").type == pa.timestamp("us", tz="UTC")
    assert ours.field("info").type.field("at").type == pa.timestamp("us", tz="UTC")
    assert ours.field("amount").type == pa.decimal128(10, 2)
    assert ours.field("day").type == pa.date32()
    if name == "history":
        assert ours.field("ingest_date").type == pa.date32()
    spark_types = {f.name: f.dataType for f in lake.read(spark, uri).schema.fields}
    assert spark_types == {f.name: f.dataType for f in (HISTORY if name == "history" else CURRENT)}
    described = (
        duckdb_connection().execute(f"DESCRIBE SELECT * FROM delta_scan('{uri}')").fetchall()
    )
    duck = {row[0]: row[1] for row in described}
    assert duck["id"] == "INTEGER" and duck["name"] == "VARCHAR"
    assert duck["amount"] == "DECIMAL(10,2)" and duck["day"] == "DATE"
    assert duck["ts"] == "TIMESTAMP WITH TIME ZONE"
    assert "TIMESTAMP WITH TIME ZONE" in duck["info"]
    if name == "history":
        assert duck["ingest_date"] == "DATE"


@pytest.mark.parametrize("name", ["history", "current"])
def test_duckdb_data_skipping_keeps_the_bounds(tables, name):
    """Filters DuckDB pushes into delta_scan (file skipping on our statistics) lose no row:
    exact matches on the smallest and largest keys, strings, dates and timestamps. (DuckDB
    1.5.5 skips files on int, string, date and partition bounds; on timestamps it reads every
    file, for delta-rs's own tables too.)"""
    uri = tables[name]
    rows = _sorted(delta_rs(uri))
    for column in ("id", "name", "day", "ts"):
        values = [r[column] for r in rows if r[column] is not None]
        for value in (min(values), max(values)):
            want = sorted(r["id"] for r in rows if r[column] == value)
            got = delta_scan(uri, f'WHERE "{column}" = ?', [value])
            assert sorted(got["id"].to_pylist()) == want, (column, value)


def test_duckdb_skips_files_on_our_statistics(tables):
    """DuckDB does read our statistics: a key lookup scans fewer files than the table has."""
    uri = tables["history"]
    sql = f"EXPLAIN ANALYZE SELECT id FROM delta_scan('{uri}') WHERE id = 6"
    plan = duckdb_connection().execute(sql).fetchall()[0][1]
    scanned = re.search(r"Scanning Files: (\d+)/(\d+)", plan)
    assert scanned, plan
    assert (int(scanned[1]), int(scanned[2])) == (1, len(_files(uri))), plan


@pytest.mark.parametrize("name", ["history", "current"])
def test_timestamps_are_int64_micros_utc_never_int96(tables, name):
    uri = tables[name]
    on_disk = sorted(str(p) for p in Path(uri).rglob("*.parquet"))
    assert set(_files(uri)) <= set(on_disk)  # replaced files stay until vacuum
    for file in on_disk:
        schema = pq.read_metadata(file).schema
        columns = {schema.column(i).path: schema.column(i) for i in range(len(schema))}
        assert not [p for p, c in columns.items() if c.physical_type == "INT96"], file
        for path in TIMESTAMPS:
            column = columns[path]
            logical = json.loads(column.logical_type.to_json())
            assert column.physical_type == "INT64", (file, path)
            assert logical["Type"] == "Timestamp", (file, path, logical)
            assert logical["isAdjustedToUTC"] is True, (file, path, logical)
            assert logical["timeUnit"] == "microseconds", (file, path, logical)
        arrow = pq.read_schema(file)
        assert arrow.field("ts").type == pa.timestamp("us", tz="UTC")


def test_files_sit_in_the_tables_partition_folders(tables):
    """The log names files where every reader expects them: in the partition folders (the
    write's staging folder is gone), partition values matching the folder names."""
    for name, uri in tables.items():
        actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True))
        for row in actions.to_pylist():
            path = row["path"]
            assert not path.startswith(data_files.STAGING_PREFIX), path
            assert not Path(path).is_absolute() and "://" not in path, path
            assert Path(uri, path).is_file(), path
            if name == "history":
                day = row["partition.ingest_date"]
                folder = "__HIVE_DEFAULT_PARTITION__" if day is None else str(day)
                assert Path(path).parent.name == f"ingest_date={folder}", path
        assert not list(Path(uri).glob(f"{data_files.STAGING_PREFIX}*"))


def _column(table: pa.Table, path: str) -> pa.ChunkedArray | pa.Array:
    head, *rest = path.split(".")
    column = table[head].combine_chunks()
    for name in rest:
        column = pc.struct_field(column, name)
    return column


@pytest.mark.parametrize("name", ["history", "current"])
def test_statistics_are_the_files_true_counts_and_bounds(tables, name):
    uri = tables[name]
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True))
    assert actions.num_rows > 0
    bounded = ["id", "name", "ts", "day", "info.tag", "info.at"]
    for column in bounded:
        assert f"min.{column}" in actions.column_names, (column, actions.column_names)
        assert f"max.{column}" in actions.column_names, (column, actions.column_names)
        assert f"null_count.{column}" in actions.column_names, (column, actions.column_names)
    for row in actions.to_pylist():
        data = pq.ParquetFile(Path(uri, row["path"])).read()
        assert row["num_records"] == data.num_rows, row["path"]
        for column in bounded:
            values = _column(data, column)
            assert row[f"null_count.{column}"] == values.null_count, (row["path"], column)
            assert row[f"min.{column}"] == pc.min(values).as_py(), (row["path"], column)
            assert row[f"max.{column}"] == pc.max(values).as_py(), (row["path"], column)
    table = delta_rs(uri)
    marked = sum(d.cardinality for d in lake.deletion_vectors_of(uri).values())
    live = sum(actions["num_records"].to_pylist()) - marked  # numRecords counts marked rows
    assert live == table.num_rows == lake.row_count(uri)
    for column in ("ts", "id", "name", "day"):
        assert lake.max_stat(uri, column) == pc.max(table[column]).as_py(), column


def test_tables_are_checkpointed_every_ten_commits_and_read_the_same(spark, tmp_path):
    """A reader replays the log's commits since the last checkpoint: the tables we create are
    checkpointed every 10 commits (delta-rs's default is 100), and a checkpointed snapshot
    reads the same in delta-rs and DuckDB."""
    uri = str(tmp_path / "checkpointed")
    for i in range(12):
        lake.append(spark.createDataFrame([(i, f"row {i}")], "id int, name string"), uri)
    log = Path(uri, "_delta_log")
    assert [p.name for p in sorted(log.glob("*.checkpoint.parquet"))] == [
        "00000000000000000009.checkpoint.parquet"
    ]
    assert sorted(delta_rs(uri)["id"].to_pylist()) == list(range(12))
    assert sorted(delta_scan(uri)["id"].to_pylist()) == list(range(12))
