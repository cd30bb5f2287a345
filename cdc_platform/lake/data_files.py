"""Data files written by Spark's executors, described for the Delta log by the driver.

On a local path, Spark's own writer puts each write in a folder of its own inside the table
(``write-<uuid>/``, partition folders below it), so the driver lists exactly the files of that
write; it reads their Parquet footers (no data) for the add actions' statistics and moves them
into the table's own partition folders (Spark's file names are unique per write), where every
reader expects them. On object storage the tasks write through pyarrow straight into the
partition folders and send the driver each file's footer facts (``lake.arrow_files``). Files no
commit names are invisible to every reader; ``lake.vacuum`` deletes a crashed write's.
"""

import datetime as dt
import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pyarrow.parquet as pq
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import DataFrame

from cdc_platform.lake import arrow_files, storage
from cdc_platform.lake.parquet_stats import stats

STAGING_PREFIX = "write-"
_NULL_PARTITION = arrow_files.NULL_PARTITION


def write(
    df: DataFrame,
    uri: str,
    partition_by: list[str] | None = None,
    max_records_per_file: int | None = None,
) -> list[AddAction]:
    """Write ``df`` with Spark's executors into the table; the add actions of its non-empty
    files (the commit is the caller's)."""
    if storage.is_remote(uri):
        now = int(time.time() * 1000)
        return [
            AddAction(
                path=f["path"],
                size=f["size"],
                partition_values=json.loads(f["partition_values"]),
                modification_time=now,
                data_change=True,
                stats=f["stats"],
            )  # fmt: skip
            for f in arrow_files.write(df, uri, partition_by, max_records_per_file)
        ]
    folder = f"{STAGING_PREFIX}{uuid.uuid4().hex}"
    writer = df.write.format("parquet").option("compression", "snappy")
    if max_records_per_file:
        writer = writer.option("maxRecordsPerFile", max_records_per_file)
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.save(str(Path(uri, folder)))
    return added(uri, folder)


def added(uri: str, folder: str) -> list[AddAction]:
    """Add actions for the Parquet files under ``folder`` of the table, moved into the table's
    partition folders (empty files deleted)."""
    root = Path(uri, folder)
    now = int(time.time() * 1000)
    actions = []
    for path in sorted(root.rglob("*.parquet")):
        relative = path.relative_to(root)
        if any(part.startswith(("_", ".")) for part in relative.parts):
            continue  # a task's leftovers (_temporary), never committed
        meta = pq.read_metadata(path)
        if meta.num_rows == 0:
            continue
        target = Path(uri, relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        path.rename(target)
        actions.append(
            AddAction(
                path=quote(str(relative), safe="/="),
                size=target.stat().st_size,
                partition_values=_partition_values(relative),
                modification_time=now,
                data_change=True,
                stats=json.dumps(stats(meta)),
            )
        )
    shutil.rmtree(root, ignore_errors=True)
    return actions


def discard(uri: str, actions: list[AddAction]) -> None:
    """Delete written files no commit will name (a failed commit's)."""
    fs, base = storage.filesystem(uri)
    for action in actions:
        try:
            fs.delete_file(f"{base}/{unquote(action.path)}")
        except FileNotFoundError:
            continue


def removes(actions: Any, paths: set[str] | None = None) -> list[RemoveAction]:
    """Remove actions for the add actions (``lake.tables.add_actions`` rows) whose path is in
    ``paths`` (all when None)."""
    now = int(time.time() * 1000)
    partitions = [c for c in actions.column_names if c.startswith("partition.")]
    found = []
    for row in actions.select(["path", "size_bytes", *partitions]).to_pylist():
        if paths is not None and row["path"] not in paths:
            continue
        values = {
            c.removeprefix("partition."): None if row[c] is None else _text(row[c])
            for c in partitions
        }
        found.append(
            RemoveAction(
                path=row["path"], data_change=True, deletion_timestamp=now,
                size=row["size_bytes"], partition_values=values,
            )
        )  # fmt: skip
    return found


def _text(value: Any) -> str:
    return value.isoformat() if isinstance(value, dt.date) else str(value)


def _partition_values(relative: Path) -> dict[str, str | None]:
    values = {}
    for part in relative.parts[:-1]:
        name, _, value = part.partition("=")
        value = unquote(value)
        values[unquote(name)] = None if value == _NULL_PARTITION else value
    return values
