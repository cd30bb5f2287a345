"""Merge-on-read: deletion vectors written by ``lake`` are the bytes Delta defines (a
Databricks-written fixture, from delta-rs's test data, byte for byte), and the tables that carry
them read the same in our Spark read, delta-rs and DuckDB; commits keep them (a lost race
retries, a crash before the commit changes nothing, vacuum keeps the live DV files, a
checkpoint carries them), and a table written without them is upgraded by its next merge."""

import json
import struct
import subprocess
import sys
import textwrap
import uuid
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from cdc_platform import lake
from cdc_platform.catalog import TableConfig
from cdc_platform.lake import deletion_vectors as DV
from cdc_platform.lake import delta_log
from cdc_platform.steps.current import current_rows, merge_current
from tests.delta_readers import agreed

pytestmark = pytest.mark.spark

FIXTURE = Path(__file__).parents[1] / "data" / "delta" / "table-with-dv-small"
SCHEMA = (
    "op string, key struct<id:int>, before struct<id:int,a:string>, after struct<id:int,a:string>,"
    " after_columns array<string>, sequence string, event_time timestamp, ingest_date date"
)


def _fixture_dv() -> DV.Descriptor:
    log = (FIXTURE / "_delta_log" / "00000000000000000001.json").read_text().splitlines()
    add = next(json.loads(line)["add"] for line in log if '"add"' in line)
    return DV.Descriptor.from_json(add["deletionVector"])


def test_the_codec_gives_the_fixture_s_bytes():
    dv = _fixture_dv()
    name = "deletion_vector_61d16c75-6994-46b7-a15b-8b538852e50e.bin"
    assert dv.file() == name
    assert DV.z85_encode(uuid.UUID(name[16:-4]).bytes) == dv.path_or_inline
    raw = (FIXTURE / name).read_bytes()
    bitmap = DV.bitmap([0, 9])
    assert len(bitmap) == dv.size
    assert raw == b"\x01" + struct.pack(">I", len(bitmap)) + bitmap + struct.pack(
        ">I", zlib.crc32(bitmap)
    )
    assert DV.read(str(FIXTURE), dv).tolist() == [0, 9]


def test_a_written_dv_file_frames_each_bitmap(tmp_path):
    maps = [DV.bitmap([0, 5, 1 << 33]), DV.bitmap(range(70_000))]
    placed = DV.write_file(str(tmp_path), maps)
    for (offset, size, encoded), expected in zip(
        placed, [[0, 5, 1 << 33], range(70_000)], strict=True
    ):
        dv = DV.Descriptor(encoded, offset, size, len(expected))
        assert DV.read(str(tmp_path), dv).tolist() == list(expected)
    assert placed[0][0] == 1  # the first DV's size field follows the version byte


def test_a_bad_crc_or_size_is_refused(tmp_path):
    ((offset, size, encoded),) = DV.write_file(str(tmp_path), [DV.bitmap([3])])
    with pytest.raises(ValueError, match="size"):
        DV.read(str(tmp_path), DV.Descriptor(encoded, offset, size + 1, 1))
    path = tmp_path / DV.Descriptor(encoded, offset, size, 1).file()
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="CRC"):
        DV.read(str(tmp_path), DV.Descriptor(encoded, offset, size, 1))


def test_every_reader_of_ours_applies_the_fixture_s_dv(spark):
    uri = str(FIXTURE)
    assert sorted(r["value"] for r in lake.read(spark, uri).collect()) == list(range(1, 9))
    assert sorted(lake.read_arrow(uri)["value"].to_pylist()) == list(range(1, 9))
    assert lake.row_count(uri) == 8
    assert lake.head(uri, lake.files(uri), 3)["value"].to_pylist() == [1, 2, 3]
    assert len(agreed(spark, uri)) == 8


def _change(op, seq, id_, a=None):
    after = None if op == "d" else (id_, a)
    before = (id_, None) if op in ("d", "u") else None
    return (op, (id_,), before, after, None, f"{seq:06d}", None, None)


def _batch(spark, warehouse, day, changes):
    df = spark.createDataFrame(changes, SCHEMA).selectExpr(
        "* except (ingest_date)", f"cast('{day}' as date) as ingest_date"
    )
    uri = lake.TableRef(lake.CHANGELOG, "s", "t").uri(warehouse)
    lake.overwrite_partitions(df, uri, [day], state=lake.TableState(key=["id"]))


def _current(warehouse) -> str:
    return lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse)


def _live(spark, warehouse) -> dict[int, str]:
    rows = current_rows(spark, warehouse, "s", "t").collect()
    return {r["id"]: r["a"] for r in rows}


def _seeded(spark, warehouse, n=1000, options=None):
    _batch(spark, warehouse, "2026-01-01", [_change("c", i, i, "v0") for i in range(n)])
    merge_current(spark, warehouse, "s", "t", options=options)


