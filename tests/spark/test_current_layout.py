"""Current-table layout: written sorted by key in bounded files; a merge (in Spark) rewrites
only the files holding a key it changes, writes new keys to new files, and gives the same rows
whatever the layout."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import (
    ColumnProperties,
    CommitProperties,
    DeltaTable,
    WriterProperties,
    write_deltalake,
)
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.lake import commit, merge
from cdc_platform.quality import validations
from cdc_platform.steps.current import merge_current
from cdc_platform.steps.history import update_history

pytestmark = pytest.mark.spark

SEQ, PARTIAL = "__sequence", "__columns"


@pytest.fixture(autouse=True)
def small_files(monkeypatch):
    # Files of a few thousand rows, so a few thousand rows make a table of several files.
    monkeypatch.setattr(commit, "ROWS_PER_FILE", 4_000)


@pytest.fixture(autouse=True, params=["by file", "shuffled"])
def join(request, monkeypatch):
    """Both ways a merge joins its batch with the table: broadcast to the tasks reading the
    table's files, and (past ``BROADCAST_ROWS``) a shuffle of both."""
    if request.param == "shuffled":
        monkeypatch.setattr(merge, "BROADCAST_ROWS", 0)
    else:  # by file into tables of any size
        monkeypatch.setattr(merge, "BY_FILE_ABOVE_ROWS", -1)
    return request.param


def _rows(ids, seq: int, key: str = "id") -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            key: ids,
            "v": [f"{seq}-{i}" for i in ids],
            SEQ: [f"{seq:05d}"] * len(ids),
            PARTIAL: pa.nulls(len(ids), pa.list_(pa.string())),
        }
    )


def _ranges(uri: str, col: str = "id") -> list[tuple]:
    adds = pa.table(DeltaTable(uri).get_add_actions(flatten=True))
    return sorted(zip(adds[f"min.{col}"].to_pylist(), adds[f"max.{col}"].to_pylist(), strict=True))


def _upsert(spark, uri: str, data: pa.Table, key: str = "id", state=None) -> tuple[int, int]:
    """Merge; returns (files rewritten, files before)."""
    before = set(DeltaTable(uri).file_uris()) if lake.exists(uri) else set()
    lake.upsert_newer(
        spark, uri, spark.createDataFrame(data), [key], SEQ, PARTIAL, state or lake.TableState()
    )
    return len(before - set(DeltaTable(uri).file_uris())), len(before)


def _table(uri: str, key: str = "id") -> dict:
    t = DeltaTable(uri).to_pyarrow_table().to_pydict()
    return dict(zip(t[key], t["v"], strict=True))


def test_first_write_is_sorted_in_bounded_files(spark, tmp_path):
    uri = str(tmp_path / "cur")
    _upsert(spark, uri, _rows(np.random.default_rng(0).permutation(20_000).tolist(), 1))
    ranges = _ranges(uri)
    assert len(ranges) > 3
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # disjoint


