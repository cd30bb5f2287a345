"""Materialization metadata built from what the pipeline steps return."""

import dagster as dg
import pyarrow as pa
from pyspark.sql import DataFrame

from cdc_platform.lake import delta as lake


def table_schema(schema: pa.Schema) -> dg.TableSchema:
    return dg.TableSchema(columns=[dg.TableColumn(name=f.name, type=str(f.type)) for f in schema])


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


def preview(df: DataFrame, order: list[str], rows: int = 10) -> dg.MetadataValue:
    """A short markdown preview of a frame (first rows by ``order``)."""
    return _markdown(df.orderBy(*order).limit(rows).toArrow().to_pylist())


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
