"""Kafka transport: the topic-partitions of a source -> ``raw/<source>``, exactly once.

Offsets live in the raw table, not in the consumer group. A batch is ONE Delta commit that
appends its records and, for each topic-partition it covers, sets a Delta transaction
identifier (a ``txn`` action, app id ``cdc.kafka/<topic>/<partition>``) whose version is the
next offset to read. Records and offsets change atomically, so a run that dies before the commit
leaves nothing (the next run reads the same records again) and a run that dies after it leaves
the offsets past its records (the next run goes on from there): nothing lost, nothing twice. The
commit is made against the table version the offsets were read from, so two runs racing over the
same partitions cannot both commit. The commit metadata ``cdc.kafka`` repeats the offset ranges
for people and monitors; consumer-group offsets are committed after the Delta commit for lag
monitoring only and are never read.

A run is bounded by ``max_records`` and ``max_bytes`` (key + value + header bytes), so a large
backlog is worked through in several runs, each its own batch, and by each partition's high
watermark at its start, so it does not chase a producer that keeps writing.

A continuous run keeps its consumer from one micro-batch to the next (``KafkaReader``), so the
records that arrive while Spark works on one micro-batch are fetched meanwhile. The offsets
stored in raw stay the only truth: a kept consumer that does not stand exactly at them is
assigned there again.
"""

import bisect
import datetime as dt
import gc
import itertools
import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.ingest.landing import RAW_SCHEMA, raw_batch
from cdc_platform.timings import phase

log = logging.getLogger(__name__)

_CONSUME_BATCH = 10_000
# consume() waits this long unless its whole count arrives first: a short wait, so a small
# batch (or a partition's end) ends its run at once instead of after a long poll.
_POLL_SECONDS = 0.05
_METADATA_TIMEOUT = 15.0
_NO_TIMESTAMP = 0  # confluent_kafka.TIMESTAMP_NOT_AVAILABLE
# librdkafka's local error codes: public API, though spelled with a leading underscore.
_END_OF_PARTITION = KafkaError._PARTITION_EOF  # noqa: SLF001
_OFFSET_GONE = KafkaError._AUTO_OFFSET_RESET  # noqa: SLF001
_UNREACHABLE = (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)  # noqa: SLF001


class KafkaIngestError(Exception):
    """Ingestion could not read its topics (unreachable brokers, lost offsets, a broker error)."""


class KafkaUnavailable(KafkaIngestError):
    """The brokers did not answer (transient: a later try may succeed)."""


@dataclass
class KafkaIngestResult:
    """What one run stored: ``version`` is None when there was nothing new (no commit)."""

    records: int
    bytes: int
    version: int | None
    ingest_date: str
    # topic -> partition -> [first offset, next offset) of the records stored
    offsets: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    # More records may be waiting for the next run: a bound ended the batch, or a partition was
    # left at its end as of the run's start while its producer kept writing.
    bounded: bool = False


def group_id(source: SourceConfig) -> str:
    """The consumer group whose offsets are committed for monitoring."""
    assert source.kafka is not None
    return source.kafka.group_id or f"cdc-platform.{source.name}"


