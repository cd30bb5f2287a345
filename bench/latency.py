"""End-to-end latency with `dagster dev`: events appended to a Kafka topic -> visible in the
current table.

Starts the embedded broker and `dagster dev` (webserver + daemon, the default run launcher: one
process per run) on a catalog with one Debezium Kafka source, then, ROUNDS times: produces
EVENTS Debezium change events (inserts of new keys, each row stamped with its round) and waits
until all of them are in the current table, read with delta-rs. The clock starts when the
producer has flushed. Prints each round, the median, and where the time of each Dagster run went.

    .venv/bin/python bench/latency.py [--events 10000] [--rounds 5] [--sensor-interval 5]
                                      [--spark-connect] [--keep]
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pyarrow.compute as pc
import yaml
from confluent_kafka import Producer
from deltalake import DeltaTable

from cdc_platform import broker

ROOT = Path(__file__).resolve().parents[1]
TOPIC = "bench.inventory.customers"


def catalog(tmp: Path, bootstrap: str, interval: int, remote: str | None = None) -> Path:
    path = tmp / "sources.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "warehouse": str(tmp / "warehouse"),
                "landing": str(tmp / "landing"),
                "spark": {"master": "local[2]", **({"remote": remote} if remote else {})},
                "sources": [
                    {
                        "name": "bench",
                        "transport": "kafka",
                        "format": "debezium",
                        "sensor_interval_seconds": interval,
                        "kafka": {"bootstrap_servers": bootstrap, "topics": [TOPIC]},
                        "tables": [
                            {
                                "name": "customers",
                                "source_table": "inventory.customers",
                                "primary_key": ["id"],
                                "column_types": {"id": "bigint", "round": "int"},
                            }
                        ],
                    }
                ],
            }
        )
    )
    return path


def produce(bootstrap: str, round_no: int, events: int, pos: int) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    now = int(time.time() * 1000)
    for i in range(events):
        key = round_no * events + i
        pos += 1
        value = {
            "before": None,
            "after": {"id": key, "name": f"customer {key}", "round": round_no},
            "source": {"connector": "mysql", "db": "inventory", "table": "customers",
                       "file": "mysql-bin.000001", "pos": pos, "row": 0, "ts_ms": now},
            "op": "c",
            "ts_ms": now,
        }  # fmt: skip
        producer.produce(TOPIC, key=json.dumps({"id": key}).encode(), value=json.dumps(value))
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    return pos


def visible(current: Path, round_no: int) -> int:
    if not (current / "_delta_log").exists():
        return 0
    table = DeltaTable(str(current)).to_pyarrow_table(columns=["round", "__deleted"])
    return pc.sum(pc.equal(table["round"], round_no)).as_py() or 0


def wait_for_webserver(url: str, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("dagster dev exited; see its log")
        try:
            urllib.request.urlopen(f"{url}/server_info", timeout=2)
            return
        except OSError:
            time.sleep(1)
    raise SystemExit("dagster dev did not come up")


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("the Spark Connect server exited; see spark-server.log")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(1)
    raise SystemExit("the Spark Connect server did not come up")


def run_breakdown(home: Path) -> list[dict]:
    """Per finished run: seconds from creation to start (launch), and start to end."""
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    with DagsterInstance.from_config(str(home)) as instance:
        records = instance.get_run_records(
            filters=RunsFilter(statuses=[DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE])
        )
        return [
            {
                "run": r.dagster_run.run_id[:8],
                "status": r.dagster_run.status.value,
                "launch_s": round(r.start_time - r.create_timestamp.timestamp(), 1),
                "run_s": round(r.end_time - r.start_time, 1),
            }
            for r in sorted(records, key=lambda r: r.create_timestamp)
            if r.start_time and r.end_time
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sensor-interval", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300, help="per round, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, tables)")
    parser.add_argument(
        "--spark-connect",
        action="store_true",
        help="runs use a local Spark Connect server (cdc-platform spark-server) instead of "
        "starting Spark themselves",
    )
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="cdc-latency-"))
    home = tmp / "dagster_home"
    home.mkdir()
    proc_broker, bootstrap = broker.start(tmp / "broker.log")
    create_topics_for(bootstrap)
    sources = catalog(tmp, bootstrap, args.sensor_interval)
    server = None
    if args.spark_connect:
        spark_port = broker.free_port()
        server = subprocess.Popen(
            [str(Path(sys.executable).parent / "cdc-platform"), "spark-server",
             "--sources", str(sources), "--port", str(spark_port)],
            stdout=(tmp / "spark-server.log").open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        wait_for_port(spark_port, server)
        sources = catalog(tmp, bootstrap, args.sensor_interval, f"sc://127.0.0.1:{spark_port}")
    port = broker.free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "CDC_SOURCES": str(sources)}
    dev_log = (tmp / "dagster.log").open("wb")
    dev = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster"), "dev", "-w", "workspace.yaml",
         "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT, env=env, stdout=dev_log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    latencies = []
    try:
        wait_for_webserver(f"http://127.0.0.1:{port}", dev)
        current = tmp / "warehouse" / "current" / "bench" / "customers"
        pos = 4
        for round_no in range(1, args.rounds + 1):
            pos = produce(bootstrap, round_no, args.events, pos)
            start = time.monotonic()
            while (seen := visible(current, round_no)) < args.events:
                if time.monotonic() - start > args.timeout:
                    raise SystemExit(f"round {round_no}: {seen} of {args.events} after timeout")
                time.sleep(0.5)
            latencies.append(time.monotonic() - start)
            print(f"round {round_no}: {args.events} events visible after {latencies[-1]:.1f} s",
                  flush=True)  # fmt: skip
        print(f"median of {args.rounds}: {statistics.median(latencies):.1f} s "
              f"(min {min(latencies):.1f}, max {max(latencies):.1f})")  # fmt: skip
        for run in run_breakdown(home):
            print(f"run {run['run']} {run['status']}: launched after {run['launch_s']} s, "
                  f"ran {run['run_s']} s")  # fmt: skip
    finally:
        os.killpg(dev.pid, 15)
        dev.wait(timeout=60)
        broker.stop(proc_broker)
        if server is not None:
            os.killpg(server.pid, 15)
            server.wait(timeout=60)
        if args.keep:
            print(f"work folder: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def create_topics_for(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the result is in
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(timeout=30)


if __name__ == "__main__":
    main()
