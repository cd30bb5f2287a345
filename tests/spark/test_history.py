"""SCD type 2 history (``steps.history.update_history``) on hand-built change-log batches."""

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import TableConfig
from cdc_platform.steps.history import update_history
from tests.delta_readers import agreed

pytestmark = pytest.mark.spark

SCHEMA = (
    "op string, key struct<id:int>, before struct<id:int,a:string,b:string>, "
    "after struct<id:int,a:string,b:string>, after_columns array<string>, sequence string, "
    "event_time timestamp, ingest_date date"
)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
TABLE = TableConfig(name="t", history=True)


def _change(op, seq, id_, a=None, b=None, cols=None, before_id=None):
    after = None if op in ("d", "t") else (id_, a, b)
    before = (before_id if before_id is not None else id_, None, None) if op in ("d", "u") else None
    key = None if op == "t" else (id_ if op != "d" else before[0],)
    return (op, key, before, after, cols, _seq(seq), T0 + timedelta(seconds=seq), None)


def _seq(n):
    return None if n is None else f"{n:05d}"


def _write(spark, warehouse, day, changes):
    df = spark.createDataFrame(changes, SCHEMA).withColumn("ingest_date", F.lit(day).cast("date"))
    uri = lake.TableRef(lake.CHANGELOG, "s", "t").uri(warehouse)
    lake.overwrite_partitions(df, uri, [day], state=lake.TableState(key=["id"]))


def _history(spark, warehouse, table=TABLE, full_refresh=False):
    """Run the step; the history rows as (id, a, b, start, end, current, deleted, op)."""
    update_history(spark, warehouse, "s", table, full_refresh=full_refresh)
    return _rows(spark, warehouse)


def _rows(spark, warehouse):
    uri = lake.TableRef(lake.HISTORY, "s", "t").uri(warehouse)
    table = lake.read_arrow(uri)
    agreed(spark, uri)  # Spark, delta-rs and DuckDB read the same rows
    cols = ["id", "a", "b", "__start_at", "__end_at", "__is_current", "__is_deleted", "__op"]
    rows = [tuple(r[c] for c in cols) for r in table.to_pylist()]
    return sorted(rows, key=lambda r: (r[0], r[3]))


def _v(id_, a, b, start, end, op, deleted=False):
    return (id_, a, b, _seq(start), _seq(end), end is None, deleted, op)


def test_insert_update_delete_reinsert(spark, warehouse):
    _write(spark, warehouse, "2026-01-01", [
        _change("c", 1, 1, "a1", "b1"), _change("u", 2, 1, "a2", "b1"), _change("d", 3, 1),
        _change("d", 4, 1), _change("c", 5, 1, "a5", "b5"),
        _change("d", 1, 2), _change("c", 2, 2, "x", "y"),  # a delete of nothing adds nothing
    ])  # fmt: skip
    assert _history(spark, warehouse) == [
        _v(1, "a1", "b1", 1, 2, "c"),
        _v(1, "a2", "b1", 2, 3, "u"),
        _v(1, "a2", "b1", 3, 5, "d", deleted=True),  # keeps the values before the delete
        _v(1, "a5", "b5", 5, None, "c"),
        _v(2, "x", "y", 2, None, "c"),
    ]
    table = lake.read_arrow(lake.TableRef(lake.HISTORY, "s", "t").uri(warehouse)).to_pylist()
    first = next(r for r in table if r["id"] == 1 and r["__start_at"] == "00001")
    assert first["__start_time"] == T0 + timedelta(seconds=1)
    assert first["__end_time"] == T0 + timedelta(seconds=2)


def test_partial_images_keep_other_columns_and_carry_nulls(spark, warehouse):
    _write(spark, warehouse, "2026-01-01", [
        _change("c", 1, 1, "a1", "b1"),
        _change("u", 2, 1, None, "ignored", cols=["id", "a"]),  # a carried null is a value
        _change("u", 3, 1, "ignored", "b3", cols=["id", "b"]),
    ])  # fmt: skip
    assert _history(spark, warehouse) == [
        _v(1, "a1", "b1", 1, 2, "c"),
        _v(1, None, "b1", 2, 3, "u"),
        _v(1, None, "b3", 3, None, "u"),
    ]


