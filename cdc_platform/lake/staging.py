"""Frames a step computes once and reads several times, kept as Parquet in the warehouse.

Spark's cache builds each partition in the JVM heap (and reads a spilled one back whole): 10M
parsed events ran a 1 GB driver out of memory in local mode, where the driver is the only
executor. Parquet is written and read a row group at a time, on whatever holds the warehouse,
so executors of a cluster see it too; and a reader that needs a few columns (counts, plans)
reads only those. Each kept frame is a folder of its own under ``<warehouse>/_staging/``,
deleted by ``release``; a crashed run's folders go at the next run's ``release`` once a day old.
"""

import time
import uuid

import pyarrow.fs as pafs
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema

from cdc_platform.lake import arrow_files, storage

STAGING = "_staging"
_ABANDONED_AFTER_S = 24 * 3600  # no step runs for a day: an older folder's run is gone


class Staging:
    """The frames one step keeps (``keep``) until it ends (``release``)."""

    def __init__(self, warehouse: str) -> None:
        self.root = storage.join(str(warehouse), STAGING)
        self.paths: list[str] = []

    def keep(self, frame: DataFrame) -> DataFrame:
        """``frame`` computed once into Parquet; the frame that reads it back."""
        path = storage.join(self.root, uuid.uuid4().hex)
        self.paths.append(path)
        spark = frame.sparkSession
        if storage.is_remote(path):
            written = arrow_files.write(frame, path, None, None)
            schema = to_arrow_schema(frame.schema, timezone="UTC")
            return arrow_files.read(spark, path, [w["path"] for w in written], schema, [])
        frame.write.parquet(path)
        # With the schema: an empty frame leaves no file to infer one from.
        return spark.read.schema(frame.schema).parquet(path)

    def release(self) -> None:
        fs, root = storage.filesystem(self.root)
        for path in self.paths:
            _delete(fs, storage.filesystem(path)[1])
        self.paths.clear()
        # A crashed run's frames: in a store, objects (its folders have no time of their own).
        cutoff = time.time_ns() - _ABANDONED_AFTER_S * 10**9
        remote = storage.is_remote(self.root)
        listed = pafs.FileSelector(root, allow_not_found=True, recursive=remote)
        for old in fs.get_file_info(listed):
            if old.mtime_ns is None or old.mtime_ns >= cutoff:
                continue
            if old.type == pafs.FileType.Directory:
                _delete(fs, old.path)
            else:
                fs.delete_file(old.path)


def _delete(fs: pafs.FileSystem, folder: str) -> None:
    try:
        fs.delete_dir(folder)
    except FileNotFoundError:
        return