def _consumer(source: SourceConfig, prefetch: bool = False) -> Consumer:
    """A consumer of the source; with ``prefetch`` its queue holds up to a whole batch (the
    source's ``max_records`` and ``max_bytes``; librdkafka's defaults fetch ahead far less)."""
    kafka = source.kafka
    assert kafka is not None
    ahead = {
        "queued.min.messages": min(kafka.max_records, 10_000_000),
        "queued.max.messages.kbytes": min(-(-kafka.max_bytes // 1024), 2_097_151),
    }
    return Consumer(
        {
            # A run reads what is there and stops: the broker need not hold a fetch open for
            # more (librdkafka's default wait, 500 ms, ended every run's last fetch). The
            # source's consumer settings may say otherwise.
            "fetch.wait.max.ms": 50,
            **(ahead if prefetch else {}),
            **kafka.client_settings(),
            "group.id": group_id(source),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # Every partition is assigned at an explicit offset; "error" only fires when a stored
            # offset is gone from the broker, which must stop the run rather than skip records.
            "auto.offset.reset": "error",
        }
    )


def _partitions(consumer: Consumer, source: SourceConfig) -> list[tuple[str, int]]:
    """The topic-partitions to read: the named topics, or every topic the pattern fully matches."""
    assert source.kafka is not None
    try:
        metadata = consumer.list_topics(timeout=_METADATA_TIMEOUT)
    except KafkaException as e:
        servers = source.kafka.bootstrap_servers
        raise KafkaUnavailable(f"source {source.name}: no metadata from {servers}: {e}") from None
    if source.kafka.topics is not None:
        names = source.kafka.topics
        for name in names:
            if name not in metadata.topics or metadata.topics[name].error is not None:
                log.warning("source %s: topic %s does not exist (yet)", source.name, name)
    else:
        pattern = re.compile(source.kafka.topic_pattern or "")
        names = sorted(
            t for t in metadata.topics if not t.startswith("__") and pattern.fullmatch(t)
        )
    return sorted(
        (name, p)
        for name in names
        if name in metadata.topics and metadata.topics[name].error is None
        for p in metadata.topics[name].partitions
    )


def pending(warehouse: str, source: SourceConfig) -> dict[str, dict[int, list[int]]]:
    """The topic-partitions holding records that raw does not have yet: topic -> partition ->
    [next offset raw would read, high watermark]. Reads the broker's watermarks and the table's
    stored offsets; writes nothing (the sensor calls it on every tick).

    Some brokers (Tansu) report a high watermark that points into the newest record batch rather
    than past it; it still passes the stored offset when a new record batch exists."""
    consumer = _consumer(source)
    try:
        partitions = _partitions(consumer, source)
        uri = lake.TableRef(lake.RAW, source.name).uri(warehouse)
        stored = lake.kafka_stored_offsets(uri, partitions)
        # A batch that ended at a bound may have stopped inside the broker's newest record
        # batch, which such a watermark does not reveal: its partitions are asked again.
        cut_short = _cut_short(uri)
        waiting: dict[str, dict[int, list[int]]] = {}
        for topic, partition in partitions:
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=_METADATA_TIMEOUT
                )
            except KafkaException as e:
                raise KafkaUnavailable(f"{topic}[{partition}]: no watermarks: {e}") from None
            start = stored.get((topic, partition), low)
            if high > start or (topic, partition) in cut_short:
                waiting.setdefault(topic, {})[partition] = [start, max(high, start)]
        return waiting
    finally:
        consumer.close()


def reset_offsets(warehouse: str, source: SourceConfig, to: str) -> dict[tuple[str, int], int]:
    """Set the next offset of every topic-partition of the source to the broker's earliest or
    latest, in one (record-less) Delta commit on raw. Records read again after ``earliest`` are
    appended to raw again; the change log and current table absorb them (same sequence, newest
    wins). Returns the offsets set."""
    consumer = _consumer(source)
    try:
        partitions = _partitions(consumer, source)
        offsets = {}
        for topic, partition in partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=_METADATA_TIMEOUT
            )
            offsets[(topic, partition)] = low if to == "earliest" else high
    finally:
        consumer.close()
    if not offsets:
        raise KafkaIngestError(f"source {source.name}: no topic-partitions to reset")
    uri = lake.TableRef(lake.RAW, source.name).uri(warehouse)
    read_version, _ = lake.kafka_offsets(uri, RAW_SCHEMA, partitions)
    lake.append_kafka_batch(
        uri,
        RAW_SCHEMA.empty_table(),
        read_version,
        offsets,
        {"reset": to, "records": 0, "offsets": {}},
    )
    return offsets


def _cut_short(uri: str) -> set[tuple[str, int]]:
    """The partitions of the table's newest Kafka batch when a bound ended it."""
    return {
        (topic, int(p))
        for b in lake.kafka_batches(uri, limit=1)
        if b.get("bounded")
        for topic, parts in b.get("offsets", {}).items()
        for p in parts
    }


class KafkaReader:
    """A source's consumer kept open across a continuous run's micro-batches, and where it
    stands. While Spark works on a micro-batch, librdkafka fetches what arrives into its queue,
    so the next micro-batch takes those records from memory instead of waiting on the broker
    (a plain consumer: 1 µs a record of 700 B from the queue, 7 from the embedded broker;
    BENCHMARKS.md). The queue holds at most the source's ``max_records`` and ``max_bytes``
    besides the batch being built.

    ``position`` is the next offset the consumer delivers, per topic-partition, when that is
    known: after a batch that took every record the consumer delivered and paused nothing. A
    batch whose stored offsets differ (another run committed; the last batch left fetched records
    behind) assigns the partitions at the stored offsets again, which drops what was fetched."""

    def __init__(self, source: SourceConfig) -> None:
        self.consumer = _consumer(source, prefetch=True)
        self.position: dict[tuple[str, int], int] | None = None

    def close(self) -> None:
        self.consumer.close()