def test_ignore_null_updates(spark, warehouse):
    _write(spark, warehouse, "2026-01-01", [
        _change("c", 1, 1, "a1", "b1"), _change("u", 2, 1, None, "b2"),
        _change("u", 3, 1, None, "b2"),  # changes nothing once nulls are ignored
        _change("c", 4, 2, None, "y"),  # an insert's null is a value
    ])  # fmt: skip
    table = TableConfig(name="t", history=True, ignore_null_updates=True)
    assert _history(spark, warehouse, table) == [
        _v(1, "a1", "b1", 1, 2, "c"),
        _v(1, "a1", "b2", 2, None, "u"),
        _v(2, None, "y", 4, None, "c"),
    ]


def test_untracked_change_updates_the_open_version(spark, warehouse):
    _write(spark, warehouse, "2026-01-01", [
        _change("c", 1, 1, "a1", "b1"), _change("u", 2, 1, "a1", "b2"),
        _change("u", 3, 1, "a3", "b2"), _change("u", 4, 1, "a3", "b4"),
    ])  # fmt: skip
    expected = [_v(1, "a1", "b2", 1, 3, "c"), _v(1, "a3", "b4", 3, None, "u")]
    table = TableConfig(name="t", history=True, track_history_column_list=["a"])
    assert _history(spark, warehouse, table) == expected
    table = TableConfig(name="t", history=True, track_history_except_column_list=["b"])
    assert _history(spark, warehouse, table, full_refresh=True) == expected


def test_duplicate_events_count_once(spark, warehouse):
    batch = [_change("c", 1, 1, "a1", "b1"), _change("u", 2, 1, "a2", "b2"), _change("d", 3, 1)]
    _write(spark, warehouse, "2026-01-01", batch + batch[1:])
    _history(spark, warehouse)
    _write(spark, warehouse, "2026-01-02", batch)  # the same events delivered again, later
    assert _history(spark, warehouse) == [
        _v(1, "a1", "b1", 1, 2, "c"),
        _v(1, "a2", "b2", 2, 3, "u"),
        _v(1, "a2", "b2", 3, None, "d", deleted=True),
    ]


def test_late_event_splits_a_version(spark, warehouse):
    _write(spark, warehouse, "2026-01-02", [
        _change("c", 1, 1, "a1", "b1"), _change("u", 5, 1, "a5", "b1"),
        _change("c", 2, 2, "x", "y"),
    ])  # fmt: skip
    assert _history(spark, warehouse) == [
        _v(1, "a1", "b1", 1, 5, "c"), _v(1, "a5", "b1", 5, None, "u"),
        _v(2, "x", "y", 2, None, "c"),
    ]  # fmt: skip
    _write(spark, warehouse, "2026-01-01", [_change("u", 3, 1, "a3", "b3")])
    result = update_history(spark, warehouse, "s", TABLE)
    assert _rows(spark, warehouse) == [
        _v(1, "a1", "b1", 1, 3, "c"), _v(1, "a3", "b3", 3, 5, "u"),
        _v(1, "a5", "b1", 5, None, "u"),  # a full image: b goes back to b1
        _v(2, "x", "y", 2, None, "c"),
    ]  # fmt: skip
    # Key 1's first version is rewritten (its end) and one is added; key 2 is untouched.
    assert (result.versions_written, result.versions_removed, result.rows) == (2, 0, 4)


def test_key_change_deletes_the_old_key(spark, warehouse):
    _write(spark, warehouse, "2026-01-01", [
        _change("c", 1, 1, "a", "b"), _change("u", 2, 9, "a", "b", before_id=1),
    ])  # fmt: skip
    assert _history(spark, warehouse) == [
        _v(1, "a", "b", 1, 2, "c"),
        _v(1, "a", "b", 2, None, "u", deleted=True),
        _v(9, "a", "b", 2, None, "u"),
    ]


def test_truncate_closes_live_versions(spark, warehouse):
    _write(spark, warehouse, "2026-01-01", [
        _change("c", 1, 1, "a", "b"), _change("c", 2, 2, "c", "d"), _change("d", 3, 2),
    ])  # fmt: skip
    _history(spark, warehouse)
    _write(spark, warehouse, "2026-01-02", [_change("t", 4, None), _change("c", 5, 3, "e", "f")])
    assert _history(spark, warehouse) == [
        _v(1, "a", "b", 1, 4, "c"),
        _v(1, "a", "b", 4, None, "t", deleted=True),
        _v(2, "c", "d", 2, 3, "c"),
        _v(2, "c", "d", 3, None, "d", deleted=True),  # already deleted: the truncate adds nothing
        _v(3, "e", "f", 5, None, "c"),
    ]
    # A late insert older than the truncate: the truncate deletes it too.
    _write(spark, warehouse, "2026-01-03", [_change("c", 2, 7, "g", "h")])
    assert [r for r in _history(spark, warehouse) if r[0] == 7] == [
        _v(7, "g", "h", 2, 4, "c"),
        _v(7, "g", "h", 4, None, "t", deleted=True),
    ]


