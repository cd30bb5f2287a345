"""Current-state merge semantics on hand-built change-log batches."""

import pytest
from deltalake.exceptions import CommitFailedError

from cdc_platform import lake
from cdc_platform.catalog import TableConfig
from cdc_platform.lake import merge
from cdc_platform.steps.current import current_rows, merge_current
from tests.delta_readers import agreed

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True, params=["shuffled", "by file"])
def join(request, monkeypatch):
    """Both ways a merge joins its batch with the table: these tables are small, so shuffled
    unless by file is asked for (as a batch of a large table would be)."""
    if request.param == "by file":
        monkeypatch.setattr(merge, "BY_FILE_ABOVE_ROWS", -1)


SCHEMA = (
    "op string, key struct<id:int>, before struct<id:int,a:string,b:string>, "
    "after struct<id:int,a:string,b:string>, after_columns array<string>, sequence string, "
    "event_time timestamp, ingest_date date"
)


def _change(op, seq, id_, a=None, b=None, cols=None, before_id=None):
    after = None if op in ("d", "t") else (id_, a, b)
    before = (before_id if before_id is not None else id_, None, None) if op in ("d", "u") else None
    key = None if op == "t" else (id_ if op != "d" else before[0],)
    return (op, key, before, after, cols, f"{seq:05d}", None, None)


def _write_batch(spark, warehouse, day, changes):
    df = (
        spark.createDataFrame(changes, SCHEMA)
        .selectExpr("*", f"cast('{day}' as date) as ingest_date_")
        .drop("ingest_date")
        .withColumnRenamed("ingest_date_", "ingest_date")
    )
    uri = lake.TableRef(lake.CHANGELOG, "s", "t").uri(warehouse)
    lake.overwrite_partitions(df, uri, [day], state=lake.TableState(key=["id"]))


def _state(spark, warehouse, options=None):
    merged = merge_current(spark, warehouse, "s", "t", options=options)
    # The live and tombstone counts a merge keeps in the table's state (never counted from the
    # whole table) are the table's.
    uri = lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse)
    table = lake.read_arrow(uri)
    agreed(spark, uri)  # Spark, delta-rs and DuckDB read the same rows
    tombstones = sum(table["__deleted"].to_pylist())
    assert (merged.rows, merged.deleted_rows) == (table.num_rows - tombstones, tombstones)
    rows = current_rows(spark, warehouse, "s", "t")
    return sorted(tuple(r.values()) for r in rows.toArrow().to_pylist())


def test_partial_update_keeps_other_columns(spark, warehouse):
    _write_batch(spark, warehouse, "2026-01-01", [_change("c", 1, 1, "a1", "b1")])
    assert _state(spark, warehouse) == [(1, "a1", "b1")]
    _write_batch(spark, warehouse, "2026-01-02", [_change("u", 2, 1, a="A", cols=["id", "a"])])
    assert _state(spark, warehouse) == [(1, "A", "b1")]


def test_partial_updates_fold_within_a_batch(spark, warehouse):
    _write_batch(spark, warehouse, "2026-01-01", [
        _change("c", 1, 1, "a1", "b1"),
        _change("u", 3, 1, b="B3", cols=["id", "b"]),
        _change("u", 2, 1, a="A2", cols=["id", "a"]),
    ])  # fmt: skip
    assert _state(spark, warehouse) == [(1, "A2", "B3")]


def test_late_older_events_and_deletes_do_not_resurrect(spark, warehouse):
    _write_batch(spark, warehouse, "2026-01-02", [
        _change("c", 5, 1, "new", "new"), _change("d", 6, 2),
    ])  # fmt: skip
    _write_batch(spark, warehouse, "2026-01-01", [
        _change("u", 4, 1, "old", "old"), _change("c", 3, 2, "late", "late"),
    ])  # fmt: skip
    assert _state(spark, warehouse) == [(1, "new", "new")]


def test_key_change_moves_the_row(spark, warehouse):
    _write_batch(spark, warehouse, "2026-01-01", [
        _change("c", 1, 1, "a", "b"), _change("u", 2, 9, "a", "b", before_id=1),
    ])  # fmt: skip
    assert _state(spark, warehouse) == [(9, "a", "b")]


def test_truncate_empties_older_rows_only(spark, warehouse):
    _write_batch(spark, warehouse, "2026-01-01", [_change("c", 1, 1, "a", "b")])
    _state(spark, warehouse)
    _write_batch(spark, warehouse, "2026-01-02", [
        _change("t", 2, None), _change("c", 3, 2, "x", "y"),
    ])  # fmt: skip
    assert _state(spark, warehouse) == [(2, "x", "y")]
    _write_batch(spark, warehouse, "2026-01-03", [_change("c", 1, 5, "too", "late")])
    assert _state(spark, warehouse) == [(2, "x", "y")]