def _size(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]) -> int:
    return (
        len(key or b"")
        + len(value or b"")
        + sum(len(k.encode()) + len(v or b"") for k, v in headers)
    )


class _Batch:
    """Records accepted so far, column by column, and the offsets they cover."""

    def __init__(self, max_records: int, max_bytes: int) -> None:
        self.max_records, self.max_bytes = max_records, max_bytes
        self.columns: dict[str, list] = {
            c: [] for c in ("topic", "partition", "offset", "timestamp", "key", "value", "headers")
        }
        self.bytes = 0
        self.first: dict[tuple[str, int], int] = {}
        self.next: dict[tuple[str, int], int] = {}

    def __len__(self) -> int:
        return len(self.columns["offset"])

    @property
    def full(self) -> bool:
        return len(self) >= self.max_records or self.bytes >= self.max_bytes

    def take(self, msgs: list[Message]) -> bool:
        """Take the records ``msgs`` (as consumed, no error events) up to the bounds, column by
        column (the first record of a batch is always taken, however large, so a run always
        progresses); False when a bound refused some."""
        topics = [m.topic() for m in msgs]
        partitions = [m.partition() for m in msgs]
        offsets = [m.offset() for m in msgs]
        tps = list(zip(topics, partitions, strict=True))
        firsts = dict(zip(reversed(tps), reversed(offsets), strict=True))
        if any(o < self.next.get(tp, -1) for tp, o in firsts.items()):
            # Delivered again (never expected): those records are already in the batch.
            fresh = [i for i, tp in enumerate(tps) if offsets[i] >= self.next.get(tp, -1)]
            return self.take([msgs[i] for i in fresh]) if fresh else True
        keys = [m.key() for m in msgs]
        values = [m.value() for m in msgs]
        headers = [m.headers() for m in msgs]
        sizes = [len(k or b"") + len(v or b"") for k, v in zip(keys, values, strict=True)]
        if any(headers):
            sizes = [
                s + _size(None, None, h) if h else s for s, h in zip(sizes, headers, strict=True)
            ]
        room = bisect.bisect_right(list(itertools.accumulate(sizes)), self.max_bytes - self.bytes)
        n = min(room, self.max_records - len(self), len(msgs))
        if not len(self):
            n = max(n, min(1, len(msgs)))
        if n < len(msgs):
            del topics[n:], partitions[n:], offsets[n:], keys[n:], values[n:], headers[n:], tps[n:]
            firsts = dict(zip(reversed(tps), reversed(offsets), strict=True))
        stamps = [m.timestamp() for m in msgs[:n]]
        columns = self.columns
        columns["topic"] += topics
        columns["partition"] += partitions
        columns["offset"] += offsets
        columns["timestamp"] += [None if kind == _NO_TIMESTAMP else ts for kind, ts in stamps]
        columns["key"] += keys
        columns["value"] += values
        columns["headers"] += headers  # None for none: the Arrow batch makes them empty lists
        self.bytes += sum(sizes[:n])
        for tp, o in firsts.items():
            self.first.setdefault(tp, o)
        self.next.update(zip(tps, offsets, strict=True))  # the last offset of each...
        for tp in firsts:
            self.next[tp] += 1  # ...and the next one after it
        return n == len(msgs)

    def table(self, ingest_date: str) -> pa.Table:
        n = len(self)
        headers = self.columns["headers"]
        arrays = {
            **{
                f.name: pa.array(self.columns[f.name], f.type)
                for f in RAW_SCHEMA
                if f.name in self.columns and f.name not in ("timestamp", "headers")
            },
            "headers": _headers(headers, RAW_SCHEMA.field("headers").type),
            "timestamp": pa.array(self.columns["timestamp"], pa.int64())
            .cast(pa.timestamp("ms", tz="UTC"))
            .cast(RAW_SCHEMA.field("timestamp").type),
            "ingest_date": pa.array([dt.date.fromisoformat(ingest_date)] * n, pa.date32()),
        }
        return pa.Table.from_batches([raw_batch(arrays, n)])


