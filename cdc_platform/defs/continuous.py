"""A source run continuously (``continuous`` in sources.yaml): one long Dagster run that takes
micro-batch after micro-batch, raw -> change log -> current and history with their checks.

A run per batch pays, every batch, for a sensor tick, the queue, a process, the code location
and a Spark session before any work: about 3 s of an 8 s small run. A continuous run pays them
once. Each micro-batch runs the same steps as the ingest job's assets and reports the same
materializations (``outputs``) and check evaluations, so the asset pages read alike whichever
ran. It is the same exactly-once pipeline: each step stores what it has done in its commits, so a
micro-batch may die anywhere and the next run finishes it (``unfinished``, looked at when a
run starts and after a transient failure).

A continuous run holds its source's slot in the run queue. It ends after ``run_minutes``, or
as soon as another run of its source is queued (a backfill, a manual materialization), and the
source's sensor starts the next one when no run of the source is in flight. A failed run is
restarted at once (killed, it lost nothing), but after two failures in a row the next waits
``RESTART_AFTER_FAILURE_SECONDS``, so a deterministic failure does not loop.

A Kafka micro-batch takes at most what the micro-batches before it show can be finished in
``batch_seconds`` (``BatchBound``), so a backlog is worked through in micro-batches of about that
length rather than of a fixed ``max_records`` (which stays the memory bound). A landing
micro-batch takes every file waiting: a file is its unit. While micro-batches follow each other,
a Kafka source's consumer stays open (``kafka.KafkaReader``): it fetches the next micro-batch's
records while Spark works on this one. The run closes it before it waits.

A micro-batch starts once ``min_batch_records`` (Kafka) or ``min_batch_bytes`` (landing) wait,
or ``max_wait_seconds`` after the run first saw less (``Gather``): a small micro-batch costs
seconds of CPU whatever its size, so a trickle waits up to a minute and is taken once for
several of its batches; a burst goes at once.
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import dagster as dg
from pyspark.sql import SparkSession

from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.defs import outputs, quality
from cdc_platform.defs.keys import asset_key
from cdc_platform.defs.metadata import profiled
from cdc_platform.defs.partitions import today
from cdc_platform.defs.resources import LakeResource, SparkResource
from cdc_platform.defs.runs import IN_FLIGHT, source_tags
from cdc_platform.defs.sensors import outside_partitions_warning
from cdc_platform.defs.transient import (
    RETRY_SECONDS,
    fail_with_root_cause,
    reset_if_spark_gone,
    transient_reason,
)
from cdc_platform.ingest import kafka
from cdc_platform.lake import CHANGELOG
from cdc_platform.lake.landing_files import LandingFile
from cdc_platform.steps.changelog import normalize_new
from cdc_platform.steps.current import merge_current
from cdc_platform.steps.history import update_history
from cdc_platform.steps.progress import unfinished
from cdc_platform.steps.raw import ingest_landing, pending_landing
from cdc_platform.timings import phase

RESTART_AFTER_FAILURE_SECONDS = 60
# The first Kafka micro-batch's bound is this many records per second of ``batch_seconds``: about
# what a micro-batch does on the 2-core machine (BENCHMARKS.md). The bound then learns the source's.
FIRST_RECORDS_PER_SECOND = 5_000
MIN_RECORDS = 1_000
MAX_GROWTH = 4  # a bound grows at most this much a micro-batch: a small one says little

Event = dg.AssetMaterialization | dg.AssetCheckEvaluation


@dataclass
class BatchBound:
    """How many records the next Kafka micro-batch takes. A micro-batch costs a fixed part plus
    a part per record, so ``records x seconds / took`` after each micro-batch converges on the
    count that takes ``seconds``. Learned only from the micro-batches that say something: those
    cut short by the bound (the source had more) and those that took longer than ``seconds``."""

    seconds: float
    ceiling: int  # the source's max_records: what memory allows
    records: int = 0

    def __post_init__(self) -> None:
        first = int(FIRST_RECORDS_PER_SECOND * self.seconds)
        self.records = self.records or min(self.ceiling, max(MIN_RECORDS, first))

    def learn(self, records: int, took: float, bounded: bool) -> None:
        if records and (bounded or took > self.seconds):
            fit = records * self.seconds / max(took, 1e-3)
            self.records = int(min(self.ceiling, self.records * MAX_GROWTH, max(MIN_RECORDS, fit)))


@dataclass
class Gather:
    """Whether to start a micro-batch, from what waits: at once when ``minimum`` waits, else
    ``seconds`` after less was first seen (as a Kafka fetch's min bytes and max wait)."""

    minimum: int
    seconds: float
    since: float | None = None  # when the run first saw less than ``minimum`` waiting

    def ready(self, waiting: int, now: float) -> bool:
        if not waiting:
            self.since = None
            return False
        if self.since is None:
            self.since = now
        if waiting >= self.minimum or now - self.since >= self.seconds:
            self.since = None
            return True
        return False


@dataclass
class MicroBatches:
    """The steps of one source's micro-batches, in one run (one Spark session throughout)."""

    context: dg.OpExecutionContext
    spark: SparkResource
    lake: LakeResource
    source: SourceConfig
    tables: list[TableConfig]
    partitions: dg.DailyPartitionsDefinition
    bound: BatchBound | None = None  # Kafka sources
    taken: kafka.KafkaIngestResult | None = None  # the last Kafka micro-batch's raw
    reader: kafka.KafkaReader | None = None  # a Kafka source's consumer, open between micro-batches
    warned: set[str] = field(default_factory=set)  # landing dates said to be outside
    listed_at: float | None = None  # when the landing folder was last listed whole (monotonic)
    gather: Gather = field(init=False)  # when the next micro-batch starts

    def __post_init__(self) -> None:
        settings = self.source.continuous
        assert settings is not None
        if self.source.kafka is not None:
            ceiling = self.source.kafka.max_records
            self.bound = BatchBound(settings.batch_seconds, ceiling)
        kafka_source = self.source.transport == "kafka"
        minimum = settings.min_batch_records if kafka_source else settings.min_batch_bytes
        self.gather = Gather(minimum, settings.max_wait_seconds)

    def ready(self) -> bool:
        """Whether enough waits to start a micro-batch (``Gather``): Kafka records past raw's
        offsets, or bytes of landing files raw does not hold; read from the broker's watermarks
        or the landing folder, not Spark."""
        if not self.gather.seconds:
            return True
        if self.taken is not None and self.taken.bounded:
            return True  # a backlog cut by the bound: the rest is no trickle
        if self.source.transport == "kafka":
            # A partition listed waits at least a record: a broker whose watermark points into
            # its newest record batch (Tansu) may show none past a cut-short micro-batch.
            waiting = sum(
                max(high - start, 1)
                for partitions in kafka.pending(self.lake.warehouse_uri, self.source).values()
                for start, high in partitions.values()
            )
        else:
            if self._full_listing_due():
                return True  # ``ingest`` lists the landing folder whole (idle if nothing new)
            pending = self._landing_dates(full=False)
            waiting = sum(f.size for files in pending.values() for f in files)
        return self.gather.ready(waiting, time.monotonic())

    def learn(self, took: float) -> None:
        """Fit the Kafka bound to the micro-batch just done, ``took`` seconds from its ingest to
        its last merge."""
        if self.bound is not None and self.taken is not None:
            before = self.bound.records
            self.bound.learn(self.taken.records, took, self.taken.bounded)
            if abs(self.bound.records - before) > before / 4:
                self.context.log.info(
                    f"Kafka micro-batches now take at most {self.bound.records:,} records (the "
                    f"last took {took:.1f} s for {self.taken.records:,})"
                )

    def ingest(self) -> tuple[outputs.Output | None, list[str]]:
        """New data -> raw: its materialization (None when nothing came) and its dates."""
        warehouse, source = self.lake.warehouse_uri, self.source
        if source.transport == "kafka":
            date = today().isoformat()
            assert self.bound is not None
            with phase("raw"):
                if self.reader is None:
                    self.reader = kafka.KafkaReader(source)
                batch = kafka.ingest_kafka(
                    warehouse, source, max_records=self.bound.records, date=date, reader=self.reader
                )
            self.taken = batch
            if not batch.records:
                return None, []
            return outputs.kafka_raw(warehouse, source, batch), [date]
        full, started = self._full_listing_due(), time.monotonic()
        with phase("raw.pending"):
            dates = sorted(self._landing_dates(full))
        if dates:
            landing_dir = self.lake.landing_for(source.name)
            with phase("raw"):
                result = ingest_landing(warehouse, source.name, landing_dir, dates, full=full)
        if full:
            self.listed_at = started
        if not dates:
            return None, []
        return outputs.landing_raw(warehouse, source, result), dates

    def release(self) -> None:
        """Close the Kafka consumer before the run waits or ends: kept open, it would go on
        fetching for a micro-batch that does not come soon."""
        if self.reader is not None:
            self.reader, reader = None, self.reader
            reader.close()

    def _full_listing_due(self) -> bool:
        """Whether the landing folder is to be listed whole (``full_listing_minutes``, as the
        sensor does): at a run's first micro-batch, then every so many minutes."""
        every = self.source.full_listing_minutes * 60
        return self.listed_at is None or time.monotonic() - self.listed_at >= every

    def _landing_dates(self, full: bool) -> dict[str, list[LandingFile]]:
        """The landing files raw does not hold, per date within the partitions (``full``: from
        a whole listing). Dates outside them wait, as they do for the sensor; said once per
        run."""
        source = self.source
        landing_dir = self.lake.landing_for(source.name)
        pending = pending_landing(self.lake.warehouse_uri, source.name, landing_dir, full)
        valid = set(self.partitions.get_partition_keys())
        if outside := sorted(d for d in pending if d not in valid and d not in self.warned):
            self.context.log.warning(outside_partitions_warning(source, self.partitions, outside))
            self.warned.update(outside)
        return {d: names for d, names in pending.items() if d in valid}

    def process(self, raw: outputs.Output | None, dates: list[str]) -> Iterator[Event]:
        """The change log of the new raw batches (and of any a failed run left), its checks,
        then each table's current and history unless its change log failed a blocking check.
        The micro-batch's check results come at its end, with one Data Docs publish for all
        its validations; also when a step fails, for those done before it."""
        validated: list[quality.Validated] = []
        try:
            yield from self._steps(raw, dates, validated)
        except Exception:
            yield from self._check_results(validated)
            raise
        yield from self._check_results(validated)

    def _steps(
        self, raw: outputs.Output | None, dates: list[str], validated: list[quality.Validated]
    ) -> Iterator[dg.AssetMaterialization]:
        """The micro-batch's steps and their materializations; its validations go to
        ``validated``."""
        warehouse, source, session = self.lake.warehouse_uri, self.source, self.spark_session
        dates = dates or [today().isoformat()]
        if raw is not None:
            yield from raw.materializations(dates)
        result = normalize_new(session, warehouse, source)
        new_tables = outputs.routed_without_assets(self.tables, result)
        if new_tables:
            self.context.log.warning(outputs.routed_without_assets_warning(new_tables))
        for output in outputs.changelog(warehouse, source, self.tables, result, new_tables):
            yield from output.materializations(dates)
        label = f"{quality.batch_label(dates, True)} (continuous)"
        with quality.reconciling(
            session, warehouse, source, dates, result.written, validated, label
        ):
            yield from self._checked_merges(result.written, dates, label, validated)

    def _checked_merges(
        self,
        written: dict[str, list[str]],
        dates: list[str],
        label: str,
        validated: list[quality.Validated],
    ) -> Iterator[dg.AssetMaterialization]:
        """The change logs' checks, then each table's current and history unless its change log
        failed a blocking check."""
        warehouse, source, session = self.lake.warehouse_uri, self.source, self.spark_session
        with phase("checks"):
            changelogs = quality.validate_changelogs(
                session, warehouse, source, self.tables, dates, written, label
            )
        validated += changelogs
        blocked = quality.blocked(changelogs)
        for table in self.tables:
            if asset_key(CHANGELOG, source.name, table.name) in blocked:
                self.context.log.warning(
                    f"{table.name}: not merged, its change log failed a blocking check; the "
                    "next micro-batch whose checks pass merges it with the rest"
                )
                continue
            merged = merge_current(session, warehouse, source.name, table.name, options=table)
            current = outputs.current(warehouse, source, table, merged)
            with phase("checks"):
                validated += quality.validate_current(session, warehouse, source, table, merged)
            yield from current.materializations([])
            if table.history:
                built = update_history(session, warehouse, source.name, table)
                yield from outputs.history(source, table, built).materializations([])

    def _check_results(self, validated: list[quality.Validated]) -> Iterator[Event]:
        if not validated:
            return
        with phase("checks"):
            warehouse = self.lake.warehouse_uri
            checks = quality.check_results(
                self.context, validated, warehouse, self.source, self.tables
            )
        yield from (_evaluation(c) for c in checks)

    @property
    def spark_session(self) -> SparkSession:
        with phase("spark.session"):
            return self.spark.spark_session


def _evaluation(result: dg.AssetCheckResult) -> dg.AssetCheckEvaluation:
    """A check result as an op reports it (the asset's own run returns the result)."""
    return dg.AssetCheckEvaluation(
        asset_key=result.asset_key,
        check_name=result.check_name,
        passed=result.passed,
        metadata=result.metadata,
        severity=result.severity,
        description=result.description,
    )


def _queued_run(instance: dg.DagsterInstance, source: str) -> dg.DagsterRun | None:
    """Another run of ``source`` waiting in the queue (the queue runs one per source)."""
    runs = instance.get_runs(
        filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED], tags=source_tags(source)),
        limit=1,
    )
    return runs[0] if runs else None