def test_a_merge_marks_what_it_replaces_and_writes_only_new_rows(spark, warehouse):
    _seeded(spark, warehouse)
    uri = _current(warehouse)
    first = lake.files(uri)
    changes = [_change("u", 2000 + i, i, "v1") for i in range(0, 1000, 10)]
    changes += [_change("d", 3000 + i, i) for i in range(5, 1000, 100)]
    _batch(spark, warehouse, "2026-01-02", changes)
    merged = merge_current(spark, warehouse, "s", "t")
    assert merged.updated == 110  # a delete keeps a tombstone: an update too
    # The first file stays, with a DV; the new file holds the new rows only.
    assert set(first) <= set(lake.files(uri))
    assert lake.row_count(uri, merged.written) == 110  # 100 updates, 10 tombstones
    dvs = lake.deletion_vectors_of(uri)
    assert sum(d.cardinality for d in dvs.values()) == 110
    protocol = DeltaTable(uri).protocol()
    assert protocol.min_reader_version == 3 and "deletionVectors" in protocol.reader_features
    assert DeltaTable(uri).metadata().configuration["delta.enableDeletionVectors"] == "true"
    expected = {i: "v1" if i % 10 == 0 else "v0" for i in range(1000) if i % 100 != 5}
    assert _live(spark, warehouse) == expected
    assert len(agreed(spark, uri)) == 1000  # 990 live rows and 10 tombstones
    # Again on rows that already have a DV: the new DV holds both.
    _batch(spark, warehouse, "2026-01-03", [_change("u", 4000 + i, i, "v2") for i in range(0, 50)])
    merge_current(spark, warehouse, "s", "t")
    expected |= {i: "v2" for i in range(50)}  # 5 too: its update is newer than its delete
    assert _live(spark, warehouse) == expected
    assert len(agreed(spark, uri)) == 1000
    assert lake.row_count(uri) == 1000


def test_copy_on_write_stays_a_table_option(spark, warehouse):
    options = TableConfig(name="t", merge_mode="copy-on-write")
    _seeded(spark, warehouse, options=options)
    uri = _current(warehouse)
    _batch(spark, warehouse, "2026-01-02", [_change("u", 2000, 7, "v1")])
    merge_current(spark, warehouse, "s", "t", options=options)
    assert DeltaTable(uri).protocol().min_reader_version == 1
    assert _live(spark, warehouse)[7] == "v1"


def test_a_table_written_without_dvs_is_upgraded_by_its_next_merge(spark, warehouse):
    _seeded(spark, warehouse, options=TableConfig(name="t", merge_mode="copy-on-write"))
    uri = _current(warehouse)
    assert DeltaTable(uri).protocol().min_reader_version == 1
    _batch(spark, warehouse, "2026-01-02", [_change("u", 2000, 7, "v1")])
    merge_current(spark, warehouse, "s", "t")
    assert DeltaTable(uri).protocol().min_writer_version == 7
    assert _live(spark, warehouse)[7] == "v1" and len(_live(spark, warehouse)) == 1000
    assert len(agreed(spark, uri)) == 1000


def test_a_dv_commit_that_loses_a_race_retries(spark, warehouse, monkeypatch):
    _seeded(spark, warehouse)
    uri = _current(warehouse)
    _batch(spark, warehouse, "2026-01-02", [_change("u", 2000, 7, "v1")])
    merge_current(spark, warehouse, "s", "t")  # the file has a DV now
    real = delta_log.commit
    raced = {"n": 0}

    def racing(table, read_version, actions, **kwargs):
        if raced["n"] == 0 and table == uri:
            raced["n"] += 1
            # Another writer marks a row of the same file first, from the same version.
            dt = DeltaTable(table, version=read_version)
            replayed = delta_log.replay(table, dt.version())
            add = next(a for a in replayed.adds.values() if "deletionVector" in a)
            rows = DV.read(table, DV.Descriptor.from_json(add["deletionVector"])).tolist()
            ((offset, size, encoded),) = DV.write_file(table, [DV.bitmap(rows)])
            dv = DV.Descriptor(encoded, offset, size, len(rows))
            real(
                table, read_version,
                [delta_log.remove_of(add, 0), delta_log.with_deletion_vector(add, dv)],
                operation="MERGE",
            )  # fmt: skip
        return real(table, read_version, actions, **kwargs)

    monkeypatch.setattr(delta_log, "commit", racing)
    _batch(spark, warehouse, "2026-01-03", [_change("u", 3000, 8, "v2")])
    # The merge's commit loses; its step read its counts at the old version, so it fails as
    # moved (a transient failure: the run's retry policy runs the step again).
    with pytest.raises(lake.TableMoved):
        merge_current(spark, warehouse, "s", "t")
    assert raced["n"] == 1
    merge_current(spark, warehouse, "s", "t")
    live = _live(spark, warehouse)
    assert (live[7], live[8], len(live)) == ("v1", "v2", 1000)
    assert len(agreed(spark, uri)) == 1000


_KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from cdc_platform.lake import delta_log
    from cdc_platform.spark.session import get_spark
    from cdc_platform.steps.current import merge_current

    def die(*args, **kwargs):
        print("dv files written", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    delta_log.commit = die
    merge_current(get_spark("local[1]"), sys.argv[1], "s", "t")
    """
)


@pytest.mark.slow
def test_a_merge_killed_before_its_commit_changes_nothing_and_its_dv_files_are_vacuumed(
    spark, warehouse
):
    _seeded(spark, warehouse)
    uri = _current(warehouse)
    _batch(spark, warehouse, "2026-01-02", [_change("u", 2000 + i, i, "v1") for i in range(20)])
    before = (DeltaTable(uri).version(), _live(spark, warehouse))
    done = subprocess.run(
        [sys.executable, "-c", _KILLED, str(warehouse)], capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == -9 and "dv files written" in done.stdout, done.stderr[-2000:]
    orphans = [p for p in Path(uri).iterdir() if DV.is_file(p.name)]
    assert orphans
    assert (DeltaTable(uri).version(), _live(spark, warehouse)) == before
    lake.vacuum(uri, retention_hours=0)
    assert not any(DV.is_file(p.name) for p in Path(uri).iterdir())
    merge_current(spark, warehouse, "s", "t")
    assert _live(spark, warehouse) == {i: "v1" if i < 20 else "v0" for i in range(1000)}


@pytest.mark.slow
def test_vacuum_keeps_the_live_dv_files_and_a_checkpoint_carries_them(spark, warehouse):
    _seeded(spark, warehouse)
    uri = _current(warehouse)
    expected = {i: "v0" for i in range(1000)}
    for round_ in range(12):  # past a checkpoint (every 10 commits)
        ids = range(round_, 1000, 37)
        _batch(spark, warehouse, f"2026-01-{round_ + 2:02d}", [
            _change("u", 10_000 * (round_ + 1) + i, i, f"r{round_}") for i in ids
        ])  # fmt: skip
        merge_current(spark, warehouse, "s", "t")
        expected |= {i: f"r{round_}" for i in ids}
    assert list(Path(uri, "_delta_log").glob("*.checkpoint.parquet"))
    live_files = {d.file() for d in lake.deletion_vectors_of(uri).values()}
    assert len(live_files) < len(list(p for p in Path(uri).iterdir() if DV.is_file(p.name)))
    lake.vacuum(uri, retention_hours=0)
    assert {p.name for p in Path(uri).iterdir() if DV.is_file(p.name)} == live_files
    assert _live(spark, warehouse) == expected
    assert len(agreed(spark, uri)) == 1000
    # The checkpoint holds the descriptors, and a replay from it (no cache) finds the same.
    checkpoint = sorted(Path(uri, "_delta_log").glob("*.checkpoint.parquet"))[-1]
    adds = [a for a in pq.read_table(checkpoint).column("add").to_pylist() if a]
    assert any(a["deletionVector"] for a in adds)
    newest = lake.deletion_vectors_of(uri)
    delta_log._replays.newest.clear()
    assert lake.deletion_vectors_of(uri) == newest


def test_a_commit_lands_after_a_blind_append_and_fails_on_a_conflict(tmp_path):
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"a": [1, 2]}))
    add = next(iter(delta_log.replay(uri, 0).adds.values()))
    write_deltalake(uri, pa.table({"a": [3]}), mode="append")  # version 1, from version 0
    version = delta_log.commit(uri, 0, [delta_log.remove_of(add, 0)], operation="DELETE")
    assert version == 2 and sorted(DeltaTable(uri).to_pyarrow_table()["a"].to_pylist()) == [3]
    with pytest.raises(CommitFailedError, match="removed a file"):
        delta_log.commit(uri, 0, [delta_log.remove_of(add, 0)], operation="DELETE")
    with pytest.raises(CommitFailedError, match="transaction"):
        delta_log.commit(uri, 2, [], operation="WRITE", txns={"app": 1})
        delta_log.commit(uri, 2, [], operation="WRITE", txns={"app": 2})


def test_a_purge_rewrites_the_files_whose_dvs_mark_many_rows(spark, warehouse):
    _seeded(spark, warehouse)
    uri = _current(warehouse)
    _batch(
        spark,
        warehouse,
        "2026-01-02",
        [_change("u", 2000 + i, i, "v1") for i in range(0, 1000, 20)],
    )
    merge_current(spark, warehouse, "s", "t")  # 5% of the rows marked: kept
    assert lake.purge(lambda: spark, uri) == 0
    _batch(spark, warehouse, "2026-01-03", [_change("u", 3000 + i, i, "v2") for i in range(400)])
    merge_current(spark, warehouse, "s", "t")  # 42% marked now
    expected = _live(spark, warehouse)
    version = DeltaTable(uri).version()
    # The first file (420 of 1,000 rows marked) and the second batch's (20 of its 50).
    assert lake.purge(lambda: spark, uri) == 2
    assert lake.deletion_vectors_of(uri) == {}
    assert DeltaTable(uri).version() == version + 1
    assert _live(spark, warehouse) == expected
    assert len(agreed(spark, uri)) == lake.row_count(uri) == 1000
    assert lake.state(uri).key == ["id"]  # the purge's commit records no state of its own
