"""The daily partitioning of a source's raw and change logs: the ingest date of a message.

Each source starts at its own first date (``start_date`` in sources.yaml, else where its data
starts), so the UI and backfills do not offer years of dates that never held anything.
"""

import datetime as dt

import dagster as dg

from cdc_platform.catalog import Catalog, SourceConfig
from cdc_platform.ingest import landing
from cdc_platform.lake import RAW, TableRef, partition_row_counts


def today() -> dt.date:
    return dt.datetime.now(dt.UTC).date()


def _dates(values: list[str]) -> list[dt.date]:
    found = []
    for v in values:
        try:
            found.append(dt.date.fromisoformat(v))
        except ValueError:
            continue  # a dt= folder that is no real date (dt=2024-13-45)
    return found


def first_data_date(warehouse: str, source: SourceConfig, landing_dir: str | None) -> dt.date:
    """Where the source's data starts: the earliest of its landing ``dt=`` folders (files) and
    of the ingest dates in its raw table (files that left the landing folder, a Kafka source);
    today when there is none, never later than today."""
    found = _dates(landing.partition_dates(landing_dir)) if landing_dir else []
    raw = TableRef(RAW, source.name).uri(warehouse)
    found += _dates(list(partition_row_counts(raw)))
    return min([*found, today()])


def with_start_date(source: SourceConfig, catalog: Catalog) -> SourceConfig:
    """``source`` with its ``start_date`` set: the configured one, else ``first_data_date``."""
    if source.start_date is not None:
        return source
    landing_dir = catalog.landing_for(source) if source.transport == "files" else None
    start = first_data_date(catalog.warehouse_uri, source, landing_dir)
    return source.model_copy(update={"start_date": start})


def daily_partitions(source: SourceConfig) -> dg.DailyPartitionsDefinition:
    """The daily partitions of ``source`` from its ``start_date`` (``with_start_date`` resolves
    the default first; unresolved, today). end_offset=1: today's partition exists, so files
    landing today are processed today."""
    start = source.start_date or today()
    return dg.DailyPartitionsDefinition(start_date=start.isoformat(), end_offset=1)
