"""Raw of a files source: one Parquet data file per landing file, so raw's own Delta state says
which landing files it holds, at which size and modification time.

A data file of a landing file is named ``landing-<size>-<mtime_ns>-<uuid>.parquet`` and its
``file`` statistics (min = max) name the landing file. ``Held`` reads both from the add
actions (no data read; the table state delta-rs already holds), so telling new and grown files
apart costs the same at the end of a day as at its start. The commit that adds (and, for a
re-ingested file, removes) data files also records them in its metadata (``cdc.landing``).

Data files written otherwise (before files were tracked) have no identity: a date holding one
is replaced whole once (``Held.of_date`` returns None for it).
"""

import json
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Schema
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from cdc_platform.lake import storage
from cdc_platform.lake.tables import (
    PARTITION_COLUMN,
    RAW_ROW_GROUP_ROWS,
    TABLE_PROPERTIES,
    absolute_path,
    exists,
    local_path,
    open_table,
    snapshot,
)

LANDING_KEY = "cdc.landing"
_NAME = re.compile(r"(?:^|/)landing-(\d+)-(\d+)-[0-9a-f]{32}\.parquet$")
# Statistics for pruning reads by coordinates; binary and nested columns get none.
_STATS_TYPES = (pa.types.is_string, pa.types.is_integer)
_ROW_GROUP = RAW_ROW_GROUP_ROWS
_ROW_GROUP_BYTES = 128 * 1024 * 1024  # a row group of long lines: fewer rows


@dataclass(frozen=True)
class LandingFile:
    """A landing file as ingested: its name in raw's ``file`` column, size and mtime."""

    name: str
    size: int
    mtime_ns: int


def _date_actions(actions: pa.Table, date: str) -> pa.Table:
    if actions.num_rows == 0:
        return actions
    return actions.filter(
        pc.equal(actions[f"partition.{PARTITION_COLUMN}"].cast(pa.string()), date)
    )


def _add_actions(dt: DeltaTable) -> pa.Table:
    return pa.table(dt.get_add_actions(flatten=True))


def _identity(path: str, low: str | None, high: str | None) -> LandingFile | None:
    """The landing file a data file holds all of, from its name and ``file`` statistics."""
    m = _NAME.search(path)
    if m is None or low is None or low != high:
        return None
    return LandingFile(low, int(m.group(1)), int(m.group(2)))


class Held:
    """The landing files raw holds, from its add actions (one read of its Delta state: the
    snapshot this thread read last, brought up to date, as a sensor's ticks read it)."""

    def __init__(self, uri: str):
        self._actions = _add_actions(snapshot(uri)) if exists(uri) else None

    def last_name(self) -> str | None:
        """The greatest landing file name raw holds (None: none)."""
        if self._actions is None or "max.file" not in self._actions.column_names:
            return None
        return pc.max(self._actions["max.file"]).as_py()

    def of_date(self, date: str) -> dict[str, LandingFile] | None:
        """The landing files raw holds for ``date`` (name -> file); None when the date holds a
        data file of no single landing file."""
        if self._actions is None:
            return {}
        found = {}
        for _, _, file in _rows(_date_actions(self._actions, date)):
            if file is None:
                return None
            found[file.name] = file
        return found


def _rows(actions: pa.Table) -> list[tuple[str, int, LandingFile | None]]:
    """(path, size, landing file) of each add action."""
    no_stats = [None] * actions.num_rows
    low = actions["min.file"].to_pylist() if "min.file" in actions.column_names else no_stats
    high = actions["max.file"].to_pylist() if "max.file" in actions.column_names else no_stats
    paths, sizes = actions["path"].to_pylist(), actions["size_bytes"].to_pylist()
    return [
        (p, n, _identity(p, lo, hi)) for p, n, lo, hi in zip(paths, sizes, low, high, strict=True)
    ]


class _Stats:
    """Delta statistics of a data file, gathered batch by batch: rows, and min, max and null count
    of the plain columns. The ``file`` bounds are the landing file's name even when it has no
    rows, so an empty landing file is known too."""

    def __init__(self, schema: pa.Schema):
        self.rows = 0
        self.low: dict[str, object] = {}
        self.high: dict[str, object] = {}
        self.nulls = {
            f.name: 0
            for f in schema
            if f.name != PARTITION_COLUMN and any(t(f.type) for t in _STATS_TYPES)
        }

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        for name in self.nulls:
            column = batch.column(name)
            self.nulls[name] += column.null_count
            if column.null_count < len(column):
                bounds = pc.min_max(column)
                low, high = bounds["min"].as_py(), bounds["max"].as_py()
                self.low[name] = min(self.low.get(name, low), low)
                self.high[name] = max(self.high.get(name, high), high)

    def json(self, name: str) -> str:
        low, high = {**self.low, "file": name}, {**self.high, "file": name}
        return json.dumps(
            {"numRecords": self.rows, "minValues": low, "maxValues": high, "nullCount": self.nulls}
        )


