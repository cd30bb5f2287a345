"""Vacuum: delete the data files no version of a table within the retention names.

A merge or compaction replaces files with a remove action; the replaced files stay on disk, so
a table's folder grows with every micro-batch. A write that crashed before its commit leaves a
``write-<uuid>/`` folder no commit names. ``vacuum`` deletes both once they are older than the
retention; time travel to versions older than that ends with them (every reader of an old
version falls back when its files are gone). Deletion vector files go the same way: those the
newest version names stay, stale ones and a crashed merge's go.

delta-rs lists what to delete (its dry run) and we delete it: its own vacuum commits twice
(VACUUM START and END), and a commit by anyone else under a pinned step (``lake.commit.Pin``)
fails that step, so a daily vacuum would fail a live micro-batch now and then.
"""

from dataclasses import dataclass

import pyarrow.fs as pafs

from cdc_platform.lake import storage
from cdc_platform.lake.data_files import STAGING_PREFIX
from cdc_platform.lake.staging import STAGING
from cdc_platform.lake.tables import deletion_vectors_of, exists, folders, open_table


@dataclass(frozen=True)
class Vacuumed:
    """What ``vacuum`` deleted from one table."""

    files: int
    bytes: int


def vacuum(uri: str, retention_hours: int) -> Vacuumed:
    """Delete the files of the table at ``uri`` older than ``retention_hours`` that its newest
    version does not name. Keep the retention longer than any run, or the files a run has
    written but not yet committed go too."""
    if not exists(uri):
        return Vacuumed(0, 0)
    listed = open_table(uri).vacuum(
        retention_hours=retention_hours, dry_run=True, enforce_retention_duration=False,
        full=True,
    )  # fmt: skip
    # delta-rs lists the live deletion vector files too: deleting one would break the table.
    live = {dv.file() for dv in deletion_vectors_of(uri).values()}
    fs, root = storage.filesystem(uri)
    files, size = 0, 0
    for relative in (r for r in listed if r not in live):
        path = f"{root}/{relative}"
        info = fs.get_file_info(path)
        if info.type != pafs.FileType.File:  # another vacuum got there first
            continue
        try:
            fs.delete_file(path)
        except FileNotFoundError:
            continue
        size += info.size
        files += 1
        if relative.startswith(STAGING_PREFIX) and not storage.is_remote(uri):
            _remove_empty_folders(fs, path.rsplit("/", 1)[0], root)
    return Vacuumed(files, size)


def _remove_empty_folders(fs: pafs.FileSystem, folder: str, root: str) -> None:
    """Remove ``folder`` and its parents below ``root`` while they are empty: a crashed write's
    folder, which no writer uses (a partition folder may be a live write's destination). A
    store has no folders to remove."""
    while folder != root:
        if fs.get_file_info(pafs.FileSelector(folder)):
            return
        fs.delete_dir(folder)
        folder = folder.rsplit("/", 1)[0]


def all_tables(warehouse: str) -> list[str]:
    """Every Delta table under ``warehouse`` (each layer's and the models'), by path."""
    found = []
    pending = [str(warehouse)]
    while pending:
        folder = pending.pop()
        below = folders(folder)
        if any(storage.name(f) == "_delta_log" for f in below):
            found.append(folder)  # a table holds no table
        else:
            pending += [f for f in below if storage.name(f) != STAGING]
    return sorted(found)