def test_rebuilding_and_replaying_converge(spark, warehouse):
    _write_batch(spark, warehouse, "2026-01-01", [
        _change("c", 1, 1, "a", "b"), _change("c", 2, 2, "c", "d"), _change("d", 3, 1),
    ])  # fmt: skip
    first = _state(spark, warehouse)
    _write_batch(spark, warehouse, "2026-01-01", [
        _change("c", 1, 1, "a", "b"), _change("c", 2, 2, "c", "d"), _change("d", 3, 1),
    ])  # fmt: skip
    assert _state(spark, warehouse) == first == [(2, "c", "d")]
    merge_current(spark, warehouse, "s", "t", full_refresh=True)
    rows = current_rows(spark, warehouse, "s", "t").toArrow().to_pylist()
    assert sorted(tuple(r.values()) for r in rows) == first


def test_an_older_full_image_does_not_overwrite_a_newer_row(spark, warehouse):
    # The batch's newest change is partial; its full image is older than the current row.
    _write_batch(spark, warehouse, "2026-01-02", [_change("u", 10, 1, "x", "y")])
    assert _state(spark, warehouse) == [(1, "x", "y")]
    _write_batch(spark, warehouse, "2026-01-01", [
        _change("c", 9, 1, "a", "b"), _change("u", 12, 1, a="P", cols=["id", "a"]),
    ])  # fmt: skip
    assert _state(spark, warehouse) == [(1, "P", "y")]


def test_older_partial_images_do_not_overwrite_a_newer_row(spark, warehouse):
    _write_batch(spark, warehouse, "2026-01-02", [_change("u", 10, 1, "x", "y")])
    _state(spark, warehouse)
    _write_batch(spark, warehouse, "2026-01-01", [
        _change("c", 1, 1, "a", "b"),
        _change("u", 8, 1, a="old", cols=["id", "a"]),
        _change("u", 12, 1, b="new", cols=["id", "b"]),
    ])  # fmt: skip
    assert _state(spark, warehouse) == [(1, "x", "new")]


def test_a_full_image_newer_than_the_row_still_replaces_it(spark, warehouse):
    _write_batch(spark, warehouse, "2026-01-01", [_change("c", 5, 1, "x", "y")])
    _state(spark, warehouse)
    _write_batch(spark, warehouse, "2026-01-02", [
        _change("u", 9, 1, "a", "b"), _change("u", 12, 1, a="P", cols=["id", "a"]),
    ])  # fmt: skip
    assert _state(spark, warehouse) == [(1, "P", "b")]


def test_ignored_null_updates_keep_a_newer_rows_value(spark, warehouse):
    options = TableConfig(name="t", ignore_null_updates=True)
    # A snapshot read: a full image (an update would count as partial with ignore_null_updates).
    _write_batch(spark, warehouse, "2026-01-02", [_change("r", 10, 1, "x", "y")])
    _state(spark, warehouse, options)
    # seq 12 sets only a (its null b is ignored): b keeps seq 10's value, not seq 9's.
    _write_batch(spark, warehouse, "2026-01-01", [
        _change("c", 9, 1, "a", "b"), _change("u", 12, 1, a="P"),
    ])  # fmt: skip
    assert _state(spark, warehouse, options) == [(1, "P", "y")]


def test_a_reprocessed_partition_without_a_change_removes_its_effect(spark, warehouse):
    _write_batch(spark, warehouse, "2026-01-01", [_change("c", 1, 1, "a", "b")])
    _write_batch(spark, warehouse, "2026-01-02", [
        _change("u", 5, 1, "late", "late"), _change("c", 6, 2, "gone", "gone"),
    ])  # fmt: skip
    assert _state(spark, warehouse) == [(1, "late", "late"), (2, "gone", "gone")]
    # The date is reprocessed and no longer holds those changes.
    _write_batch(spark, warehouse, "2026-01-02", [_change("c", 7, 3, "n", "n")])
    assert _state(spark, warehouse) == [(1, "a", "b"), (3, "n", "n")]
    tombstones = lake.read(spark, lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse))
    assert sorted(r["id"] for r in tombstones.collect()) == [1, 3]  # key 2 is gone, not hidden


