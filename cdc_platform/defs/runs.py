"""What the sensors of a source share: run tags, the in-flight check, the cursor, run keys and
the shape of a tick (``Tick``: skip, or request once per state).

Every run of a source carries ``cdc/source: <source>`` (the ingest job's tags, the source's
automation sensor's run tags); the run queue (deploy/dagster.yaml) lets one run per value of that
tag in progress at a time. The sensors also skip while a run of their job is in flight, so they
do not pile up requests behind it.
"""

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import dagster as dg

from cdc_platform.catalog import SourceConfig
from cdc_platform.steps.progress import unfinished

# Run tag of sensor runs: they ingest and normalize only what raw or the change log lacks.
INCREMENTAL_TAG = "cdc/mode"
INCREMENTAL = "incremental"
# Run tag of a files source's sensor runs: "full" when the tick listed the landing folder whole
# (the run lists its dates whole too), else the run lists from the last name raw holds on.
LISTING_TAG = "cdc/listing"
FULL_LISTING = "full"
# The run tag the queue limits to one run in progress per value.
SOURCE_TAG = "cdc/source"
# Its value on the SQL models' automation runs (a source may not be named so: catalog.py).
MODELS = "models"

IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def source_tags(source: str) -> dict[str, str]:
    return {SOURCE_TAG: source}


def run_in_flight(instance: dg.DagsterInstance, job_name: str) -> dg.DagsterRun | None:
    """A run of ``job_name`` that is queued, starting or running, if any."""
    runs = instance.get_runs(filters=dg.RunsFilter(job_name=job_name, statuses=IN_FLIGHT), limit=1)
    return runs[0] if runs else None


@dataclass(frozen=True, kw_only=True)
class SensorCursor:
    """What a source's sensor keeps between ticks (JSON): the run key of the last run it
    requested, raw's Delta version at the last tick, how many times raw was seen recreated
    (its version went back, e.g. tables cleared): what raw lacks starts over then, and the
    generation keeps the new run keys apart from the old ones; and when a files source's
    landing folder was last listed whole (epoch seconds)."""

    run_key: str | None = None
    raw_version: int | None = None
    generation: int = 0
    listed_at: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> "SensorCursor":
        data = json.loads(text) if text else {}
        if not isinstance(data, dict) or "generation" not in data:
            return cls()  # none yet, or an older format
        return cls(
            run_key=data.get("run_key"),
            raw_version=data.get("raw_version"),
            generation=int(data["generation"]),
            listed_at=data.get("listed_at"),
        )

    def generation_at(self, version: int | None) -> int:
        """The generation for raw at ``version``: one more when raw went back (was recreated)."""
        if self.raw_version is not None and (version is None or version < self.raw_version):
            return self.generation + 1
        return self.generation

    def dumps(self) -> str:
        data = asdict(self)
        if data["listed_at"] is None:  # a Kafka source's: it never lists
            del data["listed_at"]
        return json.dumps(data, sort_keys=True)


# Longer run keys are hashed: Dagster stores the key as a run tag.
_MAX_KEY_LENGTH = 200


def run_key(pending: str, raw_version: int | None, generation: int) -> str:
    """The run key of a request for ``pending`` (what raw lacks, as text), read from raw at
    ``raw_version``, in the cursor's ``generation``: one state always gives the same key."""
    if len(pending) > _MAX_KEY_LENGTH:
        pending = "sha1:" + hashlib.sha1(pending.encode()).hexdigest()
    return f"{pending}|raw={'none' if raw_version is None else raw_version}|gen={generation}"


@dataclass(frozen=True)
class Tick:
    """One tick of a source's sensor: the cursor it found and raw's version now."""

    last: SensorCursor
    raw_version: int | None
    listed_at: float | None = None  # this tick listed the landing folder whole then

    @classmethod
    def start(cls, cursor: str | None, raw_version: int | None) -> "Tick":
        last = SensorCursor.parse(cursor)
        return cls(last, raw_version, last.listed_at)

    def listing(self, every_minutes: float) -> tuple["Tick", bool]:
        """This tick and whether it lists the landing folder whole: when the last whole listing
        is ``every_minutes`` old, or none was made (the cursor then holds this one's time)."""
        now = time.time()
        if self.listed_at is not None and now - self.listed_at < every_minutes * 60:
            return self, False
        return dataclasses.replace(self, listed_at=now), True

    def cursor(self, run_key: str | None) -> str:
        return SensorCursor(
            run_key=run_key,
            raw_version=self.raw_version,
            generation=self.generation,
            listed_at=self.listed_at,
        ).dumps()

    @property
    def generation(self) -> int:
        """The cursor's generation, one more when raw was recreated (what it lacks starts
        over, and new run keys must differ from the old ones)."""
        return self.last.generation_at(self.raw_version)

    def skip(self, reason: str) -> dg.SensorResult:
        return dg.SensorResult(skip_reason=reason, cursor=self.cursor(self.last.run_key))

    def request(
        self, pending: str, what: str, make: Callable[[str], dg.RunRequest]
    ) -> dg.SensorResult:
        """The run ``make(run_key)`` for ``pending`` (``what`` it names, for the skip reason),
        unless the last request was for the same state: it has not ingested them yet."""
        key = run_key(pending, self.raw_version, self.generation)
        if key == self.last.run_key:
            return self.skip(
                f"a run was already requested for these {what} ({key}) and has not ingested "
                "them; if it failed, re-execute it"
            )
        return dg.SensorResult(run_requests=[make(key)], cursor=self.cursor(key))


def finish_or_skip(
    context: dg.SensorEvaluationContext,
    tick: Tick,
    job_name: str,
    warehouse: str,
    source: SourceConfig,
    make: Callable[[str], dg.RunRequest],
    reason: str,
) -> dg.SensorResult:
    """A tick that found nothing new to ingest: a run ``make(run_key)`` when the source's
    outputs lack some of their input (a run died after its raw commit, and no new data would
    bring the next one), once per such state; else skip for ``reason``."""
    left = unfinished(warehouse, source)
    if left is None:
        return tick.skip(reason)
    if running := run_in_flight(context.instance, job_name):
        return tick.skip(f"run {running.run_id[:8]} of {job_name} is queued or running")
    return tick.request(f"finish:{left}", "unfinished outputs", make)
