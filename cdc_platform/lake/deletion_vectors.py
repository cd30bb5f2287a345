"""Deletion vectors: which rows of a data file are deleted, kept beside the file.

A merge-on-read merge marks the rows it replaces or deletes instead of rewriting their files.
The bytes are Delta's (PROTOCOL.md, "Deletion Vectors"; delta-spark's
``RoaringBitmapArray``/``DeletionVectorStore``):

- a bitmap is little-endian: magic 1681511377, then a 64-bit Roaring bitmap in its portable
  form (a u64 bucket count, per bucket a u32 key and a portable 32-bit bitmap), which is what
  pyroaring's ``BitMap64.serialize`` writes;
- a DV file is a version byte 1, then per DV a big-endian u32 size, the bitmap, and a
  big-endian u32 CRC-32 of the bitmap;
- a descriptor (``add.deletionVector``) names a file by a UUID in Z85 (storage type ``u``),
  the offset of the DV's size field, the bitmap's size and its cardinality.

Positions are physical row numbers within the Parquet file, from 0 (Spark's
``_metadata.row_index``). Spark's executors write the DV files (``mark``); only descriptors
reach the driver. Readers apply a file's DV as a boolean mask over its rows (``keep_mask``).
"""

import os
import struct
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyroaring import BitMap64
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from cdc_platform.lake import storage

MAGIC = 1681511377
FEATURE = "deletionVectors"
ENABLE_PROPERTY = "delta.enableDeletionVectors"
_VERSION = b"\x01"
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}
# The columns ``mark`` reads: a data file (its path in the log) and a row's position in it.
FILE = "__file"
ROW = "__row"


def z85_encode(data: bytes) -> str:
    """ZeroMQ's Z85 (``data``'s length a multiple of 4)."""
    out = []
    for (word,) in struct.iter_unpack(">I", data):
        chars = []
        for _ in range(5):
            word, digit = divmod(word, 85)
            chars.append(_Z85[digit])
        out.extend(reversed(chars))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    out = bytearray()
    for i in range(0, len(text), 5):
        word = 0
        for c in text[i : i + 5]:
            word = word * 85 + _Z85_VALUE[c]
        out += struct.pack(">I", word)
    return bytes(out)


def bitmap(positions: Any) -> bytes:
    """The serialized bitmap of row ``positions`` (an array, list or range of non-negative
    ints)."""
    rows = BitMap64(np.asarray(positions, dtype=np.uint64))
    return struct.pack("<I", MAGIC) + rows.serialize()


def positions(data: bytes) -> np.ndarray:
    """The row positions a serialized bitmap holds, ascending (uint64)."""
    (magic,) = struct.unpack_from("<I", data)
    if magic != MAGIC:
        raise ValueError(f"not a deletion vector bitmap (magic {magic})")
    return np.frombuffer(BitMap64.deserialize(data[4:]).to_array(), dtype=np.uint64)


@dataclass(frozen=True)
class Descriptor:
    """An ``add.deletionVector`` of storage type ``u`` (a file beside the table's data)."""

    path_or_inline: str
    offset: int
    size: int
    cardinality: int
    storage_type: str = "u"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Descriptor":
        return cls(
            d["pathOrInlineDv"], d.get("offset") or 0, d["sizeInBytes"], d["cardinality"],
            d["storageType"],
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            "storageType": self.storage_type, "pathOrInlineDv": self.path_or_inline,
            "offset": self.offset, "sizeInBytes": self.size, "cardinality": self.cardinality,
        }  # fmt: skip

    def file(self) -> str:
        """The DV file's path relative to the table."""
        if self.storage_type != "u":
            raise ValueError(f"deletion vector storage type {self.storage_type!r} is not read")
        prefix, encoded = self.path_or_inline[:-20], self.path_or_inline[-20:]
        name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
        return f"{prefix}/{name}" if prefix else name


def is_file(relative: str) -> bool:
    """Whether a path below a table is a deletion vector file."""
    return relative.rsplit("/", 1)[-1].startswith("deletion_vector_")


