"""A Kafka source run the way Dagster runs it, against the real broker: the sensor requests runs
while the topic holds records raw lacks (one request per state, keyed by its offsets), the ingest
job carries them to the current table, runs are bounded, reprocessing a date duplicates nothing,
a crash between the normalize outputs loses and duplicates nothing, and freshness follows the
source's heartbeats."""

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import pyarrow.compute as pc
import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition

from cdc_platform import freshness, lake
from cdc_platform.catalog import load_catalog
from cdc_platform.defs.cdc_tables import build_source_defs
from cdc_platform.defs.kafka import waiting_text
from cdc_platform.defs.partitions import today
from cdc_platform.defs.resources import build_resources
from cdc_platform.defs.runs import INCREMENTAL, INCREMENTAL_TAG, run_key
from cdc_platform.ingest import kafka
from cdc_platform.normalize import table_name
from cdc_platform.steps.changelog import normalize_new
from cdc_platform.steps.current import current_rows, merge_current
from tests.conftest import CORPUS
from tests.kafka.test_kafka_ingest import _produce, _topic
from tests.normalized import mark_normalized
from tests.spark.test_corpus_debezium import _column_types, _comparable

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]
CORPUS_FILE = "debezium/debezium-postgres-data-schema-include.txt"


def _catalog(tmp_path: Path, bootstrap: str, topic: str, entry: dict, **kafka_settings):
    table = table_name(entry["table"])
    path = tmp_path / "sources.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "warehouse": str(tmp_path / "warehouse"),
                "landing": str(tmp_path / "landing"),
                "sources": [
                    {
                        "name": "k",
                        "transport": "kafka",
                        "format": "debezium",
                        "max_lag_minutes": 5,
                        "kafka": {
                            "bootstrap_servers": bootstrap,
                            "topics": [topic],
                            "idle_timeout_seconds": 5,
                            **kafka_settings,
                        },
                        "tables": [
                            {
                                "name": table,
                                "source_table": entry["table"],
                                "primary_key": entry["primary_key"],
                                "column_types": _column_types(entry),
                            }
                        ],
                    }
                ],
            }
        )
    )
    return load_catalog(path), table


