"""Landing files, the embedded default transport: ``<landing>/<source>/dt=YYYY-MM-DD/*``, in a
local folder or under an object-store prefix (``lake.storage``): listed by prefix, a folder
level at a time, and read in ranges, never downloaded whole.

``*.kafka.jsonl`` lines are Kafka record envelopes ``{"topic","partition","offset","timestamp",
"key","value"}`` (``value_b64`` for binary payloads, a null value is a tombstone). Any other file is
one message value per line. Blank lines are skipped; every other line is kept, even when it is not
a message (a license header, garbage): the parser quarantines it, so nothing is dropped unseen.
"""

import base64
import datetime as dt
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from cdc_platform.lake import storage

RAW_SCHEMA = pa.schema(
    [
        pa.field("ingest_date", pa.date32()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field(
            "headers",
            pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])),
        ),
        pa.field("file", pa.string()),
        pa.field("line", pa.int64()),
    ]
)
ENVELOPE_SUFFIX = ".kafka.jsonl"
_DATE_DIR = re.compile(r"^dt=(\d{4}-\d{2}-\d{2})$")
# A landing file is read this many bytes at a time (cut at a line end): the memory of its ingest.
CHUNK_SIZE = 8 * 1024 * 1024
_ENVELOPE_ROWS = 16 * 1024  # envelope lines parsed per batch
_NEWLINE, _CR = ord("\n"), ord("\r")
_CR_PASSES = 4  # trailing \r stripped with numpy, one a pass; a longer run, line by line
_DOUBTS = 4096  # lines of a chunk told blank or not line by line; more: with numpy
# Bytes that are not ASCII whitespace (what ``bytes.strip`` removes): a line with one is kept.
_CONTENT = np.ones(256, dtype=np.bool_)
_CONTENT[list(b" \t\n\r\x0b\x0c")] = False
_MAX_VALUES = 2**31 - 1  # bytes of a binary array (32-bit offsets)


class LandingError(Exception):
    """A landing file that cannot be read at all (missing, a directory, unreadable)."""


@dataclass(frozen=True)
class Listed:
    """A landing file as listed: where it is, its name below the source's landing folder, and
    its size and modification time (from the listing itself: no request per file)."""

    location: str
    name: str
    size: int
    mtime_ns: int


def partition_dates(source_dir: str) -> list[str]:
    """The ``dt=`` folders of a source's landing folder, oldest first (one level listed: in a
    bucket, one request per 1,000 folders)."""
    try:
        fs, path = storage.filesystem(str(source_dir))
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except OSError as e:
        raise LandingError(f"cannot list landing folder {source_dir}: {e}") from None
    return sorted(
        m.group(1)
        for info in infos
        if info.type == pafs.FileType.Directory and (m := _DATE_DIR.match(info.base_name))
    )


def files_for_date(source_dir: str, date: str) -> list[Listed]:
    """Message files of one ingest date, in name order (their order is the offset order)."""
    return _message_files(str(source_dir), f"dt={date}", None)


def files_after(source_dir: str, after: str | None) -> list[Listed]:
    """Message files of every ingest date whose names (``dt=…/…``) sort after ``after`` (all:
    None), in name order: a listing that starts after ``after`` (one request per 1,000 names in
    a bucket), so that what it costs follows what is new, not the landing tree."""
    return _message_files(str(source_dir), None, after)


def _message_files(source_dir: str, date_dir: str | None, after: str | None) -> list[Listed]:
    folder = storage.join(source_dir, date_dir) if date_dir else source_dir
    try:
        listed = storage.list_files(folder, after)
    except OSError as e:
        raise LandingError(f"cannot list landing folder {folder}: {e}") from None
    found = []
    for f in listed:
        name = f"{date_dir}/{f.path}" if date_dir else f.path
        top, _, rest = name.partition("/")
        if rest and _DATE_DIR.match(top) and not rest.rsplit("/", 1)[-1].startswith("."):
            found.append(Listed(storage.join(source_dir, name), name, f.size, f.mtime_ns))
    return found


def date_of(location: str, default: str) -> str:
    """The ingest date of a file: its ``dt=`` folder, else ``default``."""
    for part in reversed(str(location).split("/")[:-1]):
        if m := _DATE_DIR.match(part):
            return m.group(1)
    return default


