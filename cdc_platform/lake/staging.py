"""Frames a step computes once and reads several times, kept as Parquet in the warehouse.

Spark's cache builds each partition in the JVM heap (and reads a spilled one back whole): 10M
parsed events ran a 1 GB driver out of memory in local mode, where the driver is the only
executor. Parquet is written and read a row group at a time, on whatever holds the warehouse,
so executors of a cluster see it too; and a reader that needs a few columns (counts, plans)
reads only those. Each kept frame is a folder of its own under ``<warehouse>/_staging/``,
deleted by ``release``; a crashed run's folders go at the next run's ``release`` once a day old.
"""

import shutil
import time
import uuid
from pathlib import Path

from pyspark.sql import DataFrame

STAGING = "_staging"
_ABANDONED_AFTER_S = 24 * 3600  # no step runs for a day: an older folder's run is gone


class Staging:
    """The frames one step keeps (``keep``) until it ends (``release``)."""

    def __init__(self, warehouse: Path) -> None:
        self.root = Path(warehouse) / STAGING
        self.paths: list[Path] = []

    def keep(self, frame: DataFrame) -> DataFrame:
        """``frame`` computed once into Parquet; the frame that reads it back."""
        path = self.root / uuid.uuid4().hex
        frame.write.parquet(str(path))
        self.paths.append(path)
        # With the schema: an empty frame leaves no file to infer one from.
        return frame.sparkSession.read.schema(frame.schema).parquet(str(path))

    def release(self) -> None:
        for path in self.paths:
            shutil.rmtree(path, ignore_errors=True)
        self.paths.clear()
        cutoff = time.time() - _ABANDONED_AFTER_S
        for old in self.root.glob("*") if self.root.is_dir() else []:
            if old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