def _run(
    context: dg.OpExecutionContext, batches: MicroBatches, minutes: float, poll_seconds: float
) -> Iterator[Event]:
    """Micro-batch after micro-batch for ``minutes``, or until another run of the source is
    queued."""
    end = time.monotonic() + minutes * 60
    failures = 0
    catch_up = True  # what a run that died left: looked at first, and after a failure
    while time.monotonic() < end:
        if queued := _queued_run(context.instance, batches.source.name):
            context.log.info(
                f"run {queued.run_id[:8]} of {batches.source.name} is queued: this continuous "
                "run ends for it, and the sensor starts the next one after it"
            )
            return
        try:
            # A run's first look, and one after a failure, also finishes what was left.
            if not catch_up and not batches.ready():
                batches.release()
                time.sleep(poll_seconds)
                continue
            started = time.monotonic()
            with profiled(context) as profile:
                left = catch_up and unfinished(batches.lake.warehouse_uri, batches.source)
                raw, dates = batches.ingest()
                idle = raw is None and not left
                if idle:
                    profile.skip()
                else:
                    yield from batches.process(raw, dates)
            if not left:  # a catch-up's time is not the batch's alone
                batches.learn(time.monotonic() - started)
            if idle:
                batches.release()
                catch_up = False
                time.sleep(poll_seconds)
                continue
            failures, catch_up = 0, False
        except Exception as error:
            batches.release()
            reason = transient_reason(error)
            if reason is None or failures >= len(RETRY_SECONDS):
                fail_with_root_cause(error)
                raise
            reset_if_spark_gone(error, batches.spark)
            wait = RETRY_SECONDS[failures]
            failures, catch_up = failures + 1, True
            context.log.warning(f"transient: {reason}; micro-batch again in {wait} s "
                                f"(attempt {failures} of {len(RETRY_SECONDS)})")  # fmt: skip
            time.sleep(wait)


