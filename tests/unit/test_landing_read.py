"""Landing files are read a chunk at a time (``landing.read_batches``) and written to raw batch by
batch (``landing_files.write``): the rows are the same as reading the file whole, line for line,
whatever the chunk size, so memory does not grow with the file."""

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from hypothesis import example, given
from hypothesis import strategies as st

from cdc_platform import lake
from cdc_platform.ingest import landing
from cdc_platform.lake import landing_files
from cdc_platform.steps.raw import ingest_files

DATE = "2026-03-01"


def _whole_file_read(path, ingest_date, topic, name=None) -> pa.Table:
    """``read_file`` as it was before chunked reading: the whole file, a Python list of lines."""
    data = path.read_bytes()
    lines = [line.rstrip(b"\r") for line in data.split(b"\n")]
    numbers = [n for n, line in enumerate(lines, start=1) if line.strip()]
    values = [lines[n - 1] for n in numbers]
    count = len(numbers)
    if path.name.endswith(landing.ENVELOPE_SUFFIX):
        columns = {f: [] for f in ("topic", "partition", "offset", "timestamp", "key", "value",
                                   "headers")}  # fmt: skip
        for line in values:
            rec = landing._envelope(line)
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
        {f.name: pa.array(columns.get(f.name, [None] * count), f.type) for f in landing.RAW_SCHEMA},
        schema=landing.RAW_SCHEMA,
    )


def _chunked(path, chunk_size: int, name: str | None = "f") -> pa.Table:
    batches = list(landing.read_batches(path, DATE, "t", name, chunk_size=chunk_size))
    assert all(b.schema.equals(landing.RAW_SCHEMA) for b in batches)
    return pa.Table.from_batches(batches, landing.RAW_SCHEMA)


def _assert_same(path, chunk_sizes=(1, 2, 3, 5, 8, 13, 64, 1 << 20)) -> None:
    expected = _whole_file_read(path, DATE, "t", "f")
    for size in chunk_sizes:
        got = _chunked(path, size)
        assert got.to_pylist() == expected.to_pylist(), size
        assert got.equals(expected), size


TRICKY = {
    "empty": b"",
    "only a newline": b"\n",
    "no trailing newline": b"a\nb",
    "one line": b"a\n",
    "crlf": b'{"a":1}\r\n{"b":2}\r\n',
    "crlf, no trailing newline": b"a\r\nb\r",
    "blank lines counted": b"\n\na\n\n\nb\n\n",
    "whitespace-only lines": b"  \n\t\n\x0b\x0c\n \r\n\r\n\r\r\nx\n",
    "spaces kept, one cr run stripped": b" a \r\n\tb\t\n",
    "inner cr kept": b"a\rb\n\ra\n",
    "long cr run": b"a" + b"\r" * 20 + b"\nb" + b"\r" * 3 + b"\n",
    "not utf-8, nul, non-ascii space": b"\xff\xfe\n\x00\n\x85\xa0\n",
    "a line longer than chunks": b"x" * 100 + b"\n\ny" * 3 + b"z" * 50,
}


@pytest.mark.parametrize("doubts", [0, landing._DOUBTS])
@pytest.mark.parametrize("name", list(TRICKY))
def test_plain_file_read_in_chunks_is_read_as_whole(tmp_path, monkeypatch, name, doubts):
    # Lines that start and end with whitespace are told blank or not line by line, or (many of
    # them) with every byte looked at: the same either way.
    monkeypatch.setattr(landing, "_DOUBTS", doubts)
    path = tmp_path / "events.jsonl"
    path.write_bytes(TRICKY[name])
    _assert_same(path)


@given(st.binary(max_size=200).map(lambda b: b.translate(bytes(b"ab\n\r \t\x0b\xff"[i % 8]
                                                              for i in range(256)))),
       st.integers(min_value=1, max_value=40))  # fmt: skip
@example(b"\r\r\r\r\r\r\ra\r\r\r\r\r\r\r\n", 3)
def test_any_bytes_read_in_chunks_are_read_as_whole(tmp_path_factory, data, chunk_size):
    path = tmp_path_factory.mktemp("landing") / "x.jsonl"
    path.write_bytes(data)
    expected = _whole_file_read(path, DATE, "t", "f")
    assert _chunked(path, chunk_size).equals(expected)
    doubts = landing._DOUBTS
    try:
        landing._DOUBTS = 0
        assert _chunked(path, chunk_size).equals(expected)
    finally:
        landing._DOUBTS = doubts


def test_envelope_file_read_in_chunks_is_read_as_whole(tmp_path, monkeypatch):
    envelopes = [
        {"topic": "orders", "partition": 0, "offset": n, "timestamp": 1_700_000_000_000 + n,
         "key": {"id": n}, "value": {"op": "c", "n": n}, "headers": {"h": "v"}}
        for n in range(10)
    ]  # fmt: skip
    envelopes[3] = {"partition": 1, "offset": 3, "value": None}  # a tombstone, default topic
    envelopes[4] = {"offset": 4, "value_b64": "AAEC"}  # binary payload
    lines = [json.dumps(e).encode() for e in envelopes]
    lines[5:5] = [b"", b"garbage \xff", b"  ", b"[1, 2]"]
    path = tmp_path / "part-0.kafka.jsonl"
    path.write_bytes(b"\r\n".join(lines) + b"\n\n")
    monkeypatch.setattr(landing, "_ENVELOPE_ROWS", 3)
    _assert_same(path, chunk_sizes=(1, 7, 100, 1 << 20))
    assert _chunked(path, 1 << 20)["topic"].to_pylist()[3] == "t"