def write_file(uri: str, bitmaps: list[bytes], settings: dict[str, str] | None = None) -> list:
    """Write ``bitmaps`` into one new DV file of the table at ``uri``; their offsets and the
    file's encoded UUID, as (offset, size, path_or_inline) per bitmap."""
    name = uuid.uuid4()
    encoded = z85_encode(name.bytes)
    body, placed = bytearray(_VERSION), []
    for data in bitmaps:
        placed.append((len(body), len(data), encoded))
        body += struct.pack(">I", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    fs, base = storage.filesystem(uri, settings)
    with fs.open_output_stream(f"{base}/deletion_vector_{name}.bin") as out:
        out.write(bytes(body))
    return placed


def read(uri: str, dv: Descriptor, settings: dict[str, str] | None = None) -> np.ndarray:
    """The deleted positions ``dv`` holds, checked against its file's framing."""
    fs, base = storage.filesystem(uri, settings)
    with fs.open_input_file(f"{base}/{dv.file()}") as f:
        f.seek(dv.offset)
        framed = f.read(4 + dv.size + 4)
    (size,) = struct.unpack_from(">I", framed)
    if size != dv.size:
        raise ValueError(f"deletion vector size {size} is not the descriptor's {dv.size}")
    data = framed[4 : 4 + size]
    (crc,) = struct.unpack_from(">I", framed, 4 + size)
    if crc != zlib.crc32(data):
        raise ValueError(f"deletion vector {dv.file()}: CRC-32 mismatch")
    return positions(data)


def keep_mask(deleted: np.ndarray, rows: int) -> np.ndarray:
    """A boolean array over a file's ``rows`` rows: true where a row is not ``deleted``."""
    keep = np.ones(rows, dtype=bool)
    keep[deleted[deleted < rows].astype(np.int64)] = False
    return keep


_MARKED = pa.schema(
    [
        ("path", pa.string()),
        ("path_or_inline", pa.string()),
        ("offset", pa.int64()),
        ("size", pa.int64()),
        ("cardinality", pa.int64()),
    ]
)


def mark(uri: str, rows: DataFrame, old: dict[str, Descriptor]) -> dict[str, Descriptor]:
    """Mark deleted the rows ``rows`` names (``FILE``: a data file's path in the log, ``ROW``:
    its position), each file's merged with its DV in ``old``: the new descriptor of each file.
    The executors read the old DVs and write the new ones, a DV file per task; only the
    descriptors reach the driver."""
    settings = storage.options()

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        chunks = [b for b in batches if b.num_rows]
        if not chunks:
            return
        table = pa.Table.from_batches(chunks)
        files = table.column(FILE).to_numpy(zero_copy_only=False)
        where = table.column(ROW).to_numpy()
        order = np.argsort(files, kind="stable")
        names, starts = np.unique(files[order], return_index=True)
        paths, maps = [], []
        for name, chunk in zip(names, np.split(order, starts[1:]), strict=True):
            path = str(name)
            marked = BitMap64(where[chunk].astype(np.uint64))
            if path in old:
                marked |= BitMap64(read(uri, old[path], settings))
            paths.append((path, len(marked)))
            maps.append(struct.pack("<I", MAGIC) + marked.serialize())
        placed = write_file(uri, maps, settings)
        yield pa.RecordBatch.from_pydict(
            {
                "path": [p for p, _ in paths],
                "path_or_inline": [e for _, _, e in placed],
                "offset": [o for o, _, _ in placed],
                "size": [s for _, s, _ in placed],
                "cardinality": [n for _, n in paths],
            },
            schema=_MARKED,
        )

    chosen = rows.select(F.col(FILE).cast("string"), F.col(ROW).cast("long"))
    chosen = chosen.repartition(_tasks(rows), F.col(FILE))
    found = chosen.mapInArrow(task, from_arrow_schema(_MARKED)).collect()
    return {
        r["path"]: Descriptor(r["path_or_inline"], r["offset"], r["size"], r["cardinality"])
        for r in found
    }


def _tasks(rows: DataFrame) -> int:
    """Tasks that write DV files: one per core (a file's rows go to one task)."""
    conf = rows.sparkSession.conf
    return int(conf.get("spark.default.parallelism", None) or os.cpu_count() or 1)
