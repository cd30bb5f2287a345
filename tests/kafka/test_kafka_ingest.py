"""Kafka -> raw against a real broker (the embedded Tansu, see tests/conftest.py) and real Delta
tables on disk: bounded runs, resume from the table, crashes around the Delta commit, and the
corpus end to end."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable

from cdc_platform import lake
from cdc_platform.catalog import KafkaConfig, SourceConfig, TableConfig
from cdc_platform.ingest import kafka
from cdc_platform.ingest.landing import RAW_SCHEMA
from cdc_platform.normalize import table_name
from cdc_platform.steps.changelog import normalize_source
from cdc_platform.steps.current import current_rows, merge_current
from tests.conftest import CORPUS, FIXTURES
from tests.spark.test_corpus_debezium import _column_types, _comparable

DATE = "2026-03-01"
ROOT = Path(__file__).resolve().parents[2]


# --- helpers --------------------------------------------------------------------------------


def _topic(bootstrap: str, name: str, partitions: int = 1) -> str:
    """A new topic of this test (names are unique: the broker lives for the whole session)."""
    topic = f"{name}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=10)
    return topic


def _produce(bootstrap: str, topic: str, records: list[dict]) -> list[dict]:
    """Produce ``records`` (partition, key, value, headers, timestamp) and return them with the
    offsets the broker gave them."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    delivered: list[dict] = []

    def done(err, msg, record):
        assert err is None, err
        delivered.append({**record, "partition": msg.partition(), "offset": msg.offset()})

    for r in records:
        producer.produce(
            topic,
            value=r.get("value"),
            key=r.get("key"),
            partition=r.get("partition", 0),
            headers=r.get("headers"),
            timestamp=r.get("timestamp", 0),
            on_delivery=lambda err, msg, r=r: done(err, msg, r),
        )
    assert producer.flush(15) == 0
    assert len(delivered) == len(records)
    return delivered


def _source(bootstrap: str, topics: list[str] | None = None, **settings) -> SourceConfig:
    return SourceConfig(
        name="k",
        transport="kafka",
        format=settings.pop("format", "auto"),
        kafka=KafkaConfig(
            bootstrap_servers=bootstrap, topics=topics, idle_timeout_seconds=5, **settings
        ),
    )


def _raw(warehouse: Path) -> list[dict]:
    table = lake.read_arrow(lake.TableRef(lake.RAW, "k").uri(warehouse))
    assert table is not None and table.schema.equals(RAW_SCHEMA)
    return sorted(table.to_pylist(), key=lambda r: (r["topic"], r["partition"], r["offset"]))


def _run_until_empty(warehouse: Path, source: SourceConfig, **settings) -> list:
    results = []
    while (r := kafka.ingest_kafka(warehouse, source, date=DATE, **settings)).version is not None:
        results.append(r)
        assert len(results) < 100
    assert r.records == 0 and not r.bounded
    return results


def _coordinates(rows: list[dict]) -> list[tuple]:
    return [(r["topic"], r["partition"], r["offset"]) for r in rows]


def _group_offsets(bootstrap: str, source: SourceConfig, partitions: list[tuple[str, int]]):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": kafka.group_id(source)})
    try:
        got = c.committed([TopicPartition(t, p) for t, p in partitions], timeout=10)
        return {(tp.topic, tp.partition): tp.offset for tp in got}
    finally:
        c.close()


def _generated(n: int, partitions: int) -> list[dict]:
    """Keys, JSON values, headers (one null-valued), every 17th record a tombstone."""
    return [
        {
            "partition": i % partitions,
            "key": f"k{i}".encode(),
            "value": None if i % 17 == 5 else json.dumps({"i": i, "pad": "x" * (i % 50)}).encode(),
            "headers": [("trace", f"t{i}".encode()), ("empty", None)] if i % 3 else None,
            "timestamp": 1_767_225_600_000 + i,
        }
        for i in range(n)
    ]


# --- bounded runs, exactly once -------------------------------------------------------------


