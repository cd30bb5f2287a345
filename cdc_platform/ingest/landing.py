"""Landing files, the embedded default transport: ``<landing>/<source>/dt=YYYY-MM-DD/*``.

``*.kafka.jsonl`` lines are Kafka record envelopes ``{"topic","partition","offset","timestamp",
"key","value"}`` (``value_b64`` for binary payloads, a null value is a tombstone). Any other file is
one message value per line. Blank lines are skipped; every other line is kept, even when it is not
a message (a license header, garbage): the parser quarantines it, so nothing is dropped unseen.
"""

import base64
import datetime as dt
import json
import re
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa

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


class LandingError(Exception):
    """A landing file that cannot be read at all (missing, a directory, unreadable)."""


def partition_dates(source_dir: Path) -> list[str]:
    """The ``dt=`` folders of a source's landing folder, oldest first."""
    if not source_dir.is_dir():
        return []
    return sorted(m.group(1) for p in source_dir.iterdir() if (m := _DATE_DIR.match(p.name)))


def files_for_date(source_dir: Path, date: str) -> list[Path]:
    """Message files of one ingest date, in name order (their order is the offset order)."""
    folder = source_dir / f"dt={date}"
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))


def date_of(path: Path, default: str) -> str:
    """The ingest date of a file: its ``dt=`` folder, else ``default``."""
    for part in reversed(path.parts[:-1]):
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


def read_file(path: Path, ingest_date: str, topic: str, name: str | None = None) -> pa.Table:
    """All messages of one landing file as a raw Arrow table."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise LandingError(f"cannot read landing file {path}: {e.strerror}") from None
    lines = [line.rstrip(b"\r") for line in data.split(b"\n")]
    numbers = [n for n, line in enumerate(lines, start=1) if line.strip()]
    values = [lines[n - 1] for n in numbers]
    count = len(numbers)
    if path.name.endswith(ENVELOPE_SUFFIX):
        columns = {f: [] for f in ("topic", "partition", "offset", "timestamp", "key", "value",
                                   "headers")}  # fmt: skip
        for line in values:
            rec = _envelope(line)
            for f, col in columns.items():
                col.append(rec.get(f))
        columns["topic"] = [t or topic for t in columns["topic"]]
    else:
        columns = {"topic": [topic] * count, "value": values}
    columns.update(
        ingest_date=[dt.date.fromisoformat(ingest_date)] * count,
        file=[name or str(path)] * count,
        line=numbers,
    )
    return pa.table(
        {f.name: pa.array(columns.get(f.name, [None] * count), f.type) for f in RAW_SCHEMA},
        schema=RAW_SCHEMA,
    )


def read_files(paths: Iterable[tuple[Path, str]], ingest_date: str, topic: str) -> pa.Table:
    """Several files (path, name to record) of one ingest date, concatenated in the given order."""
    tables = [read_file(p, ingest_date, topic, name) for p, name in paths]
    return pa.concat_tables(tables) if tables else RAW_SCHEMA.empty_table()
