"""Kafka ingestion against the broker's own speed: `ingest_kafka` beside a plain consumer.

Starts the embedded broker (Tansu, `cdc_platform.broker`) on a loopback port, produces RECORDS
records of VALUE_BYTES bytes to one topic (PARTITIONS partitions), then, on the same topic, in
this order and ROUNDS times each:

- `plain consumer`: confluent-kafka reading every record to each partition's end and touching
  its value, nothing else (with ingest_kafka's fetch wait): what the broker and librdkafka give
  one Python process;
- `ingest_kafka`: the platform's raw ingestion into a fresh warehouse (one batch, one Delta
  commit with the offsets), including the consumer's setup and the commit.

It prints records/s and MB/s (medians) and their ratio, and the peak resident memory of the
process (ru_maxrss). Numbers only: it asserts nothing.

    .venv/bin/python bench/kafka_ingest.py [--records 200000] [--value-bytes 1024]
        [--partitions 1] [--rounds 3]
"""

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

TOPIC = "bench.ingest"


def produce(bootstrap: str, records: int, value_bytes: int, partitions: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50,
                         "batch.size": 1_000_000, "compression.type": "none"})  # fmt: skip
    value = os.urandom(value_bytes // 2).hex().encode()[:value_bytes]
    for i in range(records):
        while True:
            try:
                producer.produce(TOPIC, key=str(i).encode(), value=value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(120):
        sys.exit("kafka_ingest: error: not every record reached the broker")


def plain_consumer(bootstrap: str, partitions: int) -> int:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    # The fetch wait ingest_kafka sets too (the broker answers a fetch at once).
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-plain",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "fetch.wait.max.ms": 50})  # fmt: skip
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(partitions)])
    pending, n, size = set(range(partitions)), 0, 0
    try:
        while pending:
            for msg in consumer.consume(num_messages=10_000, timeout=0.05):
                err = msg.error()
                if err is None:
                    n += 1
                    size += len(msg.value())
                elif err.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001
                    pending.discard(msg.partition())
    finally:
        consumer.close()
    return n


def ingest(bootstrap: str, work: Path, records: int) -> int:
    from cdc_platform.catalog import SourceConfig
    from cdc_platform.ingest.kafka import ingest_kafka

    source = SourceConfig(name="bench", transport="kafka", format="debezium",
                          kafka={"bootstrap_servers": bootstrap, "topics": [TOPIC],
                                 "max_records": records, "max_bytes": 2**40})  # fmt: skip
    warehouse = work / "warehouse"
    shutil.rmtree(warehouse, ignore_errors=True)
    return ingest_kafka(warehouse, source).records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from cdc_platform import broker

    work = Path(tempfile.mkdtemp(prefix="cdc-kafka-bench-"))
    try:
        proc, bootstrap = broker.start(work / "broker.log", scratch=work)
    except broker.BrokerError as e:
        sys.exit(f"kafka_ingest: error: {e}")
    try:
        start = time.perf_counter()
        produce(bootstrap, args.records, args.value_bytes, args.partitions)
        print(f"produced {args.records:,} records of {args.value_bytes} B in "
              f"{time.perf_counter() - start:.1f} s", flush=True)  # fmt: skip
        seconds: dict[str, list[float]] = {"plain consumer": [], "ingest_kafka": []}
        for _ in range(args.rounds):
            for name, run in (
                ("plain consumer", lambda: plain_consumer(bootstrap, args.partitions)),
                ("ingest_kafka", lambda: ingest(bootstrap, work, args.records)),
            ):
                t = time.perf_counter()
                got = run()
                seconds[name].append(time.perf_counter() - t)
                if got != args.records:
                    sys.exit(f"kafka_ingest: error: {name} read {got} of {args.records} records")
        mb = args.records * args.value_bytes / 1e6
        print(f"\n{'':<16} {'median s':>9} {'records/s':>11} {'MB/s':>7}")
        for name, values in seconds.items():
            med = statistics.median(values)
            print(f"{name:<16} {med:>9.2f} {args.records / med:>11,.0f} {mb / med:>7.1f}")
        ratio = statistics.median(seconds["ingest_kafka"]) / statistics.median(
            seconds["plain consumer"]
        )
        print(f"ingest_kafka / plain consumer: {ratio:.2f}x")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak RSS of this process: {peak:,.0f} MiB")
    finally:
        broker.stop(proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
