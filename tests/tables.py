"""What the format and seed tests share: landing files written from messages, and a source's
tables read back as lists of dicts in a stable order."""

import json
from pathlib import Path

from pyspark.sql import SparkSession

from cdc_platform import lake
from cdc_platform.normalize import table_name
from cdc_platform.steps.current import current_rows


def write_lines(path: Path, messages: list) -> Path:
    """A landing file of one message per line: dicts as JSON, strings verbatim."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [m if isinstance(m, str) else json.dumps(m) for m in messages]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def current(
    spark: SparkSession, warehouse: Path, source: str, qualified: str, order: str | list[str]
) -> list[dict]:
    """The exposed current rows of the table messages name ``qualified``, ordered."""
    df = current_rows(spark, warehouse, source, table_name(qualified))
    return df.orderBy(*([order] if isinstance(order, str) else order)).toArrow().to_pylist()


def changelog(spark: SparkSession, warehouse: Path, source: str, qualified: str) -> list[dict]:
    """The change log of the table messages name ``qualified``, in sequence order."""
    uri = lake.TableRef(lake.CHANGELOG, source, table_name(qualified)).uri(warehouse)
    return lake.read(spark, uri).orderBy("sequence").toArrow().to_pylist()


def quarantine(spark: SparkSession, warehouse: Path, source: str) -> list[dict]:
    """The source's quarantined records by landing position ([] when nothing was quarantined)."""
    df = lake.read(spark, lake.TableRef(lake.QUARANTINE, source).uri(warehouse))
    return [] if df is None else df.orderBy("ingest_date", "file", "line").toArrow().to_pylist()
