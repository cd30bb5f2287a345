"""A Kafka source's raw asset and sensor.

Raw of a Kafka source only grows: each run appends one bounded batch (see
``cdc_platform.ingest.kafka``) to the partition of the date it runs for. Kafka is read forward
from the offsets stored in the table, so a past date's raw is never read again: materializing a
past partition reads nothing and says so (reprocess a past date through its change log).
"""

import datetime as dt

import dagster as dg

from cdc_platform.catalog import SourceConfig
from cdc_platform.defs import outputs
from cdc_platform.defs.metadata import add_partition_row_counts, delta_metadata, profiled
from cdc_platform.defs.partitions import daily_partitions, today
from cdc_platform.defs.resources import LakeResource
from cdc_platform.defs.runs import (
    INCREMENTAL,
    INCREMENTAL_TAG,
    Tick,
    finish_or_skip,
    run_in_flight,
)
from cdc_platform.defs.transient import retried_if_transient
from cdc_platform.ingest import kafka
from cdc_platform.lake import RAW, TableRef, version


def ingests(partition_keys: list[str]) -> str | None:
    """The date a run ingests into: its newest partition when that is today or yesterday (a run
    requested just before midnight UTC), else None."""
    newest = max(partition_keys)
    yesterday = (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
    return newest if newest >= yesterday else None


def build_kafka_raw_asset(source: SourceConfig, key: dg.AssetKey) -> dg.AssetsDefinition:
    assert source.kafka is not None
    topics = ", ".join(source.kafka.topics or [f"/{source.kafka.topic_pattern}/"])

    @dg.asset(
        key=key,
        group_name=source.name,
        partitions_def=daily_partitions(source),
        backfill_policy=dg.BackfillPolicy.single_run(),
        kinds={"kafka", "delta"},
        description=(
            f"Raw topic of source `{source.name}` ({source.format}): every record of {topics} "
            f"on {source.kafka.bootstrap_servers} exactly as received (topic, partition, offset, "
            "timestamp, key and value bytes, headers), partitioned by ingest date. Append-only "
            "and exactly once: the next offsets are stored in the same Delta commit as the "
            "records. A run takes one bounded batch."
        ),
    )
    def raw(context: dg.AssetExecutionContext, lake: LakeResource) -> dg.MaterializeResult:
        with profiled(context), retried_if_transient(context):
            uri = TableRef(RAW, source.name).uri(lake.warehouse_uri)
            date = ingests(context.partition_keys)
            if date is None:
                context.log.info(
                    "raw of a Kafka source is append-only: past dates are not read from Kafka "
                    "again (the change log reprocesses them from raw)"
                )
                add_partition_row_counts(context, uri)
                return dg.MaterializeResult(
                    metadata={"ingested_records": 0, "ingested": "no (a past date)"}
                    | delta_metadata(uri)
                )
            batch = kafka.ingest_kafka(lake.warehouse_uri, source, date=date)
            if batch.bounded:
                context.log.info(
                    "more records may be waiting (the batch reached a bound, or a partition's "
                    "end as of the run's start); the sensor requests the next run"
                )
            return outputs.kafka_raw(lake.warehouse_uri, source, batch).result(context)

    return raw


def waiting_text(waiting: dict[str, dict[int, list[int]]]) -> str:
    """``waiting`` (``kafka.pending``: topic -> partition -> [next offset stored in raw, high
    watermark]) as the text of its run key."""
    return ",".join(
        f"{topic}[{p}]:{start}-{high}"
        for topic, parts in sorted(waiting.items())
        for p, (start, high) in sorted(parts.items())
    )


def build_kafka_sensor(source: SourceConfig, job_name: str) -> dg.SensorDefinition:
    @dg.sensor(
        name=f"{source.name}__kafka_sensor",
        job_name=job_name,
        minimum_interval_seconds=source.sensor_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"Requests a run of {job_name} (raw -> change log -> current) when the topics of "
            f"`{source.name}` hold records raw does not have; one run at a time. Its run key "
            "names the offsets to ingest (per topic-partition: the next offset stored in raw, "
            "the high watermark) and raw's Delta version, so one state is requested once. The "
            "cursor holds the last run key requested, raw's version, and a generation counting "
            "the times raw was recreated (offsets start over then). A tick that finds the last "
            "request's offsets unmoved skips: its run is queued, running, or failed (re-execute "
            "it, or new records bring a new request). With no record waiting, it requests a run "
            "once when an output lacks part of its input (a run died after its raw commit)."
        ),
    )
    def kafka_sensor(context: dg.SensorEvaluationContext, lake: LakeResource) -> dg.SensorResult:
        raw = TableRef(RAW, source.name).uri(lake.warehouse_uri)
        tick = Tick.start(context.cursor, version(raw))  # recreated: offsets start over
        waiting = kafka.pending(lake.warehouse_uri, source)
        backlog = sum(h - s for parts in waiting.values() for s, h in parts.values())

        def make(key: str) -> dg.RunRequest:
            return dg.RunRequest(
                run_key=key,
                partition_key=today().isoformat(),
                tags={INCREMENTAL_TAG: INCREMENTAL, "cdc/backlog": str(backlog)},
            )

        if not waiting:
            return finish_or_skip(
                context, tick, job_name, lake.warehouse_uri, source, make,
                "raw has every record of the topics",
            )  # fmt: skip
        if running := run_in_flight(context.instance, job_name):
            # Its batch ends where it ends; what is left is requested on a later tick.
            return tick.skip(f"run {running.run_id[:8]} is still ingesting")
        return tick.request(waiting_text(waiting), "offsets", make)

    return kafka_sensor
