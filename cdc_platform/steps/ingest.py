"""Ingest step: landing files -> raw (a Kafka source's raw: ``cdc_platform.ingest.kafka``)."""

from pathlib import Path

from cdc_platform.ingest import landing
from cdc_platform.lake import delta as lake


def ingest_files(
    warehouse: Path, source: str, files: list[tuple[Path, str]], date: str, whole_date: bool
) -> int:
    """Landing files of one ingest date -> raw. ``whole_date`` replaces the date's partition
    (the files are all of that date); otherwise only the rows of these files are replaced."""
    data = landing.read_files(files, date, topic=source)
    uri = lake.table_uri(warehouse, lake.RAW, source)
    if whole_date or not lake.exists(uri):
        lake.overwrite_partitions(uri, data, [date])
    else:
        names = ", ".join("'" + n.replace("'", "''") + "'" for _, n in files)
        lake.replace_where(uri, data, f"ingest_date = '{date}' AND file IN ({names})")
    return data.num_rows