def test_identical_snapshot_read_opens_nothing(spark, warehouse):
    _write(spark, warehouse, "2026-01-01", [
        _change("c", 1, 1, "a", "b"), _change("r", 2, 1, "a", "b"), _change("r", 3, 1, "a", "B"),
    ])  # fmt: skip
    assert _history(spark, warehouse) == [_v(1, "a", "b", 1, 3, "c"), _v(1, "a", "B", 3, None, "r")]


DAYS = {
    "2026-01-01": [_change("c", 1, 1, "a1", "b1"), _change("c", 2, 2, "x", "y"),
                   _change("u", 9, 1, "a9", "b9")],
    "2026-01-02": [_change("u", 3, 1, "a3", "b3"), _change("u", 4, 3, "m", "n", before_id=2),
                   _change("u", 5, 1, None, "b5", cols=["id", "b"])],
    "2026-01-03": [_change("d", 6, 1), _change("c", 7, 1, "a7", "b7"), _change("d", 8, 3),
                   _change("r", 10, 4, "p", "q")],
    "2026-01-04": [_change("u", 11, 4, "p", "q2"), _change("c", 12, 2, "x2", "y2"),
                   _change("u", 3, 1, "a3", "b3")],
}  # fmt: skip


@pytest.mark.slow
def test_reprocessing_in_any_order_matches_an_in_order_replay(spark, tmp_path):
    ordered = tmp_path / "ordered"
    for day, changes in DAYS.items():
        _write(spark, ordered, day, changes)
    expected = _history(spark, ordered, full_refresh=True)

    shuffled = tmp_path / "shuffled"
    days = list(DAYS)
    random.Random(4).shuffle(days)
    for day in [*days, days[0]]:  # late partitions, then one of them reprocessed
        _write(spark, shuffled, day, DAYS[day])
        _history(spark, shuffled)
    assert _rows(spark, shuffled) == expected
    again = update_history(spark, shuffled, "s", TABLE)
    assert (again.versions_written, again.versions_removed) == (0, 0)

    # A partition reprocessed with an event fewer: the versions it gave vanish.
    _write(spark, shuffled, "2026-01-04", DAYS["2026-01-04"][1:])
    result = update_history(spark, shuffled, "s", TABLE)
    fewer = _rows(spark, shuffled)
    assert [r for r in fewer if r[0] == 4] == [_v(4, "p", "q", 10, None, "r")]
    assert result.versions_removed == 1
    assert _history(spark, shuffled, full_refresh=True) == fewer


def test_a_column_added_later_joins_the_history(spark, warehouse):
    _write(spark, warehouse, "2026-01-01", [
        _change("c", 1, 1, "a", "b"), _change("c", 2, 2, "x", "y"),
    ])  # fmt: skip
    _history(spark, warehouse)
    # The change log gains column c (an int): key 1 is updated with it, key 2 is not touched.
    wide = SCHEMA.replace("a:string,b:string>", "a:string,b:string,c:int>")
    update = ("u", (1,), (1, None, None, None), (1, "a3", "b", 7), None, _seq(3),
              T0 + timedelta(seconds=3), None)  # fmt: skip
    df = spark.createDataFrame([update], wide).withColumn("ingest_date", F.lit("2026-01-02"))
    uri = lake.TableRef(lake.CHANGELOG, "s", "t").uri(warehouse)
    lake.overwrite_partitions(
        df.withColumn("ingest_date", F.col("ingest_date").cast("date")), uri, ["2026-01-02"],
        state=lake.TableState(key=["id"]),
    )  # fmt: skip
    result = update_history(spark, warehouse, "s", TABLE)
    table = lake.read_arrow(lake.TableRef(lake.HISTORY, "s", "t").uri(warehouse))
    cols = ["id", "a", "c", "__start_at", "__end_at"]
    got = sorted(tuple(r[c] for c in cols) for r in table.to_pylist())
    assert got == [
        (1, "a", None, _seq(1), _seq(3)), (1, "a3", 7, _seq(3), None),
        (2, "x", None, _seq(2), None),
    ]  # fmt: skip
    # Key 1's first version is closed (changed) and one is added; key 2 is not rewritten.
    assert (result.versions_written, result.versions_removed, result.rows) == (2, 0, 3)


