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


def _files(listed: list[landing.Listed]) -> list[tuple[str, LandingFile]]:
    """Listed files with the size and mtime the listing saw, taken before they are read: a file
    that grows meanwhile differs from what was recorded and is read again next time."""
    return [(f.location, LandingFile(f.name, f.size, f.mtime_ns)) for f in listed]


def _pending(
    listing: list[tuple[str, LandingFile]], held: dict[str, LandingFile] | None
) -> list[tuple[str, LandingFile]]:
    if held is None:  # the date's raw predates file tracking: all of it is read again
        return listing
    return [(p, f) for p, f in listing if held.get(f.name) != f]


def _to_ingest(
    uri: str, landing_dir: str, dates: list[str] | None, full: bool
) -> dict[str, tuple[list[tuple[str, LandingFile]], bool]]:
    """Per date (of ``dates``; None: every date), the landing files raw does not hold as they
    are now, and whether the date is to be written whole (its raw predates file tracking).

    ``full`` lists every file of the dates. Otherwise only the names from the last one raw holds
    on (``landing.files_after``): new files, and the last one grown or rewritten. A file that
    lands under an earlier name, or changes after a later one was read, waits for a full
    listing (``SourceConfig.full_listing_minutes``)."""
    held = landing_files.Held(uri)
    if full:
        if dates is None:
            dates = landing.partition_dates(landing_dir)
        listed = {d: _files(landing.files_for_date(landing_dir, d)) for d in dates}
    else:
        last = held.last_name()
        listed = {}
        # From just before the last name: the last file itself is listed, to see it grown.
        for f in _files(landing.files_after(landing_dir, last[:-1] if last else None)):
            date = f[1].name.split("/", 1)[0].removeprefix("dt=")
            if dates is None or date in dates:
                listed.setdefault(date, []).append(f)
    found = {}
    for date, files in listed.items():
        manifest = held.of_date(date)
        if manifest is None and not full:  # replaced whole: all of the date's files
            files = _files(landing.files_for_date(landing_dir, date))
        if pending := _pending(files, manifest):
            found[date] = (pending, manifest is None)
    return found


def pending_landing(
    warehouse: str, source: str, landing_dir: str, full: bool = True
) -> dict[str, list[LandingFile]]:
    """Per landing date, the files raw does not hold as they are now (new, grown, rewritten);
    ``full``: see ``_to_ingest``."""
    uri = lake.TableRef(lake.RAW, source).uri(warehouse)
    found = _to_ingest(uri, landing_dir, None, full)
    return {d: [f for _, f in files] for d, (files, _) in sorted(found.items())}


def pending_landing_files(
    warehouse: str, source: str, landing_dir: str, full: bool = True
) -> dict[str, list[str]]:
    """``pending_landing``'s files by name."""
    pending = pending_landing(warehouse, source, landing_dir, full)
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
    warehouse: str,
    source: str,
    landing_dir: str,
    dates: list[str],
    whole_date: bool = False,
    full: bool = True,
) -> IngestResult:
    """The landing files of ``dates`` -> raw: the pending ones (``full``: see ``_to_ingest``);
    ``whole_date``: every file, the date's raw replaced."""
    uri = lake.TableRef(lake.RAW, source).uri(warehouse)
    result = IngestResult()
    if whole_date:
        todo = {d: (_files(landing.files_for_date(landing_dir, d)), True) for d in dates}
    else:
        todo = _to_ingest(uri, landing_dir, dates, full)
    for date in sorted(todo):
        files, whole = todo[date]
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
