"""Vacuum: delete the data files no version of a table within the retention names.

A merge or compaction replaces files with a remove action; the replaced files stay on disk, so
a table's folder grows with every micro-batch. A write that crashed before its commit leaves a
``write-<uuid>/`` folder no commit names. ``vacuum`` deletes both once they are older than the
retention; time travel to versions older than that ends with them (every reader of an old
version falls back when its files are gone).

delta-rs lists what to delete (its dry run) and we delete it: its own vacuum commits twice
(VACUUM START and END), and a commit by anyone else under a pinned step (``lake.commit.Pin``)
fails that step, so a daily vacuum would fail a live micro-batch now and then.
"""

import os
from dataclasses import dataclass
from pathlib import Path

from deltalake import DeltaTable

from cdc_platform.lake.data_files import STAGING_PREFIX
from cdc_platform.lake.staging import STAGING
from cdc_platform.lake.tables import exists


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
    listed = DeltaTable(uri).vacuum(
        retention_hours=retention_hours, dry_run=True, enforce_retention_duration=False,
        full=True,
    )  # fmt: skip
    root, files, size = Path(uri), 0, 0
    for relative in listed:
        path = root / relative
        try:
            size += path.stat().st_size
            path.unlink()
        except FileNotFoundError:  # another vacuum got there first
            continue
        files += 1
        if relative.startswith(STAGING_PREFIX):
            _remove_empty_folders(path.parent, root)
    return Vacuumed(files, size)


def _remove_empty_folders(folder: Path, root: Path) -> None:
    """Remove ``folder`` and its parents below ``root`` while they are empty: a crashed write's
    folder, which no writer uses (a partition folder may be a live write's destination)."""
    while folder != root:
        try:
            folder.rmdir()
        except OSError:  # not empty
            return
        folder = folder.parent


def all_tables(warehouse: Path) -> list[str]:
    """Every Delta table under ``warehouse`` (each layer's and the models'), by path."""
    found = []
    for folder, subfolders, _ in os.walk(warehouse):
        if "_delta_log" in subfolders:
            found.append(folder)
            subfolders.clear()  # a table holds no table
        else:
            subfolders[:] = sorted(s for s in subfolders if s != STAGING)
    return sorted(found)