def test_bounded_runs_store_every_record_exactly_once(kafka_bootstrap, warehouse):
    topic = _topic(kafka_bootstrap, "gen", partitions=3)
    produced = _produce(kafka_bootstrap, topic, _generated(200, 3))
    source = _source(kafka_bootstrap, [topic])

    results = _run_until_empty(warehouse, source, max_records=45)

    assert [r.records for r in results] == [45, 45, 45, 45, 20]
    assert [r.bounded for r in results] == [True] * 4 + [False]
    raw = DeltaTable(lake.TableRef(lake.RAW, "k").uri(warehouse))
    assert raw.metadata().configuration == lake.TABLE_PROPERTIES  # checkpointed every 10
    rows = _raw(warehouse)
    expected = sorted(produced, key=lambda r: (r["partition"], r["offset"]))
    assert _coordinates(rows) == [(topic, r["partition"], r["offset"]) for r in expected]
    for row, rec in zip(rows, expected, strict=True):
        assert (row["key"], row["value"]) == (rec["key"], rec["value"])
        assert row["headers"] == [{"key": k, "value": v} for k, v in rec["headers"] or []]
        assert int(row["timestamp"].timestamp() * 1000) == rec["timestamp"]
        assert (row["file"], row["line"], str(row["ingest_date"])) == (None, None, DATE)

    # Each batch's commit metadata names the offsets it stored; together they tile each
    # partition from 0 with neither gap nor overlap.
    batches = lake.kafka_batches(lake.TableRef(lake.RAW, "k").uri(warehouse))
    assert [b["version"] for b in batches] == [r.version for r in reversed(results)]
    for p in range(3):
        ranges = [
            b["offsets"][topic][str(p)]
            for b in reversed(batches)
            if str(p) in b["offsets"].get(topic, {})
        ]
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        assert ranges[0][0] == 0
        assert ranges[-1][1] == 1 + max(r["offset"] for r in produced if r["partition"] == p)

    # Consumer-group offsets follow, for monitoring tools.
    ends = {
        (topic, p): max(r["offset"] for r in produced if r["partition"] == p) + 1 for p in range(3)
    }
    assert _group_offsets(kafka_bootstrap, source, list(ends)) == ends

    # Nothing new: no commit. New records: one batch with just those.
    version = lake.version(lake.TableRef(lake.RAW, "k").uri(warehouse))
    assert kafka.ingest_kafka(warehouse, source, date=DATE).version is None
    assert lake.version(lake.TableRef(lake.RAW, "k").uri(warehouse)) == version
    more = _produce(kafka_bootstrap, topic, _generated(7, 3))
    assert [r.records for r in _run_until_empty(warehouse, source)] == [7]
    assert len(set(_coordinates(_raw(warehouse)))) == len(_raw(warehouse)) == 207
    assert {(r["partition"], r["offset"]) for r in more} <= {
        (r["partition"], r["offset"]) for r in _raw(warehouse)
    }


def test_a_kept_reader_stores_every_record_exactly_once_beside_other_runs(
    kafka_bootstrap, warehouse
):
    # A continuous run keeps its consumer between micro-batches. What it fetched ahead is taken
    # by its next batch when raw's offsets are where the consumer stands, and dropped when they
    # are not (here: another run committed in between).
    topic = _topic(kafka_bootstrap, "kept", partitions=3)
    produced = _produce(kafka_bootstrap, topic, _generated(200, 3))
    source = _source(kafka_bootstrap, [topic])
    reader = kafka.KafkaReader(source)
    try:
        assert kafka.ingest_kafka(warehouse, source, 50, date=DATE, reader=reader).records == 50
        assert kafka.ingest_kafka(warehouse, source, 30, date=DATE).records == 30  # another run
        results = _run_until_empty(warehouse, source, reader=reader)
        assert [r.records for r in results] == [120]
        ends = {(topic, p): 1 + max(r["offset"] for r in produced if r["partition"] == p)
                for p in range(3)}  # fmt: skip
        assert reader.position == ends  # in step: the next batch reads on from here

        produced += _produce(kafka_bootstrap, topic, _generated(20, 3))
        assert [r.records for r in _run_until_empty(warehouse, source, reader=reader)] == [20]
        assert kafka.ingest_kafka(warehouse, source, date=DATE).records == 0  # another run
    finally:
        reader.close()

    rows = _raw(warehouse)
    assert _coordinates(rows) == sorted((topic, r["partition"], r["offset"]) for r in produced)


