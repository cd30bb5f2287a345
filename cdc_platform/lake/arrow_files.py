"""Spark reads and writes of a table's Parquet data files through pyarrow's filesystem, in the
executors: the path for object storage, which Spark's own readers cannot reach (pyspark ships
no hadoop-aws). ``lake.data_files`` and ``lake.tables.read`` choose it for a remote table, so
no caller knows which path runs.

A write is ``mapInArrow``: each task writes the rows it holds as files directly under the
table (hive partition folders, as Spark writes them; an object store has no rename, so there is
no staging folder to move out of), and yields one small row per file (path, size, partition
values, Delta statistics from the footer) for the driver, which commits them: no data row
reaches the driver. A read is ``mapInArrow`` over a range of file numbers, a task per file,
each file's batches conformed to the table's schema (a column a file lacks is null, its
partition values come from its path, and ``FILE_COLUMN`` names it when asked for).
"""

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from cdc_platform.lake import deletion_vectors as DV
from cdc_platform.lake import storage
from cdc_platform.lake.deletion_vectors import Descriptor
from cdc_platform.lake.parquet_stats import stats

NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_WRITTEN = pa.schema(
    [
        ("path", pa.string()),
        ("size", pa.int64()),
        ("rows", pa.int64()),
        ("partition_values", pa.string()),
        ("stats", pa.string()),
    ]
)
_BATCH_ROWS = 64 * 1024  # rows a read hands Spark at a time


def write(
    df: DataFrame, root: str, partition_by: list[str] | None, max_records: int | None
) -> list[dict[str, Any]]:
    """Write ``df`` as Parquet files under ``root`` from the executors; one dict per non-empty
    file written (``_WRITTEN``'s fields)."""
    settings = storage.options()
    partition_by = list(partition_by or [])
    arrow = to_arrow_schema(df.schema, timezone="UTC")
    columns = [f.name for f in arrow if f.name not in partition_by]
    # Every field nullable, nested ones too, as the table declares them (Spark's nullability
    # says nothing of the rows: a struct marked not null arrives with nulls, and back).
    file_schema = pa.schema([_nullable(arrow.field(c)) for c in columns])
    write_id = uuid.uuid4().hex

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fs, base = storage.filesystem(root, settings)
        open_files: dict[tuple, list[Any]] = {}  # partition values -> [writer, key, rows, stream]
        done: list[dict[str, Any]] = []
        counter = 0

        def close(values: tuple) -> None:
            writer, stored, rows, stream = open_files.pop(values)
            writer.close()  # the footer: the stream stays open, and its length is the file's
            size = stream.tell()
            stream.close()
            meta = writer.writer.metadata
            done.append(
                {
                    "path": quote(stored, safe="/="), "size": size, "rows": rows,
                    "partition_values": json.dumps(dict(zip(partition_by, values, strict=True))),
                    "stats": json.dumps(stats(meta)),
                }
            )  # fmt: skip

        def sink(values: tuple, rows: pa.Table) -> None:
            nonlocal counter
            while rows.num_rows:
                if values not in open_files:
                    folders = "".join(
                        f"{quote(c, safe='')}={quote(NULL_PARTITION if v is None else v, safe='')}/"
                        for c, v in zip(partition_by, values, strict=True)
                    )
                    counter += 1
                    stored = (
                        f"{folders}part-{counter:05d}-{write_id}-{uuid.uuid4().hex[:8]}.parquet"
                    )
                    stream = fs.open_output_stream(f"{base}/{stored}")
                    writer = pq.ParquetWriter(stream, file_schema, compression="snappy")
                    open_files[values] = [writer, stored, 0, stream]
                entry = open_files[values]
                room = rows.num_rows if not max_records else max_records - entry[2]
                part, rows = rows.slice(0, room), rows.slice(room)
                entry[0].write_table(part)
                entry[2] += part.num_rows
                if max_records and entry[2] >= max_records:
                    close(values)

        for batch in batches:
            if batch.num_rows == 0:
                continue
            table = pa.Table.from_batches([batch])
            for values, rows in _split(table, partition_by):
                sink(values, rows.select(columns).cast(file_schema))
        for values in list(open_files):
            close(values)
        if done:
            yield pa.RecordBatch.from_pylist(done, schema=_WRITTEN)

    written = df.mapInArrow(task, from_arrow_schema(_WRITTEN)).collect()
    return [row.asDict() for row in written if row["rows"]]


