"""How the executors' reader of a bucket splits and packs data files into tasks
(cdc_platform/lake/arrow_files.py), as Spark's own file reader does: a file larger than a
task's share is split, its row groups going to the piece that holds their middle byte."""

import io

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_platform.lake.arrow_files import Piece, packed

MB = 1 << 20


def test_a_large_file_is_split_across_the_cores_and_small_ones_packed():
    # One 100 MB file on 2 cores: a share of 52 MB (half of it and its open cost), two pieces.
    (first,), (second,) = packed([100 * MB], most=128 * MB, open_cost=4 * MB, cores=2)
    assert (first.start, first.end, second.start, second.end) == (0, 52 * MB, 52 * MB, 104 * MB)
    # Ten 1 MB files: a share of 25 MB (50 with their open costs, over 2 cores), 5 a task.
    groups = packed([MB] * 10, most=128 * MB, open_cost=4 * MB, cores=2)
    assert [len(g) for g in groups] == [5, 5]
    assert sorted(p.file for g in groups for p in g) == list(range(10))
    assert all(p.end is None for g in groups for p in g)
    # A task per file (merge.one_file_a_task): never split.
    huge = 1 << 40
    assert packed([100 * MB, MB], most=huge, open_cost=huge, cores=2) == [
        [Piece(0, 0, None)],
        [Piece(1, 0, None)],
    ]


def test_every_row_group_goes_to_exactly_one_piece():
    table = pa.table({"id": list(range(50_000)), "text": [f"row {i}" * 3 for i in range(50_000)]})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=4_000)
    size = buffer.tell()
    metadata = pq.ParquetFile(io.BytesIO(buffer.getvalue())).metadata
    for share in (size // 7, size // 3, size // 2 + 1, size):
        pieces = [Piece(0, start, start + share) for start in range(0, size, share)]
        chosen = [k for p in pieces for k in p.row_groups(metadata)]
        assert sorted(chosen) == list(range(metadata.num_row_groups))
    assert Piece(0, 0, None).row_groups(metadata) == list(range(metadata.num_row_groups))