def test_resume_comes_from_the_table_not_the_consumer_group(kafka_bootstrap, warehouse):
    topic = _topic(kafka_bootstrap, "resume")
    _produce(kafka_bootstrap, topic, _generated(20, 1))
    source = _source(kafka_bootstrap, [topic])
    assert kafka.ingest_kafka(warehouse, source, date=DATE).records == 20
    # A monitoring tool (or a person) rewinds the group: ingestion does not care.
    c = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": kafka.group_id(source)})
    c.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    c.close()
    _produce(kafka_bootstrap, topic, _generated(5, 1))

    assert kafka.ingest_kafka(warehouse, source, date=DATE).records == 5
    assert _coordinates(_raw(warehouse)) == [(topic, 0, o) for o in range(25)]


@pytest.mark.parametrize("kept", [False, True], ids=["a consumer a run", "a kept reader"])
def test_max_bytes_bounds_a_run_and_an_oversized_record_still_passes(
    kafka_bootstrap, warehouse, kept
):
    # With a kept reader, each bound refuses records the consumer delivered: the next batch
    # assigns the partition at raw's offsets again.
    topic = _topic(kafka_bootstrap, "bytes")
    _produce(kafka_bootstrap, topic, [{"key": b"k", "value": b"v" * 999} for _ in range(10)])
    _produce(kafka_bootstrap, topic, [{"key": b"big", "value": b"b" * 10_000}])
    source = _source(kafka_bootstrap, [topic], max_bytes=3_500)
    reader = kafka.KafkaReader(source) if kept else None

    try:
        results = _run_until_empty(warehouse, source, reader=reader)
    finally:
        if reader is not None:
            reader.close()

    assert [r.records for r in results] == [3, 3, 3, 1, 1]
    assert [r.bytes for r in results] == [3000, 3000, 3000, 1000, 10_003]
    assert _coordinates(_raw(warehouse)) == [(topic, 0, o) for o in range(11)]


def test_a_topic_pattern_selects_the_topics_it_fully_matches(kafka_bootstrap, warehouse):
    prefix = f"db{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    names = [f"{prefix}.inventory.customers", f"{prefix}.inventory.orders", f"x{prefix}.other"]
    for f in admin.create_topics([NewTopic(n, 2, 1) for n in names]).values():
        f.result(timeout=10)
    for n in names:
        _produce(kafka_bootstrap, n, [{"partition": p, "value": b"{}"} for p in (0, 1, 1)])
    source = _source(kafka_bootstrap, topic_pattern=rf"{prefix}\.inventory\..*")

    assert kafka.ingest_kafka(warehouse, source, date=DATE).records == 6

    assert sorted(set(_coordinates(_raw(warehouse)))) == [
        (n, p, o) for n in names[:2] for p, o in ((0, 0), (1, 0), (1, 1))
    ]


# --- crashes around the Delta commit --------------------------------------------------------

