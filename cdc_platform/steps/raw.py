"""Raw step: landing files -> raw (a Kafka source's raw: ``cdc_platform.ingest.kafka``).

Raw holds one data file per landing file (``lake.landing_files``), so a run ingests just the
files raw does not hold yet, or holds at another size or mtime (grown, rewritten): their rows
are replaced, nothing else is read. A backfill replaces whole dates. A file removed from the
landing folder stays in raw until its date is replaced.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs

from cdc_platform import lake
from cdc_platform.ingest import landing
from cdc_platform.lake import landing_files, storage
from cdc_platform.lake.landing_files import LandingFile


@dataclass
class IngestResult:
    """What a run put into raw: messages per date and the landing files ingested."""

    messages: dict[str, int] = field(default_factory=dict)
    files: list[LandingFile] = field(default_factory=list)
    replaced_dates: list[str] = field(default_factory=list)  # written whole


def _listing(landing_dir: str, date: str) -> list[tuple[str, LandingFile]]:
    """The date's landing files with their size and mtime, taken before they are read: a file
    that grows meanwhile differs from what was recorded and is read again next time."""
    return [
        (f.location, LandingFile(f.name, f.size, f.mtime_ns))
        for f in landing.files_for_date(landing_dir, date)
    ]


def _pending(
    listing: list[tuple[str, LandingFile]], held: dict[str, LandingFile] | None
) -> list[tuple[str, LandingFile]]:
    if held is None:  # the date's raw predates file tracking: all of it is read again
        return listing
    return [(p, f) for p, f in listing if held.get(f.name) != f]


def pending_landing(warehouse: str, source: str, landing_dir: str) -> dict[str, list[LandingFile]]:
    """Per landing date, the files raw does not hold as they are now (new, grown, rewritten)."""
    uri = lake.TableRef(lake.RAW, source).uri(warehouse)
    pending = {}
    for date in landing.partition_dates(landing_dir):
        found = _pending(_listing(landing_dir, date), landing_files.manifest(uri, date))
        if found:
            pending[date] = [f for _, f in found]
    return pending


def pending_landing_files(warehouse: str, source: str, landing_dir: str) -> dict[str, list[str]]:
    """``pending_landing``'s files by name."""
    pending = pending_landing(warehouse, source, landing_dir)
    return {d: [f.name for f in files] for d, files in pending.items()}


def _write(
    uri: str, source: str, date: str, files: list[tuple[str, LandingFile]], whole_date: bool
) -> int:
    rows = 0

    def batches(path: str, file: LandingFile) -> Iterator[pa.RecordBatch]:
        nonlocal rows
        for batch in landing.read_batches(path, date, topic=source, name=file.name):
            rows += batch.num_rows
            yield batch

    parts = [(f, batches(p, f)) for p, f in files]  # each read as it is written
    landing_files.write(uri, landing.RAW_SCHEMA, date, parts, whole_date)
    return rows


def ingest_landing(
    warehouse: str, source: str, landing_dir: str, dates: list[str], whole_date: bool = False
) -> IngestResult:
    """The landing files of ``dates`` -> raw: the pending ones (``whole_date``: every file, the
    date's raw replaced)."""
    uri = lake.TableRef(lake.RAW, source).uri(warehouse)
    result = IngestResult()
    for date in dates:
        listing = _listing(landing_dir, date)
        held = None if whole_date else landing_files.manifest(uri, date)
        files = _pending(listing, held)
        if not files and held is not None:
            continue
        whole = held is None
        result.messages[date] = _write(uri, source, date, files, whole)
        result.files += [f for _, f in files]
        if whole:
            result.replaced_dates.append(date)
    return result


def ingest_files(
    warehouse: str, source: str, files: list[tuple[str, str]], date: str, whole_date: bool
) -> int:
    """Given files (location, name to record) of one ingest date -> raw (the ``replay``
    command): ``whole_date`` replaces the date, else the rows of these names."""
    listed = []
    for path, name in files:
        fs, at = storage.filesystem(str(path))
        info = fs.get_file_info(at)
        if info.type != pafs.FileType.File:
            raise landing.LandingError(f"cannot read landing file {path}: not a file")
        listed.append((str(path), LandingFile(name, info.size, info.mtime_ns)))
    return _write(lake.TableRef(lake.RAW, source).uri(warehouse), source, date, listed, whole_date)
