"""Materialization metadata built from what the pipeline steps return."""

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import dagster as dg
import pyarrow as pa

from cdc_platform import lake, timings
from cdc_platform.freshness import Freshness

PROFILE_PREFIX = "seconds by phase: "


@dataclass
class Profile:
    """The profile a block is recording; ``skip()`` leaves it unlogged (a look for new data
    that found none is not worth a line)."""

    logged: bool = True

    def skip(self) -> None:
        self.logged = False


@contextmanager
def profiled(context: dg.OpExecutionContext) -> Iterator[Profile]:
    """Log where the step's wall time went (``timings``), as one line of the run's event log:
    ``seconds by phase: {json}``, with ``step`` the whole body."""
    start = time.perf_counter()
    profile = Profile()
    with timings.recorded() as seconds:
        yield profile
    seconds["step"] = time.perf_counter() - start
    if profile.logged:
        context.log.info(PROFILE_PREFIX + json.dumps(timings.rounded(seconds)))


def table_schema(schema: pa.Schema) -> dg.TableSchema:
    return dg.TableSchema(columns=[dg.TableColumn(name=f.name, type=str(f.type)) for f in schema])


def add_partition_row_counts(
    context: dg.AssetExecutionContext, uri: str, asset_key: dg.AssetKey | None = None
) -> None:
    """Give each partition of the run its own ``dagster/partition_row_count``: its rows in the
    Delta table after the write (from the log, no data read). A run over a range records one
    materialization per partition, each with the metadata added for its key, so call this
    before returning (or yielding) the asset's result."""
    counts = lake.partition_row_counts(uri)
    for date in context.partition_keys:
        context.add_asset_metadata(
            {"dagster/partition_row_count": counts.get(date, 0)},
            asset_key=asset_key,
            partition_key=date,
        )


def freshness_metadata(seen: Freshness) -> dict[str, object]:
    """The table's lag behind its source; the source position shown as a time."""
    return {
        k: dg.MetadataValue.timestamp(v) if k == "source_position" else v
        for k, v in seen.metadata().items()
    }


def delta_metadata(uri: str) -> dict[str, object]:
    """Version, schema, location of a Delta table (empty if it does not exist yet)."""
    if not lake.exists(uri):
        return {}
    info = lake.describe(uri)
    return {
        "delta_version": info["version"],
        "delta_files": info["files"],
        "dagster/column_schema": table_schema(info["schema"]),
        "dagster/uri": dg.MetadataValue.path(uri),
    }


def arrow_preview(table: pa.Table) -> dg.MetadataValue:
    """A short markdown preview of rows already at hand (e.g. the first rows a step wrote)."""
    return _markdown(table.to_pylist())


def _markdown(sample: list[dict]) -> dg.MetadataValue:
    if not sample:
        return dg.MetadataValue.md("_empty_")
    cols = list(sample[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in sample]
    return dg.MetadataValue.md("\n".join(lines))