def _headers(headers: list[list[tuple[str, bytes | None]] | None], kind: pa.ListType) -> pa.Array:
    """The headers column: a list of {key, value} per record, empty for a record without."""
    if not any(headers):  # the usual case, built without a Python object per record
        offsets = pa.array(np.zeros(len(headers) + 1, dtype=np.int32))
        return pa.ListArray.from_arrays(offsets, pa.array([], kind.value_type), type=kind)
    rows = [[{"key": k, "value": v} for k, v in h] if h else [] for h in headers]
    return pa.array(rows, kind)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off while a batch fills. Each record adds a Message and list
    entries, and the collections those allocations set off rescan every record taken so far:
    two thirds of the time to consume 100,000 records (BENCHMARKS.md). Nothing a batch holds
    forms a cycle, so nothing waits for a collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _ends(consumer: Consumer, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Each partition's high watermark now: where this run stops reading it."""
    ends = {}
    for topic, partition in partitions:
        try:
            _, ends[(topic, partition)] = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=_METADATA_TIMEOUT
            )
        except KafkaException as e:
            raise KafkaUnavailable(f"{topic}[{partition}]: no watermarks: {e}") from None
    return ends


def _consume(
    consumer: Consumer,
    pending: set[tuple[str, int]],
    batch: _Batch,
    idle: float,
    ends: dict[tuple[str, int], int],
) -> tuple[bool, bool]:
    """Fill ``batch`` until every partition reported its end or passed ``ends`` (its high
    watermark when the run started), a bound is reached, or nothing came for ``idle`` seconds.
    Returns (more waiting, in step). More waiting: a bound ended the batch, or a partition was
    left at its start-time end while its producer kept writing. In step: the batch holds every
    record the consumer delivered and no partition is paused, so the consumer delivers next
    from the batch's next offsets (``KafkaReader``).

    Without ``ends`` a run chases a busy producer: the end-of-partition event only comes when a
    fetch finds nothing new, and under steady writes it found something for seconds (3.7 s for
    30,000 records behind at 1,000 records/s on the embedded broker). A partition past its end
    still waits for what comes next, as some brokers' watermarks (Tansu's) point into the
    newest record batch: the end-of-partition event ends it cleanly, a new record cuts it
    short (the sensor asks again).

    A kept consumer queues an end-of-partition event whenever it catches up, also between
    batches: one that records followed is stale and ignored. One below the start-time end with
    nothing after it (the queue empty for a poll) ends its partition too: the end stands below
    the watermark when the rest is not readable yet (an open transaction)."""
    quiet_since = time.monotonic()
    assigned = len(pending)
    past_end: set[tuple[str, int]] = set()
    below_end: set[tuple[str, int]] = set()  # at an end-of-partition event below ``ends``
    cut_short, in_step = False, True
    while pending:
        msgs = consumer.consume(
            num_messages=max(1, min(_CONSUME_BATCH, batch.max_records - len(batch))),
            timeout=_POLL_SECONDS,
        )
        if not msgs:
            if below_end:  # nothing came after their end-of-partition events
                pending -= below_end
                below_end.clear()
            elif time.monotonic() - quiet_since > idle:
                log.warning(
                    "no end of partition reported within %.0f s for %s; ending the batch",
                    idle,
                    ", ".join(f"{t}[{p}]" for t, p in sorted(pending)),
                )
                return cut_short, in_step
            continue
        quiet_since = time.monotonic()
        records = [m for m in msgs if m.error() is None]
        if len(pending) < assigned:  # a partition is done: what it delivers since is not taken
            taken = [m for m in records if (m.topic(), m.partition()) in pending]
            in_step = in_step and len(taken) == len(records)
            records = taken
        if records and not batch.take(records):
            return True, False
        delivered = {(m.topic(), m.partition()) for m in records}
        below_end -= delivered
        for msg in msgs if len(records) < len(msgs) else []:
            err = msg.error()
            if err is None:
                continue
            if err.code() == _END_OF_PARTITION:
                tp = (msg.topic(), msg.partition())
                if batch.next.get(tp, -1) > msg.offset():
                    continue  # stale: records past it came in the same delivery
                if msg.offset() >= ends.get(tp, 0):
                    pending.discard(tp)
                elif tp in pending:
                    below_end.add(tp)
            elif err.code() == _OFFSET_GONE:
                raise KafkaIngestError(
                    f"{msg.topic()}[{msg.partition()}]: the next offset to ingest is no longer on "
                    f"the broker (retention or a recreated topic): {err.str()}"
                )
            elif err.code() in _UNREACHABLE or err.retriable():
                raise KafkaUnavailable(f"{msg.topic()}[{msg.partition()}]: {err.str()}")
            else:
                raise KafkaIngestError(f"{msg.topic()}[{msg.partition()}]: {err.str()}")
        if batch.full:
            return True, in_step
        if still_writing := past_end & delivered & pending:
            pending -= still_writing
            cut_short = True
            if pending:  # the others read on: this one must stop delivering
                consumer.pause([TopicPartition(t, p) for t, p in sorted(still_writing)])
                in_step = False
        past_end |= {tp for tp in delivered & pending if batch.next[tp] >= ends.get(tp, 1 << 62)}
    return cut_short, in_step


