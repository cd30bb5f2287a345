"""Delta statistics of a Parquet data file, from its footer (no data read): what the add action
of a file records, whoever wrote the file (Spark, or a task writing through pyarrow)."""

import datetime as dt
import math
from decimal import Decimal
from typing import Any

import pyarrow.parquet as pq


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
