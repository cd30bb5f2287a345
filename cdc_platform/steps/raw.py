"""Raw step: landing files -> raw (a Kafka source's raw: ``cdc_platform.ingest.kafka``).

Raw holds one data file per landing file (``lake.landing_files``), so a run ingests just the
files raw does not hold yet, or holds at another size or mtime (grown, rewritten): their rows
are replaced, nothing else is read. A backfill replaces whole dates. A file removed from the
landing folder stays in raw until its date is replaced.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from cdc_platform import lake
from cdc_platform.ingest import landing
from cdc_platform.lake import landing_files
from cdc_platform.lake.landing_files import LandingFile


@dataclass
class IngestResult:
    """What a run put into raw: messages per date and the landing files ingested."""

    messages: dict[str, int] = field(default_factory=dict)
    files: list[LandingFile] = field(default_factory=list)
    replaced_dates: list[str] = field(default_factory=list)  # written whole


def _listing(landing_dir: Path, date: str) -> list[tuple[Path, LandingFile]]:
    """The date's landing files with their size and mtime, taken before they are read: a file
    that grows meanwhile differs from what was recorded and is read again next time."""
    found = []
    for path in landing.files_for_date(landing_dir, date):
        st = path.stat()
        name = str(path.relative_to(landing_dir))
        found.append((path, LandingFile(name, st.st_size, st.st_mtime_ns)))
    return found


def _pending(
    listing: list[tuple[Path, LandingFile]], held: dict[str, LandingFile] | None
) -> list[tuple[Path, LandingFile]]:
    if held is None:  # the date's raw predates file tracking: all of it is read again
        return listing
    return [(p, f) for p, f in listing if held.get(f.name) != f]


def pending_landing_files(warehouse: Path, source: str, landing_dir: Path) -> dict[str, list[str]]:
    """Per landing date, the files raw does not hold as they are now (new, grown, rewritten)."""
    uri = lake.TableRef(lake.RAW, source).uri(warehouse)
    pending = {}
    for date in landing.partition_dates(landing_dir):
        found = _pending(_listing(landing_dir, date), landing_files.manifest(uri, date))
        if found:
            pending[date] = [f.name for _, f in found]
    return pending


def _write(
    uri: str, source: str, date: str, files: list[tuple[Path, LandingFile]], whole_date: bool
) -> int:
    rows = 0

    def batches(path: Path, file: LandingFile) -> Iterator[pa.RecordBatch]:
        nonlocal rows
        for batch in landing.read_batches(path, date, topic=source, name=file.name):
            rows += batch.num_rows
            yield batch

    parts = [(f, batches(p, f)) for p, f in files]  # each read as it is written
    landing_files.write(uri, landing.RAW_SCHEMA, date, parts, whole_date)
    return rows


def ingest_landing(
    warehouse: Path, source: str, landing_dir: Path, dates: list[str], whole_date: bool = False
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
    warehouse: Path, source: str, files: list[tuple[Path, str]], date: str, whole_date: bool
) -> int:
    """Given files (path, name to record) of one ingest date -> raw (the ``replay`` command):
    ``whole_date`` replaces the date, else the rows of these names."""
    listed = []
    for path, name in files:
        try:
            st = path.stat()
        except OSError as e:
            raise landing.LandingError(f"cannot read landing file {path}: {e.strerror}") from None
        listed.append((path, LandingFile(name, st.st_size, st.st_mtime_ns)))
    return _write(lake.TableRef(lake.RAW, source).uri(warehouse), source, date, listed, whole_date)