def ingest_kafka(
    warehouse: str,
    source: SourceConfig,
    max_records: int | None = None,
    max_bytes: int | None = None,
    date: str | None = None,
    reader: KafkaReader | None = None,
) -> KafkaIngestResult:
    """Read the source's topic-partitions from the offsets stored in ``raw/<source>`` (the
    earliest offset for a partition never read) and append what came, at most ``max_records``
    records and ``max_bytes`` bytes (default: the source's settings), as one Delta commit in the
    ``ingest_date`` partition ``date`` (default: today, UTC). Nothing new: no commit. With a
    ``reader`` its consumer reads, and stays open; without, a consumer of this call's own."""
    kafka = source.kafka
    if source.transport != "kafka" or kafka is None:
        raise KafkaIngestError(f"source {source.name} is not a transport: kafka source")
    date = date or dt.datetime.now(dt.UTC).date().isoformat()
    uri = lake.TableRef(lake.RAW, source.name).uri(warehouse)
    batch = _Batch(max_records or kafka.max_records, max_bytes or kafka.max_bytes)
    consumer = reader.consumer if reader is not None else _consumer(source)
    try:
        with phase("kafka.metadata"):
            partitions = _partitions(consumer, source)
        result = KafkaIngestResult(0, 0, None, date)
        if not partitions:
            return result
        with phase("kafka.offsets"):
            read_version, stored = lake.kafka_offsets(uri, RAW_SCHEMA, partitions)
        start = {tp: stored.get(tp, OFFSET_BEGINNING) for tp in partitions}
        if reader is None or reader.position != start:
            assignment = [TopicPartition(t, p, o) for (t, p), o in start.items()]
            consumer.assign(assignment)
            if reader is not None:
                consumer.resume(assignment)  # what the last batch paused
        if reader is not None:
            reader.position = None  # known again when this batch ends in step
        with phase("kafka.consume"), _collector_paused():
            ends = _ends(consumer, partitions)
            result.bounded, in_step = _consume(
                consumer, set(partitions), batch, kafka.idle_timeout_seconds, ends
            )
        if not len(batch):
            if _cut_short(uri):
                # The previous batch ended exactly at the end: record that nothing is left, or
                # the sensor would keep asking (see ``pending``).
                lake.append_kafka_batch(
                    uri, RAW_SCHEMA.empty_table(), read_version, {}, {"records": 0, "offsets": {}}
                )
            if reader is not None and in_step:
                reader.position = start
            return result
        for (topic, partition), first in sorted(batch.first.items()):
            result.offsets.setdefault(topic, {})[partition] = [
                first,
                batch.next[(topic, partition)],
            ]
        metadata = {
            "records": len(batch),
            "bytes": batch.bytes,
            "ingest_date": date,
            "offsets": result.offsets,
            "bounded": result.bounded,
        }
        with phase("kafka.arrow_batch"):
            table = batch.table(date)
        result.records, result.bytes = len(batch), batch.bytes
        batch.columns.clear()  # the records live on in ``table`` alone
        with phase("kafka.raw_commit"):
            result.version = lake.append_kafka_batch(uri, table, read_version, batch.next, metadata)
        if reader is not None and in_step:
            reader.position = {**start, **batch.next}
        if kafka.commit_consumer_offsets:
            with phase("kafka.group_commit"):
                _commit_group_offsets(consumer, source, batch.next)
        return result
    finally:
        if reader is None:
            with phase("kafka.close"):
                consumer.close()


def _commit_group_offsets(
    consumer: Consumer, source: SourceConfig, next_offsets: dict[tuple[str, int], int]
) -> None:
    """Lag monitors read the group's offsets; ingestion never does, so a failure only warns."""
    offsets = [TopicPartition(t, p, o) for (t, p), o in sorted(next_offsets.items())]
    try:
        consumer.commit(offsets=offsets, asynchronous=False)
    except KafkaException as e:
        log.warning("source %s: consumer-group offsets not committed: %s", source.name, e)
