"""The landing sensor of a files source: one incremental run at a time for the files raw lacks."""

import hashlib

import dagster as dg

from cdc_platform import lake as delta
from cdc_platform.catalog import SourceConfig
from cdc_platform.defs.resources import LakeResource
from cdc_platform.defs.runs import INCREMENTAL, INCREMENTAL_TAG, SensorCursor, run_in_flight
from cdc_platform.steps import ingest

# Run tags of a run over several dates (what a backfill over a partition range sets).
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
# Longer run keys are hashed: Dagster stores the key as a run tag.
_MAX_KEY_LENGTH = 200


def run_key(pending: dict[str, list[str]], raw_version: int | None, generation: int) -> str:
    """The run key of a request for ``pending`` (date -> landing files raw lacks), read from raw
    at ``raw_version``, in the cursor's ``generation``: one state always gives the same key."""
    files = ";".join(f"{d}:{','.join(sorted(names))}" for d, names in sorted(pending.items()))
    if len(files) > _MAX_KEY_LENGTH:
        files = "sha1:" + hashlib.sha1(files.encode()).hexdigest()
    return f"{files}|raw={'none' if raw_version is None else raw_version}|gen={generation}"


def request_for(dates: list[str], key: str, files: int) -> dg.RunRequest:
    """One incremental run over ``dates``: their partition, or the range from first to last
    (the dates between have nothing pending, so the run ingests nothing for them)."""
    tags = {INCREMENTAL_TAG: INCREMENTAL, "cdc/pending_files": str(files)}
    first, last = min(dates), max(dates)
    if first == last:
        return dg.RunRequest(run_key=key, partition_key=first, tags=tags)
    return dg.RunRequest(run_key=key, tags={**tags, RANGE_START_TAG: first, RANGE_END_TAG: last})


def build_landing_sensor(
    source: SourceConfig, partitions: dg.DailyPartitionsDefinition, job_name: str
) -> dg.SensorDefinition:
    @dg.sensor(
        name=f"{source.name}__landing_sensor",
        job_name=job_name,
        minimum_interval_seconds=source.sensor_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"Requests a run of {job_name} (raw -> change log -> current) when the landing "
            f"folder of `{source.name}` holds files raw does not (new, grown or rewritten); one "
            "run at a time, tagged cdc/mode: incremental, over the dates of those files (one "
            "partition or a range), and it ingests just those files. Its run key names the "
            "files and raw's Delta version, so one state is requested once; the cursor holds the "
            "last run key, raw's version and a generation counting the times raw was recreated. "
            "A tick skips while a run of the job is queued or running, and when the last request "
            "did not ingest its files (it failed: re-execute it). Dates outside the source's "
            "partitions are logged and left alone."
        ),
    )
    def landing_sensor(context: dg.SensorEvaluationContext, lake: LakeResource) -> dg.SensorResult:
        last = SensorCursor.parse(context.cursor)
        if running := run_in_flight(context.instance, job_name):
            # Raw is being written: what it will lack is known once the run is done.
            return dg.SensorResult(
                skip_reason=f"run {running.run_id[:8]} of {job_name} is queued or running",
                cursor=last.dumps(),
            )
        version = delta.version(delta.table_uri(lake.warehouse_path, delta.RAW, source.name))
        generation = last.generation_at(version)  # raw recreated: its files are pending again
        pending = ingest.pending_landing_files(
            lake.warehouse_path, source.name, lake.landing_for(source.name)
        )

        def skip(reason: str) -> dg.SensorResult:
            cursor = SensorCursor(run_key=last.run_key, raw_version=version, generation=generation)
            return dg.SensorResult(skip_reason=reason, cursor=cursor.dumps())

        valid = set(partitions.get_partition_keys())
        outside = sorted(d for d in pending if d not in valid)
        if outside:
            context.log.warning(
                f"landing dates outside the partitions of {source.name} (from "
                f"{partitions.start:%Y-%m-%d}): {', '.join(outside)}; set start_date in "
                "sources.yaml or reload the code location (partitions start at the earliest "
                "landing date) to ingest them"
            )
        pending = {d: names for d, names in pending.items() if d in valid}
        if not pending:
            return skip(
                "raw holds every landing file"
                + (f" (dates outside the partitions: {', '.join(outside)})" if outside else "")
            )
        key = run_key(pending, version, generation)
        if key == last.run_key:
            return skip(
                f"a run was already requested for these files ({key}) and has not ingested "
                "them; if it failed, re-execute it"
            )
        files = sum(len(names) for names in pending.values())
        return dg.SensorResult(
            run_requests=[request_for(sorted(pending), key, files)],
            cursor=SensorCursor(run_key=key, raw_version=version, generation=generation).dumps(),
        )

    return landing_sensor