def test_read_file_and_read_files_keep_their_tables(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(b"1\n\n2\n")
    b.write_bytes(b"")
    assert landing.read_file(a, DATE, "t").equals(_whole_file_read(a, DATE, "t"))
    both = landing.read_files([(a, "a"), (b, "b")], DATE, "t")
    assert both.to_pylist() == _whole_file_read(a, DATE, "t", "a").to_pylist()
    with pytest.raises(landing.LandingError, match="cannot read landing file"):
        landing.read_file(tmp_path / "missing.jsonl", DATE, "t")


def _debezium_lines(count: int) -> bytes:
    lines = []
    for n in range(count):
        event = {"before": None, "after": {"id": n, "name": "x" * (n % 37)},
                 "source": {"file": "bin.000001", "pos": n}, "op": "c", "ts_ms": n}  # fmt: skip
        lines.append(json.dumps(event).encode())
        if n % 11 == 0:
            lines.append(b"  ")  # a blank line, counted
    return b"\r\n".join(lines) + b"\r\n"


def _raw(warehouse) -> tuple[pa.Table, dict, pq.FileMetaData]:
    uri = lake.TableRef(lake.RAW, "s").uri(warehouse)
    (path,) = DeltaTable(uri).file_uris()
    (commit,) = Path(uri, "_delta_log").glob("*.json")
    actions = [json.loads(line) for line in commit.read_text().splitlines()]
    (stats,) = [a["add"]["stats"] for a in actions if "add" in a]
    return pq.read_table(path), json.loads(stats), pq.read_metadata(path)


def test_a_file_many_chunks_long_is_ingested_as_one_chunk(tmp_path, monkeypatch):
    """Memory does not grow with the file: a file far larger than the chunk size is ingested a
    chunk at a time into one data file, with the rows and statistics of a one-chunk read."""
    path = tmp_path / "landing" / f"dt={DATE}" / "big.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(_debezium_lines(3000))
    assert path.stat().st_size > 200 * 1024

    monkeypatch.setattr(landing_files, "_ROW_GROUP", 1000)
    whole = ingest_files(tmp_path / "one", "s", [(path, "big.jsonl")], DATE, whole_date=True)
    one, one_stats, one_meta = _raw(tmp_path / "one")
    monkeypatch.setattr(landing, "CHUNK_SIZE", 4096)  # ~60 chunks of the file
    rows = ingest_files(tmp_path / "many", "s", [(path, "big.jsonl")], DATE, whole_date=True)
    many, many_stats, many_meta = _raw(tmp_path / "many")

    assert rows == whole == many.num_rows == 3000
    assert many.equals(one)
    assert many_stats == one_stats
    assert many_stats["numRecords"] == 3000
    assert many_stats["minValues"] == {"topic": "s", "file": "big.jsonl", "line": 1}
    assert many_stats["maxValues"]["line"] == many["line"][-1].as_py() == 3000 + 3000 // 11 + 1
    assert many_stats["nullCount"] == {"topic": 0, "partition": 3000, "offset": 3000, "file": 0,
                                       "line": 0}  # fmt: skip
    # Row groups as for a one-chunk read: whole ones, whatever the chunks.
    groups = [many_meta.row_group(i).num_rows for i in range(many_meta.num_row_groups)]
    assert groups == [1000, 1000, 1000]
    assert one_meta.num_row_groups == 3

    expected = _whole_file_read(path, DATE, "s", "big.jsonl").drop_columns(["ingest_date"])
    assert many.to_pylist() == expected.to_pylist()

    # Long lines: row groups of fewer rows, so the rows held before a write stay bounded too.
    monkeypatch.setattr(landing_files, "_ROW_GROUP_BYTES", 100_000)
    ingest_files(tmp_path / "long", "s", [(path, "big.jsonl")], DATE, whole_date=True)
    long, long_stats, long_meta = _raw(tmp_path / "long")
    assert long.equals(one) and long_stats == one_stats
    groups = [long_meta.row_group(i).num_rows for i in range(long_meta.num_row_groups)]
    assert sum(groups) == 3000 and len(groups) > 3 and max(groups) < 1000


def test_an_empty_file_is_ingested_with_its_name(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    assert ingest_files(tmp_path / "w", "s", [(path, "empty.jsonl")], DATE, True) == 0
    rows, stats, _ = _raw(tmp_path / "w")
    assert rows.num_rows == 0
    assert stats == {
        "numRecords": 0,
        "minValues": {"file": "empty.jsonl"},
        "maxValues": {"file": "empty.jsonl"},
        "nullCount": {"topic": 0, "partition": 0, "offset": 0, "file": 0, "line": 0},
    }


def test_an_unreadable_file_leaves_no_data_file(tmp_path):
    good, folder = tmp_path / "a.jsonl", tmp_path / "dir.jsonl"
    good.write_bytes(b"1\n")
    folder.mkdir()
    with pytest.raises(landing.LandingError, match="cannot read landing file"):
        ingest_files(tmp_path / "w", "s", [(good, "a"), (folder, "dir")], DATE, True)
    raw = lake.TableRef(lake.RAW, "s").uri(tmp_path / "w")
    assert not list((tmp_path / "w").rglob("*.parquet")), raw