def build_continuous_job(
    source: SourceConfig, tables: list[TableConfig], partitions: dg.DailyPartitionsDefinition
) -> dg.JobDefinition:
    settings = source.continuous
    assert settings is not None

    @dg.op(
        name=f"{source.name}__micro_batches",
        out={},  # it reports materializations and checks, and passes nothing on
        description=f"Micro-batch after micro-batch of `{source.name}`, for "
        f"{settings.run_minutes:g} minutes or until another run of the source is queued.",
    )
    def micro_batches(
        context: dg.OpExecutionContext, spark: SparkResource, lake: LakeResource
    ) -> Iterator[Event]:
        batches = MicroBatches(context, spark, lake, source, tables, partitions)
        try:
            yield from _run(context, batches, settings.run_minutes, settings.poll_seconds)
        finally:
            batches.release()

    @dg.job(
        name=f"{source.name}__continuous",
        description=f"`{source.name}` continuously: raw -> change log -> current and history, "
        "micro-batch after micro-batch in one run (sources.yaml `continuous`).",
        tags=source_tags(source.name),
    )
    def continuous() -> None:
        micro_batches()

    return continuous


def build_continuous_sensor(source: SourceConfig, job_name: str) -> dg.SensorDefinition:
    @dg.sensor(
        name=f"{source.name}__continuous_sensor",
        job_name=job_name,
        minimum_interval_seconds=source.sensor_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"Keeps a continuous run of `{source.name}` going: requests one when no run of the "
            "source is queued or running; after two failed runs in a row, "
            f"{RESTART_AFTER_FAILURE_SECONDS} s after the last at the earliest."
        ),
    )
    def continuous_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        instance = context.instance
        tags = source_tags(source.name)
        running = instance.get_runs(filters=dg.RunsFilter(statuses=IN_FLIGHT, tags=tags), limit=1)
        if running:
            return dg.SensorResult(skip_reason=f"run {running[0].run_id[:8]} is in flight")
        last = instance.get_run_records(filters=dg.RunsFilter(job_name=job_name), limit=2)
        failed = [r for r in last if r.dagster_run.status == dg.DagsterRunStatus.FAILURE]
        if len(failed) == 2:  # a killed run is restarted at once; a failing one is spaced out
            since = time.time() - (failed[0].end_time or 0)
            if since < RESTART_AFTER_FAILURE_SECONDS:
                return dg.SensorResult(
                    skip_reason=f"the last two continuous runs failed, the last {since:.0f} s "
                    f"ago; the next starts {RESTART_AFTER_FAILURE_SECONDS} s after it"
                )
        return dg.SensorResult(run_requests=[dg.RunRequest()])

    return continuous_sensor