class _Location:
    """One source's definitions on a test instance: tick the sensor, run what it asks for."""

    def __init__(self, catalog, instance: dg.DagsterInstance) -> None:
        self.catalog, self.instance = catalog, instance
        self.resources = build_resources(catalog)
        self.defs = dg.Definitions.merge(
            build_source_defs(catalog.source("k"), catalog),
            dg.Definitions(resources=self.resources, executor=dg.in_process_executor),
        )
        self.sensor = self.defs.resolve_sensor_def("k__kafka_sensor")
        self.job = self.defs.resolve_job_def("k__ingest")
        self.cursor: str | None = None

    def evaluate(self, cursor: str | None) -> dg.SensorResult:
        # The sensor reads the warehouse from the lake resource, as in the code location.
        with dg.build_sensor_context(
            instance=self.instance, cursor=cursor, resources=self.resources
        ) as context:
            return self.sensor(context)

    def tick(self) -> list[dg.RunRequest]:
        result = self.evaluate(self.cursor)
        self.cursor = result.cursor
        return list(result.run_requests or [])

    def run(self, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
        result = self.job.execute_in_process(
            partition_key=request.partition_key, tags=request.tags, instance=self.instance
        )
        assert result.success
        return result

    def metadata(self, result: dg.ExecuteInProcessResult, key: str) -> dict:
        (m,) = [
            e.materialization
            for e in result.get_asset_materialization_events()
            if e.materialization.asset_key.to_user_string() == key
        ]
        assert m.partition == today().isoformat()
        return {k: getattr(v, "value", v) for k, v in m.metadata.items()}

    def drain(self) -> int:
        """Tick and run until the sensor asks for nothing; the number of runs."""
        runs = 0
        while requests := self.tick():
            assert len(requests) == 1
            self.run(requests[0])
            runs += 1
            assert runs < 20
        return runs


def _current(spark, warehouse: Path, table: str, entry: dict) -> list[dict]:
    rows = current_rows(spark, warehouse, "k", table)
    return _comparable(rows.orderBy(*entry["primary_key"]).toArrow().to_pylist(), entry)


def _changelog_coordinates(warehouse: Path, table: str) -> list[tuple]:
    changes = lake.read_arrow(lake.TableRef(lake.CHANGELOG, "k", table).uri(warehouse))
    return sorted(zip(changes["partition"].to_pylist(), changes["offset"].to_pylist(), strict=True))


def _lines() -> list[bytes]:
    return [line for line in (CORPUS / CORPUS_FILE).read_bytes().split(b"\n") if line.strip()]


def _high_watermark(bootstrap: str, topic: str) -> int:
    """The broker's high watermark of partition 0 (Tansu's points into the newest batch)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        consumer.close()


def test_the_sensor_drives_bounded_runs_from_topic_to_current(
    spark, kafka_bootstrap, tmp_path, expected
):
    entry = expected[CORPUS_FILE]
    topic = _topic(kafka_bootstrap, "dagster")
    catalog, table = _catalog(tmp_path, kafka_bootstrap, topic, entry, max_records=6)
    warehouse = catalog.warehouse_uri
    lines = _lines()
    head, tail = lines[:10], lines[10:]
    _produce(kafka_bootstrap, topic, [{"value": v} for v in head])

    with dg.instance_for_test() as instance:
        location = _Location(catalog, instance)
        first = location.tick()
        # The run key names the offsets to ingest (from the first, up to the high watermark),
        # raw's version (none yet) and the cursor's generation; the cursor remembers the key.
        high = _high_watermark(kafka_bootstrap, topic)
        key = f"{topic}[0]:0-{high}|raw=none|gen=0"
        assert [(r.partition_key, r.tags[INCREMENTAL_TAG], r.run_key) for r in first] == [
            (today().isoformat(), INCREMENTAL, key)
        ]
        assert json.loads(location.cursor) == {"run_key": key, "raw_version": None, "generation": 0}
        # The same state again: no second request; without the cursor, the same run key (which
        # Dagster would not run twice).
        again = location.evaluate(location.cursor)
        assert again.run_requests == [] and again.cursor == location.cursor
        assert "already requested" in again.skip_reason.skip_message
        assert [r.run_key for r in location.evaluate(None).run_requests] == [key]

        location.run(first[0])
        # 6 of 10 records per run: the sensor asks again, from offset 6, until raw has them all
        # (a batch cut short by its bound is asked for again even below the watermark).
        version = lake.version(lake.TableRef(lake.RAW, "k").uri(warehouse))
        (second,) = location.tick()
        assert second.run_key == f"{topic}[0]:6-{max(high, 6)}|raw={version}|gen=0"
        result = location.run(second)
        assert location.tick() == []
        # An incremental run reports the partition's rows, not its batch's.
        raw_meta = location.metadata(result, "raw/k")
        assert (raw_meta["ingested_records"], raw_meta["dagster/partition_row_count"]) == (4, 10)
        changes = lake.read_arrow(lake.TableRef(lake.CHANGELOG, "k", table).uri(warehouse))
        changelog_meta = location.metadata(result, f"changelog/k/{table}")
        assert sum(changelog_meta["rows_by_op"].values()) < changes.num_rows
        assert changelog_meta["dagster/partition_row_count"] == changes.num_rows

        _produce(kafka_bootstrap, topic, [{"value": v} for v in tail])
        runs = location.drain()
        # A batch that ends at its bound exactly at the end costs one more (empty) run.
        assert runs == len(tail) // 6 + 1

        assert _current(spark, warehouse, table, entry) == _comparable(entry["final_state"], entry)
        # Every record once in raw and once (at most) in the change log.
        raw = lake.read_arrow(lake.TableRef(lake.RAW, "k").uri(warehouse))
        assert sorted(raw["offset"].to_pylist()) == list(range(len(lines)))
        coordinates = _changelog_coordinates(warehouse, table)
        assert len(coordinates) == len(set(coordinates))

        # A date reprocessed from raw (a backfill, no incremental tag) changes nothing.
        result = location.job.execute_in_process(
            partition_key=today().isoformat(), instance=instance
        )
        assert result.success
        assert _changelog_coordinates(warehouse, table) == coordinates
        assert _current(spark, warehouse, table, entry) == _comparable(entry["final_state"], entry)
        materialized = result.asset_materializations_for_node("k__changelog")
        changelog = next(m for m in materialized if m.asset_key.path[0] == "changelog")
        assert {
            "rows_by_op",
            "quarantined",
            "delta_version",
            "dagster/column_schema",
            "preview",
            "lag_seconds",
            "max_event_time",
        } <= set(changelog.metadata)


def test_a_reset_or_a_recreated_raw_gets_a_new_run_key(kafka_bootstrap, tmp_path, expected):
    # No Spark: raw is written by ingest_kafka, the first step of the run the sensor requests.
    topic = _topic(kafka_bootstrap, "keys")
    catalog, _ = _catalog(tmp_path, kafka_bootstrap, topic, expected[CORPUS_FILE])
    warehouse, source = catalog.warehouse_uri, catalog.source("k")
    raw_uri = lake.TableRef(lake.RAW, "k").uri(warehouse)
    _produce(kafka_bootstrap, topic, [{"value": v} for v in _lines()])
    everything = {topic: {0: [0, _high_watermark(kafka_bootstrap, topic)]}}

    with dg.instance_for_test() as instance:
        location = _Location(catalog, instance)
        (first,) = location.tick()
        assert first.run_key == run_key(waiting_text(everything), None, 0)
        kafka.ingest_kafka(warehouse, source)
        # Raw ahead of its outputs (the run died before normalizing): one run to finish them.
        (finish,) = location.tick()
        assert finish.run_key.startswith("finish:raw@1>normalized@None")
        mark_normalized(warehouse, "k")  # what that run's normalize records
        assert location.tick() == []
        ingested = lake.version(raw_uri)
        assert json.loads(location.cursor) == {
            "run_key": finish.run_key, "raw_version": ingested, "generation": 0
        }  # fmt: skip

        # Offsets reset to the earliest: the offsets of the first request, at a new raw version.
        kafka.reset_offsets(warehouse, source, "earliest")
        (after_reset,) = location.tick()
        assert after_reset.run_key == run_key(waiting_text(everything), lake.version(raw_uri), 0)
        assert lake.version(raw_uri) > ingested

        # Raw deleted for a clean reingest: offsets and versions start over, the generation
        # does not, so the key is not the first request's again.
        shutil.rmtree(raw_uri)
        (recreated,) = location.tick()
        assert recreated.run_key == run_key(waiting_text(everything), None, 1) != first.run_key
        assert json.loads(location.cursor)["generation"] == 1


def test_freshness_follows_heartbeats(spark, kafka_bootstrap, tmp_path, expected):
    entry = expected[CORPUS_FILE]
    topic = _topic(kafka_bootstrap, "fresh")
    catalog, table = _catalog(tmp_path, kafka_bootstrap, topic, entry)
    _produce(kafka_bootstrap, topic, [{"value": v} for v in _lines()])

    with dg.instance_for_test() as instance:
        location = _Location(catalog, instance)
        location.drain()
        # The corpus changes are years old: without news from the source the table is stale.
        stale = freshness.current(catalog.warehouse_uri, "k", table)
        assert stale.lag_seconds > 365 * 86400
        evaluation = _freshness_evaluation(location)
        assert not evaluation.passed
        assert evaluation.severity == dg.AssetCheckSeverity.ERROR

        # A Debezium heartbeat says the source is at "now" and had nothing else to send.
        now_ms = int(time.time() * 1000)
        heartbeat = {"value": json.dumps({"ts_ms": now_ms}).encode(), "key": b'{"serverName":"x"}'}
        _produce(kafka_bootstrap, topic, [heartbeat])
        location.drain()
        fresh = freshness.current(catalog.warehouse_uri, "k", table)
        assert fresh.lag_seconds < 120
        assert _freshness_evaluation(location).passed
        control = lake.read_arrow(lake.TableRef(lake.CONTROL, "k").uri(catalog.warehouse_uri))
        assert pc.max(control["event_time"]).as_py().timestamp() * 1000 == pytest.approx(
            now_ms, abs=1
        )


def _freshness_evaluation(location: _Location):
    result = location.job.execute_in_process(
        partition_key=today().isoformat(),
        instance=location.instance,
        tags={INCREMENTAL_TAG: INCREMENTAL},
    )
    (evaluation,) = [e for e in result.get_asset_check_evaluations() if e.check_name == "freshness"]
    return evaluation


_CRASH = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from cdc_platform.catalog import load_catalog
    from cdc_platform import lake
    from cdc_platform.spark.session import get_spark
    from cdc_platform.steps.changelog import normalize_new

    catalog = load_catalog(sys.argv[1])
    real = lake.append_normalized

    def append_then_die(data, uri, raw_version, state=None, **options):
        if "/quarantine/" in uri:
            os._exit(17)  # the change log and control log are written, the quarantine is not
        return real(data, uri, raw_version, state, **options)

    lake.append_normalized = append_then_die
    spark = get_spark(remote=sys.argv[2])  # a Connect client, as a run is: no JVM of its own
    normalize_new(spark, catalog.warehouse_uri, catalog.source("k"))
    """
)