def _nullable(field: pa.Field) -> pa.Field:
    t = field.type
    if pa.types.is_struct(t):
        t = pa.struct([_nullable(f) for f in t])
    elif pa.types.is_list(t):
        t = pa.list_(_nullable(t.value_field))
    elif pa.types.is_map(t):
        t = pa.map_(t.key_type, _nullable(t.item_field))
    return field.with_type(t).with_nullable(True)


def _split(table: pa.Table, columns: list[str]) -> Iterator[tuple[tuple, pa.Table]]:
    """``table``'s rows by their values of ``columns`` (as text, as partition folders hold them),
    each part in the order the rows came."""
    if not columns:
        yield (), table
        return
    first, rest = columns[0], columns[1:]
    texts = _partition_text(table[first])
    for value in pc.unique(texts).to_pylist():
        mask = pc.is_null(texts) if value is None else pc.equal(texts, value)
        part = table.filter(pc.fill_null(mask, False))
        for values, rows in _split(part, rest):
            yield (value, *values), rows


def _partition_text(column: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_date(column.type) or pa.types.is_string(column.type):
        return column.cast(pa.string())
    return pc.cast(column, pa.string())


def read(
    spark: SparkSession,
    root: str,
    relative_paths: list[str],
    schema: pa.Schema,
    partition_columns: list[str],
    file_column: str | None = None,
    sizes: list[int] | None = None,
    deleted: list[Descriptor | None] | None = None,
    position_column: str | None = None,
) -> DataFrame:
    """The rows of the data files ``relative_paths`` (their names below ``root``, decoded) with
    ``schema`` (and ``file_column``: the file each row comes from; ``position_column``: its
    position there, as Spark's ``_metadata.row_index``). With ``sizes``, files are split and
    packed into tasks as Spark's own file reader does (``_packed``); without, a task reads a
    file. ``deleted``: each file's deletion vector (or None), whose rows are left out."""
    settings = storage.options()
    paths = list(relative_paths)
    if sizes is None:
        groups = [[Piece(i, 0, None)] for i in range(len(paths))]
    else:
        groups = _packed(spark, sizes)
    out = schema if file_column is None else schema.append(pa.field(file_column, pa.string()))
    if position_column is not None:
        out = out.append(pa.field(position_column, pa.int64()))
    vectors = deleted or [None] * len(paths)

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fs, base = storage.filesystem(root, settings)
        for batch in batches:
            for piece in (p for g in batch.column(0).to_pylist() for p in groups[g]):
                path = paths[piece.file]
                values = _values_in_path(path)
                dv = vectors[piece.file]
                with fs.open_input_file(f"{base}/{path}") as f:
                    parquet = pq.ParquetFile(f)
                    have = set(parquet.schema_arrow.names)
                    wanted = [n for n in schema.names if n in have and n not in partition_columns]
                    meta = parquet.metadata
                    row_groups = piece.row_groups(meta)
                    if not row_groups:
                        continue
                    if dv is None and position_column is None:
                        for rows in parquet.iter_batches(
                            batch_size=_BATCH_ROWS, row_groups=row_groups, columns=wanted
                        ):
                            yield _conformed(
                                rows, out, values, partition_columns, file_column, path
                            )
                        continue
                    keep = (
                        None
                        if dv is None
                        else DV.keep_mask(DV.read(root, dv, settings), meta.num_rows)
                    )
                    starts = np.cumsum(
                        [0] + [meta.row_group(k).num_rows for k in range(meta.num_row_groups)]
                    )
                    for k in row_groups:
                        at = int(starts[k])
                        for rows in parquet.iter_batches(
                            batch_size=_BATCH_ROWS, row_groups=[k], columns=wanted
                        ):
                            n = rows.num_rows
                            if position_column is not None:
                                rows = rows.append_column(
                                    position_column, pa.array(np.arange(at, at + n))
                                )
                            if keep is not None:
                                rows = rows.filter(pa.array(keep[at : at + n]))
                            at += n
                            yield _conformed(
                                rows, out, values, partition_columns, file_column, path
                            )

    numbers = spark.range(0, len(groups), 1, max(1, len(groups)))
    return numbers.mapInArrow(task, from_arrow_schema(out))


@dataclass(frozen=True)
class Piece:
    """A task's part of a data file: the row groups whose middle byte lies in [start, end)
    (``end`` None: the whole file), as Spark assigns a Parquet file's row groups to its splits."""

    file: int
    start: int
    end: int | None

    def row_groups(self, metadata: pq.FileMetaData) -> list[int]:
        if self.end is None:
            return list(range(metadata.num_row_groups))
        chosen = []
        for k in range(metadata.num_row_groups):
            group = metadata.row_group(k)
            columns = [group.column(c) for c in range(group.num_columns)]
            first = min(
                c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
                for c in columns
            )
            middle = first + sum(c.total_compressed_size for c in columns) // 2
            if self.start <= middle < self.end:
                chosen.append(k)
        return chosen


def _packed(spark: SparkSession, sizes: list[int]) -> list[list[Piece]]:
    """Files split and grouped into tasks as Spark's file reader does: a task's share is at most
    ``spark.sql.files.maxPartitionBytes`` (less when that would leave cores idle), a larger file
    is split into pieces of that share, each piece counts ``spark.sql.files.openCostInBytes``
    more, and the pieces are packed largest first (next fit). A day of small raw files is then
    a few tasks, not thousands, and one large file is read on every core;
    ``merge.one_file_a_task``'s settings give a task per file."""
    conf = spark.conf
    return packed(
        sizes,
        most=_bytes(conf.get("spark.sql.files.maxPartitionBytes", "128m")),
        open_cost=_bytes(conf.get("spark.sql.files.openCostInBytes", "4m")),
        cores=int(conf.get("spark.default.parallelism", None) or os.cpu_count() or 1),
    )


def packed(sizes: list[int], most: int, open_cost: int, cores: int) -> list[list[Piece]]:
    """``_packed`` for these settings."""
    total = sum(sizes) + open_cost * len(sizes)
    target = min(most, max(open_cost, total // cores))
    pieces = []
    for i, size in enumerate(sizes):
        if size <= target:
            pieces.append((size, Piece(i, 0, None)))
        else:
            pieces += [
                (min(target, size - start), Piece(i, start, start + target))
                for start in range(0, size, target)
            ]
    groups: list[list[Piece]] = []
    filled = target + 1
    for size, piece in sorted(pieces, key=lambda p: -p[0]):
        if groups and filled + size <= target:
            groups[-1].append(piece)
            filled += size + open_cost
        else:
            groups.append([piece])
            filled = size + open_cost
    return groups


def _bytes(text: str) -> int:
    """A size as Spark's settings write it (``134217728b``, ``128k``, ``64m``)."""
    text = text.strip().lower().removesuffix("b")
    unit = "kmgtp".find(text[-1:]) + 1 if text[-1:].isalpha() else 0
    return int(text[:-1] if unit else text) * 1024**unit


def _values_in_path(relative: str) -> dict[str, str | None]:
    values = {}
    for part in relative.split("/")[:-1]:
        key, _, value = part.partition("=")
        values[unquote(key)] = None if value == NULL_PARTITION else unquote(value)
    return values


def _conformed(
    rows: pa.RecordBatch,
    schema: pa.Schema,
    values: dict[str, str | None],
    partition_columns: list[str],
    file_column: str | None,
    file: str,
) -> pa.RecordBatch:
    n = rows.num_rows
    arrays = []
    for field in schema:
        if field.name in partition_columns:
            text = pa.repeat(pa.scalar(values.get(field.name), pa.string()), n)
            arrays.append(text.cast(field.type))
        elif field.name in rows.schema.names:
            arrays.append(_conform(rows.column(field.name), field.type))
        elif field.name == file_column:
            arrays.append(pa.repeat(pa.scalar(file, pa.string()), n))
        else:
            arrays.append(pa.nulls(n, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _conform(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` as ``target``: struct fields by name (a missing one null), else a cast (a
    column written before it was widened)."""
    if array.type == target:
        return array
    if pa.types.is_struct(target) and pa.types.is_struct(array.type):
        names = {array.type.field(i).name for i in range(array.type.num_fields)}
        children = [
            _conform(array.field(f.name), f.type)
            if f.name in names
            else pa.nulls(len(array), f.type)
            for f in target
        ]
        return pa.StructArray.from_arrays(
            children, fields=list(target), mask=array.is_null() if array.null_count else None
        )
    return array.cast(target)