def test_a_merge_rewrites_only_the_files_holding_its_keys(spark, tmp_path):
    uri = str(tmp_path / "cur")
    _upsert(spark, uri, _rows(range(20_000), 1))
    expected = {i: f"1-{i}" for i in range(20_000)}
    ranges = _ranges(uri)
    # Keys in the last file, and new keys past the end.
    batch = _rows(range(ranges[-1][0], 20_500), 2)
    assert _upsert(spark, uri, batch)[0] == 1
    expected |= {i: f"2-{i}" for i in range(ranges[-1][0], 20_500)}
    # A key in the first file and one in the middle: two files.
    middle = ranges[len(ranges) // 2][0]
    assert _upsert(spark, uri, _rows([3, middle], 3))[0] == 2
    expected |= {3: "3-3", middle: f"3-{middle}"}
    # Only new keys, before and after every file: nothing rewritten.
    assert _upsert(spark, uri, _rows([-7, 50_000], 4))[0] == 0
    expected |= {-7: "4--7", 50_000: "4-50000"}
    # An older batch changes nothing and rewrites nothing.
    assert _upsert(spark, uri, _rows(range(0, 20_000, 97), 1))[0] == 0
    assert _table(uri) == expected


def test_a_rewritten_file_keeps_its_key_range_and_new_keys_get_a_file(spark, tmp_path, join):
    uri = str(tmp_path / "cur")
    _upsert(spark, uri, _rows(range(0, 40_000, 2), 1))
    ranges = _ranges(uri)
    # An update in the second and the fourth file, and new keys past the end.
    batch = [ranges[1][0] + 2, ranges[3][1], 50_000, 50_001]
    assert _upsert(spark, uri, _rows(batch, 2))[0] == 2
    if join == "by file":  # each file written again as itself; the new keys in a file of theirs
        assert _ranges(uri) == [*ranges, (50_000, 50_001)]
    rows = DeltaTable(uri).to_pyarrow_table()
    for path in DeltaTable(uri).file_uris():  # every file is sorted by key
        ids = pq.read_table(path.removeprefix("file://"))["id"].to_pylist()
        assert ids == sorted(ids)
    assert rows.num_rows == 20_002
    assert _table(uri)[ranges[3][1]] == f"2-{ranges[3][1]}"


def test_a_delete_writes_each_file_again_as_itself(spark, tmp_path):
    # A truncate or a tombstone purge deletes rows: each file keeps its order and its range, so
    # a later merge by file (which keeps a file's order) finds the table still sorted.
    uri = str(tmp_path / "cur")
    _upsert(spark, uri, _rows(range(0, 40_000, 2), 1))
    ranges = _ranges(uri)
    gone = F.col("id") % 3 == 0
    assert lake.delete_rows(spark, uri, gone, by_file=True) == len(range(0, 40_000, 6))
    after = _ranges(uri)
    assert len(after) == len(ranges)
    assert all(lo <= a and b <= hi for (lo, hi), (a, b) in zip(ranges, after, strict=True))
    for path in DeltaTable(uri).file_uris():
        ids = pq.read_table(path.removeprefix("file://"))["id"].to_pylist()
        assert ids == sorted(ids)
    assert sorted(_table(uri)) == [i for i in range(0, 40_000, 2) if i % 3]


def test_merges_are_right_on_an_unsorted_table(spark, tmp_path):
    # A table written before the layout existed: random order, overlapping file ranges.
    uri = str(tmp_path / "cur")
    first = _rows(np.random.default_rng(1).permutation(20_000).tolist(), 1)
    write_deltalake(
        uri,
        first.drop_columns([PARTIAL]),
        mode="append",
        target_file_size=16 * 1024,
        writer_properties=WriterProperties(max_row_group_size=1024),
    )
    expected = {i: f"1-{i}" for i in range(20_000)}
    for seq, ids in enumerate(
        [range(19_000, 21_000), np.random.default_rng(2).choice(25_000, 500, replace=False)], 2
    ):
        _upsert(spark, uri, _rows([int(i) for i in ids], seq))
        expected |= {int(i): f"{seq}-{i}" for i in ids}
    assert _table(uri) == expected


def test_string_keys(spark, tmp_path):
    uri = str(tmp_path / "cur")
    names = [f"k'{i:05d}" for i in range(10_000)]
    _upsert(spark, uri, _rows(names, 1, "k"), "k")
    rewritten, files = _upsert(spark, uri, _rows(["k'09990", "k'09999", "zz"], 2, "k"), "k")
    assert (rewritten, files > 1) == (1, True)
    assert _table(uri, "k") == {n: f"1-{n}" for n in names} | {
        n: f"2-{n}" for n in ["k'09990", "k'09999", "zz"]
    }


def test_new_keys_inside_every_files_range_rewrite_nothing(spark, tmp_path):
    uri = str(tmp_path / "cur")
    _upsert(spark, uri, _rows(range(0, 200_000, 2), 1))
    batch = _rows(range(1, 200_000, 998), 2)  # odd: all new keys, in every file's range
    files = lake.merge.candidate_files(spark, DeltaTable(uri), spark.createDataFrame(batch), "id")
    assert 10 < len(files) <= len(DeltaTable(uri).file_uris())  # most read...
    assert _upsert(spark, uri, batch)[0] == 0  # ...none rewritten
    assert len(_table(uri)) == 100_000 + len(batch)


def test_replace_with_a_key_writes_the_layout(spark, tmp_path):
    uri = str(tmp_path / "cur")
    data = _rows(np.random.default_rng(3).permutation(20_000).tolist(), 1).drop_columns([PARTIAL])
    lake.replace(
        spark.createDataFrame(data), uri, lake.TableState(key=["id"]), key=["id"], rows=20_000
    )
    ranges = _ranges(uri)
    assert len(ranges) > 3 and all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert lake.state(uri) == lake.TableState(key=["id"])


def test_a_merge_is_one_commit_and_a_no_op_merge_one_empty_one(spark, tmp_path):
    uri = str(tmp_path / "cur")
    _upsert(spark, uri, _rows(range(100), 1))
    version = lake.version(uri)
    _upsert(spark, uri, _rows(range(10), 2))
    assert lake.version(uri) == version + 1
    # Nothing newer: no data commit, but the state is recorded once.
    _upsert(spark, uri, _rows(range(10), 1), state=lake.TableState(changelog_version=7))
    assert lake.version(uri) == version + 2
    assert lake.state(uri).changelog_version == 7


def _changes(spark, ids, op: str, seq: int):
    """Change-log rows (op, key, images, sequence) for ``ids``."""
    after = F.struct(F.col("id"), F.lit(f"{seq}").alias("v"))
    return spark.createDataFrame([(int(i),) for i in ids], "id bigint").select(
        F.lit(op).alias("op"),
        F.struct("id").alias("key"),
        F.lit(None).cast("struct<id:bigint,v:string>").alias("before"),
        after.alias("after"),
        F.lit(None).cast("array<string>").alias("after_columns"),
        F.format_string("%09d", F.col("id") + F.lit(seq * 1_000_000)).alias("sequence"),
        F.current_timestamp().alias("event_time"),
        F.lit("2026-01-01").cast("date").alias(lake.PARTITION_COLUMN),
    )


def _created(spark, warehouse, ids) -> tuple[str, CommitProperties]:
    """Table ``t`` of source ``s`` merged from creates of ``ids``: its change log's URI and the
    properties its appends take."""
    log = lake.TableRef(lake.CHANGELOG, "s", "t").uri(warehouse)
    props = lake.properties(lake.TableState(key=["id"], qualified="t"))
    first = _changes(spark, ids, "c", 1)
    lake.append(first, log, partition_by=[lake.PARTITION_COLUMN], props=props)
    merge_current(spark, warehouse, "s", "t")
    return log, props


def _current_checks(spark, warehouse, merged) -> list[bool]:
    """Whether the current table's suite and the merge's row balance pass, on what it wrote."""
    balance = {"live_before": merged.live_before, "made_live": merged.made_live,
               "made_dead": merged.made_dead, "truncated_live": merged.truncated_live,
               "live_after": merged.rows}  # fmt: skip
    source = SourceConfig(name="s", format="debezium", tables=[TableConfig(name="t")])
    runs = validations.validate_current(
        spark, warehouse, source, "t", balance, merged.written, merged.merged_changes
    )
    return [run.success for run in runs]


def test_a_merge_and_its_checks_read_only_the_files_that_may_hold_its_keys(
    spark, tmp_path, monkeypatch
):
    # A merge's cost follows its batch, not the table: with the data file of the lowest keys
    # gone from disk, a batch of the highest keys still merges and passes its checks (no step
    # reads, or lists, the whole table). Pruned at any size: a small table is read whole.
    monkeypatch.setattr(merge, "PRUNE_ABOVE_ROWS", 0)
    warehouse = tmp_path / "warehouse"
    log, props = _created(spark, warehouse, range(20_000))
    uri = lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse)
    adds = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).sort_by("min.id")
    assert adds.num_rows > 3
    (Path(uri) / adds["path"][0].as_py()).unlink()

    batch = _changes(spark, range(19_990, 20_010), "u", 2)
    lake.append(batch, log, partition_by=[lake.PARTITION_COLUMN], props=props)
    merged = merge_current(spark, warehouse, "s", "t")
    assert (merged.updated, merged.inserted, merged.rows) == (10, 10, 20_010)
    assert _current_checks(spark, warehouse, merged) == [True, True]