def test_a_crash_between_normalize_outputs_loses_and_duplicates_nothing(
    spark, spark_connect_url, kafka_bootstrap, tmp_path, expected
):
    entry = expected[CORPUS_FILE]
    topic = _topic(kafka_bootstrap, "crash")
    catalog, table = _catalog(tmp_path, kafka_bootstrap, topic, entry)
    warehouse, source = catalog.warehouse_uri, catalog.source("k")
    lines = _lines()
    _produce(kafka_bootstrap, topic, [{"value": v} for v in lines[:10]])
    kafka.ingest_kafka(warehouse, source)
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH, str(tmp_path / "sources.yaml"), spark_connect_url],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 17, proc.stderr[-2000:]
    written = _changelog_coordinates(warehouse, table)
    assert len(written) > 0
    assert not lake.exists(lake.TableRef(lake.QUARANTINE, "k").uri(warehouse))

    # More records arrive before the rerun; the rerun finishes the crashed batch, then the rest.
    _produce(kafka_bootstrap, topic, [{"value": v} for v in lines[10:]])
    kafka.ingest_kafka(warehouse, source)
    normalize_new(spark, warehouse, source)
    merge_current(spark, warehouse, "k", table)

    coordinates = _changelog_coordinates(warehouse, table)
    assert len(coordinates) == len(set(coordinates))
    assert set(written) <= set(coordinates)
    assert _current(spark, warehouse, table, entry) == _comparable(entry["final_state"], entry)
    assert normalize_new(spark, warehouse, source).messages == 0  # nothing left