_CRASHING_RUN = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from cdc_platform.catalog import KafkaConfig, SourceConfig, TableConfig
    from cdc_platform.ingest import kafka
    from cdc_platform import lake

    bootstrap, topic, warehouse, when = sys.argv[1:]
    commit = lake.append_kafka_batch

    def crashing(*args, **kwargs):
        if when == "before":
            os._exit(17)  # the process dies with the batch read but nothing committed
        commit(*args, **kwargs)
        os._exit(17)  # dies right after the Delta commit: no group commit, no close, no return

    lake.append_kafka_batch = crashing
    source = SourceConfig(
        name="k", transport="kafka",
        kafka=KafkaConfig(bootstrap_servers=bootstrap, topics=[topic], idle_timeout_seconds=5),
    )
    kafka.ingest_kafka(Path(warehouse), source, max_records=12, date="2026-03-01")
    """
)


def _crash(bootstrap: str, topic: str, warehouse: Path, when: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHING_RUN, bootstrap, topic, str(warehouse), when],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 17, proc.stderr


def test_a_crash_before_or_after_the_delta_commit_loses_and_duplicates_nothing(
    kafka_bootstrap, warehouse
):
    topic = _topic(kafka_bootstrap, "crash", partitions=2)
    produced = _produce(kafka_bootstrap, topic, _generated(30, 2))
    source = _source(kafka_bootstrap, [topic])
    uri = lake.TableRef(lake.RAW, "k").uri(warehouse)

    _crash(kafka_bootstrap, topic, warehouse, "after")
    assert len(_raw(warehouse)) == 12  # the batch is committed ...
    partitions = [(topic, 0), (topic, 1)]
    assert set(_group_offsets(kafka_bootstrap, source, partitions).values()) == {-1001}
    # ... though the group never heard of it (-1001: no committed offset).
    version = lake.version(uri)

    _crash(kafka_bootstrap, topic, warehouse, "before")
    assert lake.version(uri) == version  # nothing committed

    results = _run_until_empty(warehouse, source, max_records=12)

    assert [r.records for r in results] == [12, 6]
    rows = _raw(warehouse)
    assert _coordinates(rows) == sorted((topic, r["partition"], r["offset"]) for r in produced)


def test_a_run_that_lost_the_race_commits_nothing(kafka_bootstrap, warehouse):
    topic = _topic(kafka_bootstrap, "race")
    _produce(kafka_bootstrap, topic, _generated(10, 1))
    source = _source(kafka_bootstrap, [topic])
    uri = lake.TableRef(lake.RAW, "k").uri(warehouse)
    read_version, _ = lake.kafka_offsets(uri, RAW_SCHEMA, [(topic, 0)])
    assert kafka.ingest_kafka(warehouse, source, date=DATE).records == 10
    # A second run that read the offsets before the first committed, committing the same batch:
    racing = lake.read_arrow(uri)
    with pytest.raises(Exception, match="Concurrent transaction"):
        lake.append_kafka_batch(uri, racing, read_version, {(topic, 0): 10}, {"records": 10})
    assert len(_raw(warehouse)) == 10


class _Consumer:
    """Hands out prepared deliveries, one list per ``consume`` call: for broker answers Tansu
    never gives, and for timings a real broker does not let a test choose."""

    def __init__(self, *deliveries: list[Message]) -> None:
        self.deliveries = list(deliveries)
        self.paused: list[tuple[str, int]] = []
        self.empty_polls = 0

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        if self.deliveries:
            return self.deliveries.pop(0)
        self.empty_polls += 1
        assert self.empty_polls < 100, "asked again and again after the last delivery"
        return []

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused += [(tp.topic, tp.partition) for tp in partitions]


def _records(partition: int, offsets: range) -> list[Message]:
    return [
        Message(topic="t", partition=partition, offset=o, value=b"{}", timestamp=(1, 1))
        for o in offsets
    ]


def _eof(partition: int, offset: int) -> Message:
    eof = KafkaError(KafkaError._PARTITION_EOF)
    return Message(topic="t", partition=partition, offset=offset, error=eof)


def test_an_offset_gone_from_the_broker_stops_the_run():
    # Tansu answers a fetch past the end with nothing; Kafka with OFFSET_OUT_OF_RANGE, which
    # auto.offset.reset=error turns into this message. Skipping ahead would lose records silently.
    gone = KafkaError(KafkaError._AUTO_OFFSET_RESET, "fetch position 5 is out of range")
    consumer = _Consumer([Message(topic="t", partition=0, offset=5, error=gone)])
    batch = kafka._Batch(max_records=10, max_bytes=1000)

    with pytest.raises(kafka.KafkaIngestError, match=r"t\[0\]: the next offset to ingest is no"):
        kafka._consume(consumer, {("t", 0)}, batch, idle=1, ends={})
    assert len(batch) == 0


def test_a_kept_consumers_stale_end_of_partition_event_does_not_end_the_batch():
    # A kept consumer queued the event when it caught up (offset 5), before the records that
    # came after it. The batch reads on to the start-time end (10) and its event there.
    consumer = _Consumer([_eof(0, 5), *_records(0, range(5, 8))], [], [*_records(0, range(8, 10))],
                         [_eof(0, 10)], _records(0, range(10, 12)))  # fmt: skip
    batch = kafka._Batch(max_records=100, max_bytes=10_000)

    more_waiting, in_step = kafka._consume(
        consumer, {("t", 0)}, batch, idle=60, ends={("t", 0): 10}
    )

    assert (len(batch), batch.next, more_waiting, in_step) == (5, {("t", 0): 10}, False, True)
    assert len(consumer.deliveries) == 1  # not asked for once the partition was done


def test_an_end_of_partition_below_the_watermark_with_nothing_after_it_ends_the_partition():
    # An open transaction: its records count in the watermark (8) but cannot be read, so the
    # end-of-partition event stands at 5. An empty poll after it ends the partition, instead of
    # waiting the idle timeout for records that do not come.
    consumer = _Consumer([*_records(0, range(5)), _eof(0, 5)])
    batch = kafka._Batch(max_records=100, max_bytes=10_000)

    more_waiting, in_step = kafka._consume(consumer, {("t", 0)}, batch, idle=60, ends={("t", 0): 8})

    assert (len(batch), more_waiting, in_step, consumer.empty_polls) == (5, False, True, 1)


def test_a_partition_past_its_start_time_end_waits_for_its_end_of_partition_event():
    # The watermark (5) may point into the newest record batch (Tansu): the records after it
    # and then the end-of-partition event finish the partition, with nothing cut short.
    consumer = _Consumer(_records(0, range(5)), [], [*_records(0, range(5, 8)), _eof(0, 8)])
    batch = kafka._Batch(max_records=100, max_bytes=10_000)

    more_waiting, in_step = kafka._consume(consumer, {("t", 0)}, batch, idle=1, ends={("t", 0): 5})

    assert (len(batch), batch.next, more_waiting, in_step) == (8, {("t", 0): 8}, False, True)


def test_a_producer_that_keeps_writing_cuts_the_partition_short_at_its_start_time_end():
    # Past its end (5), the partition delivers again instead of ending: the producer is still
    # writing. The run takes that delivery, stops the partition (what comes for it later is
    # left to the next run) and says more may be waiting; the other reads on to its own end.
    consumer = _Consumer(
        [*_records(0, range(6)), *_records(1, range(2))],
        [*_records(0, range(6, 9)), *_records(1, range(2, 4))],
        [*_records(0, range(9, 12)), *_records(1, range(4, 6)), _eof(1, 6)],
        _records(0, range(12, 15)),
    )
    batch = kafka._Batch(max_records=100, max_bytes=10_000)

    more_waiting, in_step = kafka._consume(
        consumer, {("t", 0), ("t", 1)}, batch, idle=1, ends={("t", 0): 5, ("t", 1): 6}
    )

    assert more_waiting and not in_step  # the paused partition: the next batch assigns anew
    assert (len(batch), batch.next) == (15, {("t", 0): 9, ("t", 1): 6})
    assert consumer.paused == [("t", 0)]
    assert len(consumer.deliveries) == 1  # not asked for once every partition was done


def test_a_run_under_a_producer_that_keeps_writing_ends_and_the_next_runs_take_the_rest(
    kafka_bootstrap, warehouse
):
    topic = _topic(kafka_bootstrap, "busy")
    _produce(kafka_bootstrap, topic, _generated(2_000, 1))
    source = _source(kafka_bootstrap, [topic])
    first: list[kafka.KafkaIngestResult] = []
    writing = threading.Event()
    live = []  # records the producer wrote

    def produce() -> None:  # 100 records every 5 ms, until the first run has returned
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
        deadline = time.monotonic() + 60
        while not first and time.monotonic() < deadline:
            for i in range(100):
                producer.produce(topic, key=f"live{i}".encode(), value=b"{}")
            live.extend(range(100))
            producer.poll(0)
            writing.set()
            time.sleep(0.005)
        assert producer.flush(15) == 0

    thread = threading.Thread(target=produce)
    thread.start()
    writing.wait(10)
    first.append(kafka.ingest_kafka(warehouse, source, date=DATE))
    thread.join()

    # Without the start-time end the run kept reading what the producer kept writing (on the
    # embedded broker, for seconds), here until the producer gave up after 60 s.
    assert first[0].records >= 2_000
    assert _run_until_empty(warehouse, source), "a later run took what came after the first"
    assert _coordinates(_raw(warehouse)) == [(topic, 0, o) for o in range(2_000 + len(live))]


# --- through normalize and merge ------------------------------------------------------------


@pytest.mark.spark
def test_corpus_and_seed_topics_through_normalize_and_merge(
    spark, kafka_bootstrap, warehouse, expected
):
    # One topic replays a Debezium corpus file (one message per line, no Kafka key: the key is
    # declared); the other the Db2 seed examples with their Kafka key and a tombstone.
    name = "debezium/debezium-postgres-data-schema-include.txt"
    entry = expected[name]
    products = table_name(entry["table"])
    lines = [line for line in (CORPUS / name).read_bytes().split(b"\n") if line.strip()]
    corpus_topic = _topic(kafka_bootstrap, "corpus")
    _produce(kafka_bootstrap, corpus_topic, [{"value": line} for line in lines])

    def seed(n: str) -> bytes:
        text = (FIXTURES / "seeds" / f"004_db2_{n}.completed.json").read_text()
        return json.dumps(json.loads(text)).encode()

    db2 = table_name("mydatabase.MYSCHEMA.CUSTOMERS")
    db2_topic = _topic(kafka_bootstrap, "db2")
    values = [seed(n) for n in ("create_value", "update_value", "delete_value")] + [None]
    _produce(kafka_bootstrap, db2_topic, [{"key": seed("key"), "value": v} for v in values])
    source = _source(kafka_bootstrap, [corpus_topic, db2_topic]).model_copy(
        update={
            "tables": [
                TableConfig(
                    name=products,
                    source_table=entry["table"],
                    primary_key=entry["primary_key"],
                    column_types=_column_types(entry),
                )
            ]
        }
    )

    assert [r.records for r in _run_until_empty(warehouse, source, max_records=8)] == [8, 8, 4]
    result = normalize_source(spark, warehouse, source, [DATE])
    merged = merge_current(spark, warehouse, "k", products)

    assert (result.messages, result.control, result.quarantined) == (20, 1, 0)  # the tombstone
    ops = result.tables[products].ops
    assert (ops.get("c", 0) + ops.get("r", 0), ops.get("u"), ops.get("d")) == (
        entry["counts"]["insert"], entry["counts"]["update"], entry["counts"]["delete"]
    )  # fmt: skip
    rows = current_rows(spark, warehouse, "k", products)
    current = rows.orderBy(*entry["primary_key"]).toArrow().to_pylist()
    assert _comparable(current, entry) == _comparable(entry["final_state"], entry)
    assert merged.rows == len(entry["final_state"])

    assert result.tables[db2].key == ["ID"]  # from the Kafka key's bytes
    assert result.tables[db2].ops == {"c": 1, "u": 1, "d": 1}
    changes = lake.read_arrow(lake.TableRef(lake.CHANGELOG, "k", db2).uri(warehouse))
    coordinates = changes.select(["topic", "offset"]).to_pylist()
    assert sorted(coordinates, key=lambda c: c["offset"]) == [
        {"topic": db2_topic, "offset": o} for o in range(3)
    ]


# --- configuration: secrets only from the environment ----------------------------------------


def _catalog(tmp_path: Path, kafka_block: str):
    from cdc_platform.catalog import load_catalog

    p = tmp_path / "sources.yaml"
    p.write_text(
        "sources:\n  - name: k\n    transport: kafka\n    kafka:\n"
        + textwrap.indent(textwrap.dedent(kafka_block), " " * 6)
    )
    return load_catalog(p)


def test_secrets_come_from_the_environment(tmp_path, monkeypatch):
    catalog = _catalog(
        tmp_path,
        """
        bootstrap_servers: [b1:9093, b2:9093]
        topics: dbserver1.inventory.customers
        consumer: {fetch.max.bytes: 1048576, check.crcs: true}
        security:
          security.protocol: SASL_SSL
          sasl.mechanism: SCRAM-SHA-512
          sasl.username: cdc
          sasl.password: ${KAFKA_TEST_PASSWORD}
          ssl.ca.location: /etc/ssl/ca.pem
        """,
    )
    cfg = catalog.source("k").kafka
    assert "hunter2" not in repr(catalog)
    monkeypatch.setenv("KAFKA_TEST_PASSWORD", "hunter2")

    settings = cfg.client_settings()

    assert settings == {
        "bootstrap.servers": "b1:9093,b2:9093",
        "fetch.max.bytes": "1048576",
        "check.crcs": "true",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "cdc",
        "sasl.password": "hunter2",
        "ssl.ca.location": "/etc/ssl/ca.pem",
    }
    monkeypatch.delenv("KAFKA_TEST_PASSWORD")
    with pytest.raises(Exception, match="environment variable KAFKA_TEST_PASSWORD is not set"):
        cfg.client_settings()


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("bootstrap_servers: b:9092\ntopics: [t]\nsecurity: {sasl.password: hunter2}",
         "sources.0.kafka.security: sasl.password is a secret: write an environment reference "
         "like ${KAFKA_SASL_PASSWORD}, never the secret itself"),
        ("bootstrap_servers: b:9092\ntopics: [t]\nsecurity: {ssl.key.password: '${A}x'}",
         "ssl.key.password is a secret"),
        ("bootstrap_servers: b:9092\ntopics: [t]\nconsumer: {group.id: g}",
         "sources.0.kafka.consumer: group.id is set by the platform"),
        ("bootstrap_servers: b:9092\ntopics: [t]\nconsumer: {sasl.username: u}",
         "sasl.username belongs under security"),
        ("bootstrap_servers: b:9092", "sources.0.kafka: set topics or topic_pattern"),
        ("bootstrap_servers: b:9092\ntopic_pattern: '('", "not a regular expression"),
    ],
)  # fmt: skip
def test_bad_kafka_settings_fail_with_one_line(tmp_path, block, message):
    from cdc_platform.catalog import CatalogError

    with pytest.raises(CatalogError) as err:
        _catalog(tmp_path, block)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sources: [{name: k, transport: kafka}]", "transport: kafka needs a kafka block"),
        ("sources: [{name: k, kafka: {bootstrap_servers: b, topics: [t]}}]",
         "a kafka block needs transport: kafka"),
    ],
)  # fmt: skip
def test_transport_and_kafka_block_go_together(tmp_path, text, message):
    from cdc_platform.catalog import CatalogError, load_catalog

    p = tmp_path / "sources.yaml"
    p.write_text(text)
    with pytest.raises(CatalogError, match=message):
        load_catalog(p)


def test_the_environment_is_not_read_when_the_file_loads(tmp_path, monkeypatch):
    monkeypatch.delenv("KAFKA_ABSENT", raising=False)
    catalog = _catalog(
        tmp_path, "bootstrap_servers: ${KAFKA_ABSENT}\ntopics: [t]\n"
    )  # loads: secrets are needed only when a client is made
    with pytest.raises(Exception, match="KAFKA_ABSENT is not set"):
        kafka.ingest_kafka(tmp_path, catalog.source("k"))
    assert os.environ.get("KAFKA_ABSENT") is None
