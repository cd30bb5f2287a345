"""A Kafka source's raw asset and sensor.

Raw of a Kafka source only grows: each run appends one bounded batch (see
``cdc_platform.ingest.kafka``) to the partition of the date it runs for. Kafka is read forward
from the offsets stored in the table, so a past date's raw is never read again: materializing a
past partition reads nothing and says so (reprocess a past date through its change log).
"""

import datetime as dt
import json

import dagster as dg

from cdc_platform.catalog import SourceConfig
from cdc_platform.defs.metadata import delta_metadata
from cdc_platform.defs.partitions import daily
from cdc_platform.defs.resources import LakeResource
from cdc_platform.ingest import kafka
from cdc_platform.lake import delta

# Run tag of sensor runs: the change log appends only the new raw batches (no date reprocess).
INCREMENTAL_TAG = "cdc/mode"
INCREMENTAL = "incremental"
_IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


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
        partitions_def=daily,
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
        uri = delta.table_uri(lake.warehouse_path, delta.RAW, source.name)
        date = ingests(context.partition_keys)
        if date is None:
            context.log.info(
                "raw of a Kafka source is append-only: past dates are not read from Kafka again "
                "(the change log reprocesses them from raw)"
            )
            return dg.MaterializeResult(
                metadata={"ingested_records": 0, "ingested": "no (a past date)"}
                | delta_metadata(uri)
            )
        batch = kafka.ingest_kafka(lake.warehouse_path, source, date=date)
        if batch.bounded:
            context.log.info("the batch reached its bound; the sensor requests the next one")
        return dg.MaterializeResult(
            metadata={
                "dagster/partition_row_count": batch.records,
                "ingested_records": batch.records,
                "ingested_bytes": batch.bytes,
                "offsets": dg.MetadataValue.json(batch.offsets),
                "more_waiting": batch.bounded,
                **delta_metadata(uri),
            }
        )

    return raw


def build_kafka_sensor(source: SourceConfig, warehouse_path, job_name: str) -> dg.SensorDefinition:
    @dg.sensor(
        name=f"{source.name}__kafka_sensor",
        job_name=job_name,
        minimum_interval_seconds=source.sensor_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"Requests a run of {job_name} (raw -> change log -> current) when the topics of "
            f"`{source.name}` hold records raw does not have; one run at a time. The cursor "
            "holds the high watermarks seen."
        ),
    )
    def kafka_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        waiting = kafka.pending(warehouse_path, source)
        cursor = json.dumps(
            {f"{t}[{p}]": high for t, parts in waiting.items() for p, (_, high) in parts.items()},
            sort_keys=True,
        )
        if not waiting:
            return dg.SensorResult(skip_reason="raw has every record of the topics", cursor=cursor)
        running = context.instance.get_runs(
            filters=dg.RunsFilter(job_name=job_name, statuses=_IN_FLIGHT), limit=1
        )
        if running:
            # Its batch ends where it ends; what is left is requested on a later tick.
            return dg.SensorResult(
                skip_reason=f"run {running[0].run_id[:8]} is still ingesting", cursor=cursor
            )
        backlog = sum(h - s for parts in waiting.values() for s, h in parts.values())
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    partition_key=today(),
                    tags={INCREMENTAL_TAG: INCREMENTAL, "cdc/backlog": str(backlog)},
                )
            ],
            cursor=cursor,
        )

    return kafka_sensor
