"""Data files written by Spark's executors, described for the Delta log by the driver.

Each write goes to a folder of its own inside the table (``write-<uuid>/``, partition folders
below it), so the driver lists exactly the files of that write; it reads their Parquet footers
(no data) for the add actions' statistics and moves them into the table's own partition
folders (Spark's file names are unique per write), where every reader expects them. Files no
commit names are invisible to every reader; ``lake.vacuum`` deletes a crashed write's.
"""

import datetime as dt
import json
import math
import shutil
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pyarrow.parquet as pq
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import DataFrame

STAGING_PREFIX = "write-"
_NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def write(
    df: DataFrame,
    uri: str,
    partition_by: list[str] | None = None,
    max_records_per_file: int | None = None,
) -> list[AddAction]:
    """Write ``df`` with Spark into a new folder of the table; the add actions of its non-empty
    files (the commit is the caller's)."""
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
    for action in actions:
        Path(uri, unquote(action.path)).unlink(missing_ok=True)


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


def stats(meta: pq.FileMetaData) -> dict[str, Any]:
    """Delta statistics of a Parquet file from its footer: rows, and min, max and null count of
    every column outside lists and maps (nested in structs as the schema nests them). Bounds are
    left out where they could mislead: decimals (JSON numbers lose digits), floats with NaN,
    binary and boolean."""
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    nulls: dict[str, Any] = {}
    for i in range(meta.num_columns):
        column = meta.schema.column(i)
        if column.max_repetition_level > 0:
            continue  # inside a list or map
        path = column.path.split(".")
        chunks = [meta.row_group(g).column(i).statistics for g in range(meta.num_row_groups)]
        if any(s is None for s in chunks):
            continue
        if all(s.has_null_count for s in chunks):
            _put(nulls, path, sum(s.null_count for s in chunks))
        bounded = [s for s in chunks if s.has_min_max]
        if bounded and len(bounded) == sum(s.num_values > 0 for s in chunks):
            lo = _json(min(s.min for s in bounded))
            hi = _json(max(s.max for s in bounded))
            if lo is not None and hi is not None:
                _put(low, path, lo)
                _put(high, path, hi)
    return {"numRecords": meta.num_rows, "minValues": low, "maxValues": high, "nullCount": nulls}


def _put(tree: dict[str, Any], path: list[str], value: Any) -> None:
    for name in path[:-1]:
        tree = tree.setdefault(name, {})
    tree[path[-1]] = value


def _json(value: Any) -> Any:
    """A bound as Delta writes it; None where we give none."""
    if isinstance(value, bool) or isinstance(value, (bytes, Decimal)):
        return None
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, dt.date):
        return value.isoformat()
    return value if isinstance(value, (int, str)) else None