@pytest.mark.parametrize("span_rows", [0, None], ids=["keys matched", "key range taken"])
def test_a_key_change_rewrites_the_file_of_the_key_it_moves_away_from(
    spark, tmp_path, monkeypatch, span_rows
):
    # The files a merge reads are found from the keys its batch touches: the key of each change
    # and, for a key change, the key it leaves (its before image's). Both ways of finding them:
    # each key matched to the files' ranges by a Spark job, or every file meeting the range of
    # the change log's key statistics taken as it is (a batch within a file or two).
    monkeypatch.setattr(merge, "PRUNE_ABOVE_ROWS", 0)
    if span_rows is not None:
        monkeypatch.setattr(merge, "SPAN_ROWS", span_rows)
    warehouse = tmp_path / "warehouse"
    log, props = _created(spark, warehouse, range(20_000))
    uri = lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse)
    moved = _changes(spark, [30_000], "u", 2).withColumn(
        "before", F.struct(F.lit(5).cast("bigint").alias("id"), F.lit("1").alias("v"))
    )
    lake.append(moved, log, partition_by=[lake.PARTITION_COLUMN], props=props)
    added = lake.files_added_since(log, lake.state(uri).changelog_version)
    assert lake.key_span(log, added, "id") == (5, 30_000)

    merged = merge_current(spark, warehouse, "s", "t")
    rows = {r["id"]: (r["v"], r["__deleted"]) for r in lake.read(spark, uri).collect()}
    assert (rows[5], rows[30_000]) == ((None, True), ("2", False))
    assert (merged.rows, merged.made_live, merged.made_dead) == (20_000, 1, 1)
    assert _current_checks(spark, warehouse, merged) == [True, True]


