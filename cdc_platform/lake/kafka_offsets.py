"""A Kafka source's raw table and its offsets: each batch of records is appended in one commit
with the next offset of every partition it covers, as Delta transaction ids (``txn``), so the
offsets ingestion resumes from are part of the table state itself: exactly once.

The batch comes from the consumer (``cdc_platform.ingest.kafka``) as Arrow, bounded by the
batch size; delta-rs writes it from this process.
"""

import json
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, WriterProperties, write_deltalake

from cdc_platform.lake import storage
from cdc_platform.lake.tables import (
    PARTITION_COLUMN,
    RAW_ROW_GROUP_ROWS,
    TABLE_PROPERTIES,
    exists,
    open_table,
    snapshot,
)

_WRITER = WriterProperties(max_row_group_size=RAW_ROW_GROUP_ROWS, compression="SNAPPY")

# Commit metadata of a Kafka batch: the offset ranges it covers, for people and monitors. The
# offsets ingestion resumes from are the txn actions below, part of the table state itself.
KAFKA_KEY = "cdc.kafka"


def kafka_app_id(topic: str, partition: int) -> str:
    """The Delta transaction identifier (``txn`` app id) of one topic-partition; its version is
    the next offset to read."""
    return f"cdc.kafka/{topic}/{partition}"


def kafka_offsets(
    uri: str, schema: pa.Schema, partitions: list[tuple[str, int]]
) -> tuple[int, dict[tuple[str, int], int]]:
    """The raw table's version and the next offset of each partition it has records of.

    Creates the (empty, ``ingest_date``-partitioned) table when absent, so every batch commits
    against a version it read: see ``append_kafka_batch``."""
    if not exists(uri):
        try:
            DeltaTable.create(
                uri, schema, mode="ignore", partition_by=[PARTITION_COLUMN],
                configuration=TABLE_PROPERTIES, storage_options=storage.delta_options(uri),
            )  # fmt: skip
        except Exception:  # a concurrent run created it first; delta-rs has no common base class
            if not exists(uri):
                raise
    dt = snapshot(uri)
    return dt.version(), _stored_offsets(dt, partitions)


def kafka_stored_offsets(uri: str, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The next offset of each partition the raw table has records of (read only)."""
    return _stored_offsets(snapshot(uri), partitions) if exists(uri) else {}


def _stored_offsets(
    dt: DeltaTable, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    found = {}
    for topic, partition in partitions:
        offset = dt.transaction_version(kafka_app_id(topic, partition))
        if offset is not None:
            found[(topic, partition)] = offset
    return found


def append_kafka_batch(
    uri: str,
    data: pa.Table,
    read_version: int,
    next_offsets: dict[tuple[str, int], int],
    metadata: dict[str, Any],
) -> int:
    """Append one batch and set each partition's next offset in the same commit.

    The commit is made against ``read_version``, the version the offsets were read from: when
    another run committed offsets of the same partitions since, Delta's conflict check on the
    transaction identifiers fails this commit instead of storing the records twice."""
    txns = [Transaction(kafka_app_id(t, p), o) for (t, p), o in sorted(next_offsets.items())]
    props = CommitProperties(
        custom_metadata={KAFKA_KEY: json.dumps(metadata)}, app_transactions=txns
    )
    write_deltalake(
        open_table(uri, read_version),
        data,
        mode="append",
        schema_mode="merge",
        commit_properties=props,
        writer_properties=_WRITER,
    )
    return open_table(uri).version()


def kafka_batches(uri: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The ``cdc.kafka`` metadata of the table's Kafka batches, newest first, with ``version``."""
    if not exists(uri):
        return []
    return [
        {**json.loads(c[KAFKA_KEY]), "version": c["version"]}
        for c in open_table(uri).history(limit)
        if KAFKA_KEY in c
    ]