def _row_groups(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.Table]:
    """The rows of ``batches`` as tables of ``_ROW_GROUP`` rows (the last one shorter), whatever
    the batches' sizes; of fewer rows when ``_ROW_GROUP_BYTES`` come first (long lines), so the
    rows held in memory are bounded. A short rest is copied: it does not hold its batch."""
    held: list[pa.RecordBatch] = []
    count = size = 0
    for batch in batches:
        held.append(batch)
        count += batch.num_rows
        size += batch.nbytes
        if count < _ROW_GROUP and size < _ROW_GROUP_BYTES:
            continue
        rows = pa.Table.from_batches(held)
        full = count - count % _ROW_GROUP if count >= _ROW_GROUP else count
        yield rows.slice(0, full)
        rest = rows.slice(full)
        count, size = rest.num_rows, rest.nbytes
        held = rest.take(pa.array(range(count), pa.int64())).to_batches() if count else []
    if count:
        yield pa.Table.from_batches(held)


def _write(
    uri: str, date: str, schema: pa.Schema, file: LandingFile, batches: Iterable[pa.RecordBatch]
) -> AddAction:
    """One landing file's rows (``schema``) as one data file in the date's partition folder, its
    batches written as they come."""
    relative = f"{PARTITION_COLUMN}={date}/landing-{file.size}-{file.mtime_ns}-{uuid.uuid4().hex}"
    fs, base = storage.filesystem(uri)
    path = f"{base}/{relative}.parquet"
    fs.create_dir(f"{base}/{PARTITION_COLUMN}={date}")  # a local folder; nothing in a store
    columns = [f.name for f in schema if f.name != PARTITION_COLUMN]
    stats = _Stats(schema)
    written = (b.select(columns) for b in batches)
    try:
        with fs.open_output_stream(path) as stream:
            with pq.ParquetWriter(stream, schema.remove(schema.get_field_index(PARTITION_COLUMN)),
                                  compression="snappy") as writer:  # fmt: skip
                for rows in _row_groups(written):
                    for batch in rows.to_batches():
                        stats.add(batch)
                    writer.write_table(rows, row_group_size=_ROW_GROUP)
            size = stream.tell()
    except BaseException:
        _delete(fs, path)
        raise
    return AddAction(
        path=relative + ".parquet",
        size=size,
        partition_values={PARTITION_COLUMN: date},
        modification_time=int(time.time() * 1000),
        data_change=True,
        stats=stats.json(file.name),
    )


def write(
    uri: str,
    schema: pa.Schema,
    date: str,
    files: list[tuple[LandingFile, Iterable[pa.RecordBatch]]],
    whole_date: bool,
) -> int:
    """Add one data file per landing file of ``date`` (its rows: batches of ``schema``, written as
    they come) and, in the same commit, remove what they replace: the date's every data file
    (``whole_date``), else those of the same landing names (a grown or rewritten file).
    ``schema``: the table's, when it is created. Returns the table's new version."""
    names = {f.name for f, _ in files}
    adds = []
    try:
        for f, batches in files:
            adds.append(_write(uri, date, schema, f, batches))
    except BaseException:  # a landing file that cannot be read: no data file is left behind
        fs, base = storage.filesystem(uri)
        for add in adds:
            _delete(fs, f"{base}/{add.path}")
        raise
    metadata = {
        LANDING_KEY: json.dumps({"date": date, "files": [asdict(f) for f, _ in files]}),
    }
    props = CommitProperties(custom_metadata=metadata)
    if not exists(uri):
        create_table_with_add_actions(
            uri,
            Schema.from_arrow(schema),
            adds,
            partition_by=[PARTITION_COLUMN],
            configuration=TABLE_PROPERTIES,
            storage_options=storage.delta_options(uri),
            commit_properties=props,
        )
        return open_table(uri).version()
    dt = open_table(uri)
    removes = []
    now = int(time.time() * 1000)
    for path, size, file in _rows(_date_actions(_add_actions(dt), date)):
        if not whole_date and file is None:
            raise ValueError(
                f"{uri}: {date} holds rows of several landing files in one data file (written "
                "before files were tracked); replace the whole date"
            )
        if whole_date or file.name in names:
            removes.append(
                RemoveAction(
                    path=path, data_change=True, deletion_timestamp=now, size=size,
                    partition_values={PARTITION_COLUMN: date},
                )
            )  # fmt: skip
    if not removes and not adds:
        return dt.version()
    dt.create_write_transaction(
        [*removes, *adds], mode="append", schema=dt.schema(), partition_by=[PARTITION_COLUMN],
        commit_properties=props,
    )  # fmt: skip
    return open_table(uri).version()


def _delete(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        return


def replaced_names(uri: str, after: int | None, upto: int) -> dict[str, list[str]]:
    """Per date, the landing files whose rows raw removed between versions ``after`` and
    ``upto`` (re-ingested files, replaced dates): their change records must go too."""
    if after is None:
        return {}
    gone = {local_path(f) for f in open_table(uri, after).file_uris()} - {
        local_path(f) for f in open_table(uri, upto).file_uris()
    }
    if not gone:
        return {}
    names: dict[str, set[str]] = {}
    actions = _add_actions(open_table(uri, after))
    dates = actions[f"partition.{PARTITION_COLUMN}"].cast(pa.string()).to_pylist()
    fs, base = storage.filesystem(uri)
    for (path, _, file), date in zip(_rows(actions), dates, strict=True):
        if local_path(absolute_path(uri, path)) not in gone:
            continue
        if file is not None:
            names.setdefault(date, set()).add(file.name)
        else:  # a data file of several landing files: its names are in its rows
            column = pq.read_table(f"{base}/{path}", columns=["file"], filesystem=fs)["file"]
            names.setdefault(date, set()).update(n for n in pc.unique(column).to_pylist() if n)
    return {d: sorted(n) for d, n in names.items()}