def _json_bytes(value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _envelope(line: bytes) -> dict:
    """One envelope line -> raw columns. A line that is not an envelope is kept as its value."""
    try:
        rec = json.loads(line)
        if not isinstance(rec, dict) or not ({"value", "value_b64"} & rec.keys()):
            raise ValueError("not an envelope")
        value = (
            base64.b64decode(rec["value_b64"], validate=True)
            if rec.get("value_b64") is not None
            else _json_bytes(rec.get("value"))
        )
        ts = rec.get("timestamp")
        return {
            "topic": rec.get("topic"),
            "partition": rec.get("partition"),
            "offset": rec.get("offset"),
            "timestamp": dt.datetime.fromtimestamp(ts / 1000, dt.UTC) if ts is not None else None,
            "key": _json_bytes(rec.get("key")),
            "value": value,
            "headers": [
                {"key": str(k), "value": _json_bytes(v)}
                for k, v in (rec.get("headers") or {}).items()
            ],
        }
    except (ValueError, TypeError, OverflowError):
        # Kept byte for byte; with no "op"/"payload" the parser quarantines it with its reason.
        return {"value": line}


def _chunks(location: str, size: int) -> Iterator[memoryview]:
    """A file's bytes about ``size`` at a time, each chunk cut just after a newline (the last one
    ends where the file does). A line longer than ``size`` is read whole: its chunk grows."""
    try:
        fs, path = storage.filesystem(location)
        with fs.open_input_file(path) as f:
            start, want = 0, size
            while block := f.read(want):
                cut = len(block)
                if cut == want:  # the file may go on: cut after the last newline
                    cut = block.rfind(b"\n") + 1
                    if not cut:
                        want *= 2
                        f.seek(start)
                        continue
                yield memoryview(block)[:cut]
                start, want = start + cut, size
                f.seek(start)
    except OSError as e:
        raise LandingError(f"cannot read landing file {location}: {e.strerror or e}") from None


def _lines(chunk: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool, int]:
    """The kept lines of a chunk of whole lines (the last may lack its newline): their start and
    end offsets (trailing ``\r`` left out), their numbers (the chunk's first line is ``first``),
    whether they are all the chunk holds but its newlines, and the chunk's count of lines. A line
    is kept when ``bytes.strip`` leaves something of it."""
    newlines = np.flatnonzero(chunk == _NEWLINE)
    ends = newlines if chunk[-1] == _NEWLINE else np.append(newlines, len(chunk))
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = newlines[: len(ends) - 1] + 1
    # Kept: a line whose first or last byte is not whitespace, else one with any such byte.
    kept = _CONTENT[chunk[starts]]
    doubt = np.flatnonzero(~kept)
    doubt = doubt[ends[doubt] > starts[doubt]]  # an empty line is blank
    kept[doubt] = _CONTENT[chunk[ends[doubt] - 1]]
    doubt = doubt[~kept[doubt]]
    if len(doubt) > _DOUBTS:  # many lines starting and ending with whitespace: every byte looked at
        kept = np.logical_or.reduceat(_CONTENT[chunk], starts)  # a line and its newline
    else:
        for i in doubt.tolist():
            kept[i] = bool(chunk[starts[i] : ends[i]].tobytes().strip())
    lines = len(starts)
    numbers = np.flatnonzero(kept) + first
    every = len(numbers) == lines
    if not every:
        starts, ends = starts[kept], ends[kept]
    # Kept lines hold a byte that is not whitespace, so stripping ``\r`` leaves them non-empty.
    strip = np.flatnonzero(chunk[ends - 1] == _CR)
    if len(strip):
        every = False
        for _ in range(_CR_PASSES):
            ends[strip] -= 1
            strip = strip[chunk[ends[strip] - 1] == _CR]
            if not len(strip):
                break
        for i in strip.tolist():  # a line ending in a long run of \r
            ends[i] = starts[i] + len(chunk[starts[i] : ends[i]].tobytes().rstrip(b"\r"))
    return starts, ends, numbers, every, lines


def _values(chunk: np.ndarray, starts: np.ndarray, ends: np.ndarray, every: bool) -> pa.Array:
    """The bytes ``chunk[starts[i]:ends[i]]`` of each line as one binary array."""
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(ends - starts, out=offsets[1:])
    if offsets[-1] > _MAX_VALUES:
        raise ValueError(f"a landing line of more than {_MAX_VALUES} bytes")
    if every:  # the lines are the chunk without its newlines
        inside = chunk != _NEWLINE
    else:
        edges = np.zeros(len(chunk) + 1, dtype=np.int8)
        edges[starts] = 1
        edges[ends] -= 1
        inside = np.cumsum(edges[:-1], dtype=np.int8).view(np.bool_)
        del edges
    data = chunk[inside]
    del inside
    return pa.Array.from_buffers(
        pa.binary(),
        len(starts),
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
    )


def raw_batch(columns: dict[str, pa.Array], count: int) -> pa.RecordBatch:
    """``count`` raw rows (``RAW_SCHEMA``) of ``columns`` (name -> array); the others null."""
    return pa.RecordBatch.from_arrays(
        [columns.get(f.name, pa.nulls(count, f.type)) for f in RAW_SCHEMA], schema=RAW_SCHEMA
    )


def read_batches(
    location: str,
    ingest_date: str,
    topic: str,
    name: str | None = None,
    chunk_size: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """The messages of one landing file as raw Arrow batches, read ``chunk_size`` bytes at a time
    (default ``CHUNK_SIZE``), so memory does not grow with the file. Line numbers count every
    line of the file, blank ones too."""
    location = str(location)
    envelope = storage.name(location).endswith(ENVELOPE_SUFFIX)
    date = pa.scalar(dt.date.fromisoformat(ingest_date), pa.date32())
    file = pa.scalar(name or location, pa.string())
    first = 1
    for view in _chunks(location, chunk_size or CHUNK_SIZE):
        chunk = np.frombuffer(view, dtype=np.uint8)
        starts, ends, numbers, every, lines = _lines(chunk, first)
        first += lines
        if envelope:
            for at in range(0, len(numbers), _ENVELOPE_ROWS):
                texts = [
                    view[s:e].tobytes()
                    for s, e in zip(
                        starts[at : at + _ENVELOPE_ROWS].tolist(),
                        ends[at : at + _ENVELOPE_ROWS].tolist(),
                        strict=True,
                    )
                ]
                yield _envelopes(texts, numbers[at : at + _ENVELOPE_ROWS], date, topic, file)
        elif len(numbers):
            count = len(numbers)
            yield raw_batch(
                {
                    "ingest_date": pa.repeat(date, count),
                    "topic": pa.repeat(pa.scalar(topic, pa.string()), count),
                    "value": _values(chunk, starts, ends, every),
                    "file": pa.repeat(file, count),
                    "line": pa.array(numbers, pa.int64()),
                },
                count,
            )


def _envelopes(
    lines: list[bytes], numbers: np.ndarray, date: pa.Scalar, topic: str, file: pa.Scalar
) -> pa.RecordBatch:
    columns = {f: [] for f in ("topic", "partition", "offset", "timestamp", "key", "value",
                               "headers")}  # fmt: skip
    for line in lines:
        rec = _envelope(line)
        for f, col in columns.items():
            col.append(rec.get(f))
    columns["topic"] = [t or topic for t in columns["topic"]]
    count = len(lines)
    arrays = {f: pa.array(col, RAW_SCHEMA.field(f).type) for f, col in columns.items()}
    arrays.update(
        ingest_date=pa.repeat(date, count),
        file=pa.repeat(file, count),
        line=pa.array(numbers, pa.int64()),
    )
    return raw_batch(arrays, count)


def read_file(location: str, ingest_date: str, topic: str, name: str | None = None) -> pa.Table:
    """All messages of one landing file as a raw Arrow table."""
    batches = list(read_batches(location, ingest_date, topic, name))
    return pa.Table.from_batches(batches, RAW_SCHEMA)


def read_files(paths: Iterable[tuple[str, str]], ingest_date: str, topic: str) -> pa.Table:
    """Several files (path, name to record) of one ingest date, concatenated in the given order."""
    tables = [read_file(p, ingest_date, topic, name) for p, name in paths]
    return pa.concat_tables(tables) if tables else RAW_SCHEMA.empty_table()