def test_a_run_rewrites_only_the_files_holding_keys_whose_history_changed(spark, warehouse):
    uri = lake.TableRef(lake.HISTORY, "s", "t").uri(warehouse)
    _write(spark, warehouse, "2026-01-01", [_change("c", 1, 1, "a", "b")])
    _history(spark, warehouse)
    (of_key_1,) = lake.files(uri)
    _write(spark, warehouse, "2026-01-02", [_change("c", 2, 2, "x", "y")])
    _history(spark, warehouse)
    (of_key_2,) = set(lake.files(uri)) - {of_key_1}
    # Key 1 changes; key 2 is touched by its insert again, which changes nothing.
    _write(spark, warehouse, "2026-01-03", [
        _change("u", 3, 1, "a3", "b"), _change("c", 2, 2, "x", "y"),
    ])  # fmt: skip
    result = update_history(spark, warehouse, "s", TABLE)
    assert _rows(spark, warehouse) == [
        _v(1, "a", "b", 1, 3, "c"), _v(1, "a3", "b", 3, None, "u"), _v(2, "x", "y", 2, None, "c"),
    ]  # fmt: skip
    files = set(lake.files(uri))
    assert of_key_2 in files and of_key_1 not in files and len(files) == 2
    assert (result.versions_written, result.versions_removed, result.rows) == (2, 0, 3)


def test_a_run_whose_history_moves_while_it_reads_starts_anew(spark, warehouse, monkeypatch):
    _write(spark, warehouse, "2026-01-01", [_change("c", 1, 1, "a", "b")])
    _history(spark, warehouse)
    _write(spark, warehouse, "2026-01-02", [_change("u", 2, 1, "a2", "b")])
    uri = lake.TableRef(lake.HISTORY, "s", "t").uri(warehouse)
    reads = []

    def racing(*args, **kwargs):  # another writer commits to the history as the run reads it
        reads.append(1)
        if len(reads) == 1:
            lake.record_state(uri, lake.state(uri))
        return real(*args, **kwargs)

    real = lake.rows_of_keys
    monkeypatch.setattr(lake, "rows_of_keys", racing)
    result = update_history(spark, warehouse, "s", TABLE)
    assert len(reads) == 2
    assert _rows(spark, warehouse) == [_v(1, "a", "b", 1, 2, "c"), _v(1, "a2", "b", 2, None, "u")]
    assert (result.versions_written, result.versions_removed) == (2, 0)


IN_ORDER = {
    "2026-01-01": [
        _change("c", 1, 1, "a1", "b1"), _change("c", 2, 2, "x", "y"), _change("c", 3, 3, "p", "q"),
        _change("u", 4, 1, "a1", "b2"), _change("d", 5, 3),
    ],
    "2026-01-02": [  # a tracked change; a delete of a deleted key; a partial image
        _change("u", 6, 1, "a2", "b2"), _change("d", 7, 3),
        _change("u", 8, 2, "z", None, ["id", "a"]),
    ],
    "2026-01-03": [  # a re-insert; a key change; an update with a null, delivered twice
        _change("c", 9, 3, "r", "s"), _change("u", 10, 4, "z", "y", before_id=2),
        _change("u", 11, 1, "a2", None), _change("u", 11, 1, "a2", None),
    ],
    "2026-01-04": [
        _change("d", 12, 1), _change("c", 13, 5, "m", "n"), _change("u", 14, 3, "r", "t"),
    ],
}  # fmt: skip


@pytest.mark.parametrize(
    "table",
    [TABLE, TableConfig(name="t", history=True, track_history_column_list=["a"],
                        ignore_null_updates=True)],
    ids=["all-columns", "tracked-a-ignoring-nulls"],
)  # fmt: skip
def test_in_order_batches_extend_the_history_without_reading_old_changes(spark, tmp_path, table):
    # Every batch newer than all changes applied: the keys' open versions stand in for their
    # old changes. With the change log's first two days gone from disk, the last batch still
    # gives the history of a rebuild from every change.
    whole = tmp_path / "whole"
    for day, changes in IN_ORDER.items():
        _write(spark, whole, day, changes)
    expected = _history(spark, whole, table, full_refresh=True)

    batches = tmp_path / "batches"
    for day, changes in IN_ORDER.items():
        _write(spark, batches, day, changes)
        if day == "2026-01-04":
            log = lake.TableRef(lake.CHANGELOG, "s", "t").uri(batches)
            for old in ("2026-01-01", "2026-01-02"):
                for path in (Path(log) / f"ingest_date={old}").glob("*.parquet"):
                    path.unlink()
        _history(spark, batches, table)
    assert _rows(spark, batches) == expected