def test_key_span_is_none_when_a_file_has_keys_without_bounds(spark, tmp_path):
    warehouse = tmp_path / "warehouse"
    log, props = _created(spark, warehouse, range(10))
    first = lake.files(log)
    assert lake.key_span(log, first, "id") == (0, 9)  # the inserts' before images are null
    assert lake.key_span(log, [], "id") is None
    # A file whose statistics give no bounds (as a writer without statistics leaves it).
    write_deltalake(
        log,
        _changes(spark, [20], "c", 2).toArrow(),
        mode="append",
        partition_by=[lake.PARTITION_COLUMN],
        writer_properties=WriterProperties(
            default_column_properties=ColumnProperties(statistics_enabled="NONE")
        ),
    )
    assert lake.key_span(log, lake.files(log), "id") is None


def test_a_batch_of_new_keys_reads_no_row_of_the_table(spark, tmp_path, monkeypatch):
    # Keys past every file's key range (inserts, the usual live batch): the merge reads no row
    # of the table and counts what it makes live from its own write. With every data file of
    # the table gone from disk it still merges, and its balance check passes.
    monkeypatch.setattr(merge, "PRUNE_ABOVE_ROWS", 0)
    warehouse = tmp_path / "warehouse"
    log, props = _created(spark, warehouse, range(1000))
    uri = lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse)
    for path in DeltaTable(uri).get_add_actions(flatten=True).column("path").to_pylist():
        (Path(uri) / path).unlink()

    # New keys 1000-1009, 1005 then deleted; 1010 created and deleted in the same batch.
    batch = _changes(spark, range(1000, 1011), "c", 2).unionByName(
        _changes(spark, [1005, 1010], "d", 3)
    )
    lake.append(batch, log, partition_by=[lake.PARTITION_COLUMN], props=props)
    merged = merge_current(spark, warehouse, "s", "t")
    counts = (merged.made_live, merged.made_dead, merged.rows, merged.deleted_rows)
    assert counts == (9, 0, 1009, 2)
    written = lake.read(spark, uri, only_files=[str(Path(uri) / f) for f in merged.written])
    rows = {(r["id"], r["v"], r["__deleted"]) for r in written.collect()}
    live = {(i, "2", False) for i in range(1000, 1010) if i != 1005}
    assert rows == live | {(1005, None, True), (1010, None, True)}  # tombstones
    assert _current_checks(spark, warehouse, merged) == [True, True]


@pytest.mark.slow
def test_small_files_are_folded_into_a_rewrite_once_they_are_many(spark, tmp_path, monkeypatch):
    # Every run that inserts keys writes a small file of its own; once a table holds COMPACT_AT
    # of them, the next rewrite folds them in, so files (and every read that lists them) stay
    # bounded over a day of runs. The rows are those of a rebuild, for current and history.
    monkeypatch.setattr(merge, "COMPACT_AT", 2)
    warehouse = tmp_path / "warehouse"
    log = lake.TableRef(lake.CHANGELOG, "s", "t").uri(warehouse)
    props = lake.properties(lake.TableState(key=["id"], qualified="t"))
    table = TableConfig(name="t")
    first = _changes(spark, range(1000), "c", 1)
    lake.append(first, log, partition_by=[lake.PARTITION_COLUMN], props=props)
    merge_current(spark, warehouse, "s", "t")
    update_history(spark, warehouse, "s", table)
    most = {}
    for run in range(2, 5):
        # Two new keys each run: a file of their own, unless small files are folded in.
        batch = _changes(spark, [1000 + 2 * run, 1001 + 2 * run], "c", run)
        lake.append(batch, log, partition_by=[lake.PARTITION_COLUMN], props=props)
        merge_current(spark, warehouse, "s", "t")
        update_history(spark, warehouse, "s", table)
        for layer in (lake.CURRENT, lake.HISTORY):
            files = len(lake.files(lake.TableRef(layer, "s", "t").uri(warehouse)))
            most[layer] = max(most.get(layer, 0), files)
    current = lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse)
    history = lake.TableRef(lake.HISTORY, "s", "t").uri(warehouse)
    # Without folding, each run adds a file: 1 + 3 after three runs. The third folds the two
    # small files in with its own rows.
    assert most == {lake.CURRENT: 3, lake.HISTORY: 3}
    assert len(lake.files(current)) == len(lake.files(history)) == 2
    got = {n: _sorted_rows(u) for n, u in (("current", current), ("history", history))}
    merge_current(spark, warehouse, "s", "t", full_refresh=True)
    update_history(spark, warehouse, "s", table, full_refresh=True)
    assert got == {n: _sorted_rows(u) for n, u in (("current", current), ("history", history))}
    assert lake.state(current).rows == [1006, 0]


def _sorted_rows(uri: str) -> list[dict]:
    return sorted(lake.read_arrow(uri).to_pylist(), key=lambda r: [str(v) for v in r.values()])
