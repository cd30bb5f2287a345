"""The landing sensor of a files source: one incremental run at a time for the files raw lacks."""

import dagster as dg

from cdc_platform.catalog import SourceConfig
from cdc_platform.defs.partitions import today
from cdc_platform.defs.resources import LakeResource
from cdc_platform.defs.runs import (
    FULL_LISTING,
    INCREMENTAL,
    INCREMENTAL_TAG,
    LISTING_TAG,
    SensorCursor,
    Tick,
    finish_or_skip,
    run_in_flight,
)
from cdc_platform.lake import RAW, TableRef, version
from cdc_platform.steps.raw import pending_landing_files

# Run tags of a run over several dates (what a backfill over a partition range sets).
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


def pending_text(pending: dict[str, list[str]]) -> str:
    """``pending`` (date -> landing files raw lacks) as the text of its run key."""
    return ";".join(f"{d}:{','.join(sorted(names))}" for d, names in sorted(pending.items()))


def request_for(dates: list[str], key: str, files: int, full: bool) -> dg.RunRequest:
    """One incremental run over ``dates``: their partition, or the range from first to last
    (the dates between have nothing pending, so the run ingests nothing for them); ``full``:
    the tick listed the landing folder whole, and so does the run for its dates."""
    tags = {INCREMENTAL_TAG: INCREMENTAL, "cdc/pending_files": str(files)}
    if full:
        tags[LISTING_TAG] = FULL_LISTING
    first, last = min(dates), max(dates)
    if first == last:
        return dg.RunRequest(run_key=key, partition_key=first, tags=tags)
    return dg.RunRequest(run_key=key, tags={**tags, RANGE_START_TAG: first, RANGE_END_TAG: last})


def outside_partitions_warning(
    source: SourceConfig, partitions: dg.DailyPartitionsDefinition, outside: list[str]
) -> str:
    """What to say of landing dates that the source's partitions do not hold (yet)."""
    return (
        f"landing dates outside the partitions of {source.name} (from "
        f"{partitions.start:%Y-%m-%d}): {', '.join(outside)}; set start_date in sources.yaml "
        "or reload the code location (partitions start at the earliest landing date) to "
        "ingest them"
    )


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
            "partitions are logged and left alone. With no file pending, it requests a run once "
            "when an output lacks part of its input (a run died after its raw commit). A tick "
            "lists only the landing names from the last one raw holds on (new files, the last "
            f"grown), and the whole folder every {source.full_listing_minutes:g} minutes "
            "(full_listing_minutes): files landed under earlier names, files rewritten."
        ),
    )
    def landing_sensor(context: dg.SensorEvaluationContext, lake: LakeResource) -> dg.SensorResult:
        if running := run_in_flight(context.instance, job_name):
            # Raw is being written: what it will lack is known once the run is done.
            return dg.SensorResult(
                skip_reason=f"run {running.run_id[:8]} of {job_name} is queued or running",
                cursor=SensorCursor.parse(context.cursor).dumps(),
            )
        raw = TableRef(RAW, source.name).uri(lake.warehouse_uri)
        tick = Tick.start(context.cursor, version(raw))  # recreated: files pending again
        tick, full = tick.listing(source.full_listing_minutes)
        pending = pending_landing_files(
            lake.warehouse_uri, source.name, lake.landing_for(source.name), full
        )
        valid = set(partitions.get_partition_keys())
        outside = sorted(d for d in pending if d not in valid)
        if outside:
            context.log.warning(outside_partitions_warning(source, partitions, outside))
        pending = {d: names for d, names in pending.items() if d in valid}
        if not pending:
            return finish_or_skip(
                context, tick, job_name, lake.warehouse_uri, source,
                lambda key: request_for([today().isoformat()], key, 0, full),
                "raw holds every landing file"
                + (f" (dates outside the partitions: {', '.join(outside)})" if outside else ""),
            )  # fmt: skip
        files = sum(len(names) for names in pending.values())
        return tick.request(
            pending_text(pending), "files",
            lambda key: request_for(sorted(pending), key, files, full),
        )  # fmt: skip

    return landing_sensor
