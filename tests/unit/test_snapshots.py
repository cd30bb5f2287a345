"""The snapshots ``lake`` keeps per table and thread (``lake.tables.snapshot``): every read sees
the newest commit, another writer's too, and a table made anew under the same path is read
anew, never through the old one's snapshot."""

import shutil
import threading

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from cdc_platform import lake
from cdc_platform.lake.tables import _SNAPSHOTS, TableState, _Snapshots, snapshot


def _append(uri: str, ids: list[int], state: TableState | None = None) -> None:
    props = lake.properties(state) if state else None
    write_deltalake(uri, pa.table({"id": ids}), mode="append", commit_properties=props)


def test_each_read_sees_the_newest_commit_of_any_writer(tmp_path):
    uri = str(tmp_path / "t")
    _append(uri, [1], TableState(changelog_version=1))
    assert (lake.version(uri), lake.row_count(uri), lake.state(uri).changelog_version) == (0, 1, 1)
    held = snapshot(uri)
    for n in range(2, 15):  # past a checkpoint (every 10 commits)
        _append(uri, [n], TableState(changelog_version=n))
        assert lake.version(uri) == n - 1
        assert lake.row_count(uri) == n
        assert lake.state(uri).changelog_version == n
    assert snapshot(uri) is held  # brought up to date, not loaded anew
    assert sorted(lake.read_arrow(uri)["id"].to_pylist()) == list(range(1, 15))
    assert lake.files(uri) == DeltaTable(uri).file_uris()


def test_a_table_made_anew_is_read_anew(tmp_path):
    uri = str(tmp_path / "t")
    for n in range(5):
        _append(uri, [n])
    assert (lake.version(uri), lake.row_count(uri)) == (4, 5)
    shutil.rmtree(uri)
    assert not lake.exists(uri) and lake.version(uri) is None
    # Made anew with more commits than the old one had: its version 4 is another commit.
    for n in range(7):
        _append(uri, [100 + n, 200 + n])
    assert (lake.version(uri), lake.row_count(uri)) == (6, 14)
    assert min(lake.read_arrow(uri)["id"].to_pylist()) == 100


def test_each_thread_reads_its_own_snapshot(tmp_path):
    uri = str(tmp_path / "t")
    _append(uri, [1])
    mine = snapshot(uri)
    theirs = []
    thread = threading.Thread(target=lambda: theirs.append(snapshot(uri)))
    thread.start()
    thread.join()
    assert theirs[0] is not mine
    assert theirs[0].version() == mine.version() == 0


def test_a_thread_keeps_the_snapshots_of_the_tables_it_read_last(tmp_path):
    uris = [str(tmp_path / f"t{i}") for i in range(_Snapshots.KEPT + 5)]
    for uri in uris:
        _append(uri, [1])
        assert lake.version(uri) == 0
    held = _SNAPSHOTS.held
    assert len(held) == _Snapshots.KEPT
    assert uris[0] not in held and uris[-1] in held
    assert lake.row_count(uris[0]) == 1  # loaded again
    assert next(reversed(held)) == uris[0]
