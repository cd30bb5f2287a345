"""The test S3 server (tests/s3_server.py) behaves as S3 does where the lake relies on it: it
refuses a bad signature, and delta-rs's commits (conditional puts) on it never overwrite one
another, so the object-storage tests prove something about real S3."""

import threading

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable, write_deltalake

pytestmark = pytest.mark.s3


def _race(count: int, action) -> list[Exception | None]:
    """``action(i)`` on ``count`` threads released at once: each one's error, or None."""
    start, results = threading.Barrier(count), [None] * count

    def run(i: int) -> None:
        start.wait()
        try:
            action(i)
        except Exception as error:  # the loser's error is the result
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_a_wrong_secret_is_refused_and_writes_nothing(s3_server, s3_bucket):
    wrong = s3_server.filesystem(secret_key="not-" + s3_server.secret_key)
    with pytest.raises(OSError, match="SIGNATURE_DOES_NOT_MATCH|ACCESS_DENIED"):
        with wrong.open_output_stream(f"{s3_bucket}/x") as out:
            out.write(b"x")
    info = s3_server.filesystem().get_file_info(f"{s3_bucket}/x")
    assert info.type == pafs.FileType.NotFound


def test_delta_rs_appends_to_a_table_in_the_bucket_and_reads_them_back(s3_server, s3_bucket):
    uri, options = f"s3://{s3_bucket}/t", s3_server.env()
    write_deltalake(uri, pa.table({"x": [1, 2]}), mode="append", storage_options=options)
    write_deltalake(uri, pa.table({"x": [3]}), mode="append", storage_options=options)
    table = DeltaTable(uri, storage_options={k.lower(): v for k, v in options.items()})
    assert table.version() == 1
    assert sorted(table.to_pyarrow_table()["x"].to_pylist()) == [1, 2, 3]


def test_racing_delta_rs_commits_never_overwrite_one_another(s3_server, s3_bucket):
    options = s3_server.env()
    appended = f"s3://{s3_bucket}/appended"
    write_deltalake(appended, pa.table({"x": [0]}), storage_options=options)

    def append(i: int) -> None:
        write_deltalake(appended, pa.table({"x": [i + 1]}), mode="append", storage_options=options)

    assert _race(4, append) == [None] * 4  # delta-rs retried the losers at the next version
    table = DeltaTable(appended, storage_options=options)
    assert table.version() == 4
    assert sorted(table.to_pyarrow_table()["x"].to_pylist()) == [0, 1, 2, 3, 4]

    created = f"s3://{s3_bucket}/created"

    def create(i: int) -> None:
        schema = pa.schema([("x", pa.int64())])
        DeltaTable.create(created, schema, name=f"w{i}", storage_options=options)

    # A losing create is refused, or (delta-rs retries commits, on local disk too) committed as
    # version 1: either way each create that returned holds a version of its own.
    won = {f"w{i}" for i, error in enumerate(_race(2, create)) if error is None}
    latest = DeltaTable(created, storage_options=options).version()
    names = [
        DeltaTable(created, version=v, storage_options=options).metadata().name
        for v in range(latest + 1)
    ]
    assert len(names) == len(won) and set(names) == won