def test_a_reprocessed_partition_that_loses_its_truncate_rebuilds(spark, warehouse):
    _write_batch(spark, warehouse, "2026-01-01", [_change("c", 1, 1, "a", "b")])
    _write_batch(spark, warehouse, "2026-01-02", [_change("t", 2, None)])
    assert _state(spark, warehouse) == []
    _write_batch(spark, warehouse, "2026-01-02", [_change("c", 3, 2, "x", "y")])
    assert _state(spark, warehouse) == [(1, "a", "b"), (2, "x", "y")]


def test_a_merges_checks_and_preview_read_only_what_it_changed(spark, warehouse):
    """The current table's checks and preview look at the rows a merge wrote and the keys they
    share, not the table: a later batch on keys 1000-1099 never reads the file of 1-100."""
    from cdc_platform.quality import frames

    _write_batch(spark, warehouse, "2026-01-01", [_change("c", i, i, "a") for i in range(1, 101)])
    _state(spark, warehouse)
    batch = [_change("c", 1000 + i, 1000 + i, "a") for i in range(100)]
    _write_batch(spark, warehouse, "2026-01-02", batch)
    _state(spark, warehouse)
    uri = lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse)
    assert len(lake.files(uri)) == 2  # new keys went to a file of their own
    _write_batch(spark, warehouse, "2026-01-03", [_change("u", 5000, 1050, "b")])
    merged = merge_current(spark, warehouse, "s", "t")
    assert merged.updated == 1 and merged.rows == 200
    assert len(merged.written) == 1 and set(merged.written) <= set(lake.files(uri))
    # Merge-on-read: the new row alone is written; its old row is marked in its file's DV.
    written = lake.read(spark, uri, only_files=merged.written).toArrow()
    assert written["id"].to_pylist() == [1050]
    # With the file whose key range it shares: every row of those keys, each once.
    frame = frames.current_frame(spark, warehouse, "s", "t", ["id"], merged.written)
    assert sorted(r["id"] for r in frame.toArrow().to_pylist()) == list(range(1000, 1100))
    # With the change-log files it merged: the rows of the keys it changed.
    frame = frames.current_frame(
        spark, warehouse, "s", "t", ["id"], merged.written, merged.merged_changes
    )
    assert [r["id"] for r in frame.toArrow().to_pylist()] == [1050]
    preview = current_rows(spark, warehouse, "s", "t", merged.written)
    assert preview.count() == 1
    # Nothing new: nothing written, nothing to read.
    assert merge_current(spark, warehouse, "s", "t").written == []


def test_a_merge_another_merge_overtook_runs_again_and_counts_right(spark, warehouse, monkeypatch):
    """Two runs merging one table at once (only runs past the queue can): the one whose table
    moved after it read its live-row count fails with ``TableMoved`` (transient: its step runs
    again) instead of recording that count plus its own changes; run again, it counts right."""
    _write_batch(spark, warehouse, "2026-01-01", [_change("c", 1, 1, "a"), _change("c", 2, 2, "b")])
    assert _state(spark, warehouse) == [(1, "a", None), (2, "b", None)]
    _write_batch(spark, warehouse, "2026-01-02", [_change("c", 3, 3, "c"), _change("d", 4, 2)])
    real, other = lake.upsert_newer, {}

    def overtaken_upsert(*args, **kwargs):
        if not other:  # the other run merges the same batch, whole, in between
            monkeypatch.setattr(lake, "upsert_newer", real)
            other["merged"] = merge_current(spark, warehouse, "s", "t")
        return real(*args, **kwargs)

    monkeypatch.setattr(lake, "upsert_newer", overtaken_upsert)
    with pytest.raises(lake.TableMoved, match="moved from version"):
        merge_current(spark, warehouse, "s", "t")
    assert other["merged"].rows == 2  # keys 1 and 3 live, key 2 deleted
    assert _state(spark, warehouse) == [(1, "a", None), (3, "c", None)]


def test_two_pinned_commits_from_one_version_cannot_both_land(spark, warehouse):
    """A commit under a ``Pin`` carries the ``cdc.pinned`` transaction id, so delta-rs fails
    the second of two commits made from the same version, even when neither removes a file (a
    blind append would otherwise commit over the other, and both count from one state)."""
    _write_batch(spark, warehouse, "2026-01-01", [_change("c", 1, 1, "a")])
    _state(spark, warehouse)
    uri = lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse)
    version, state = lake.version(uri), lake.state(uri)
    first, second = lake.Pin(uri, version), lake.Pin(uri, version)
    lake.record_state(uri, state, first)
    assert first.version == version + 1
    with pytest.raises(CommitFailedError):
        lake.record_state(uri, state, second)
    assert lake.version(uri) == version + 1
