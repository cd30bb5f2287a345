"""What the sensors of a source share: run tags, the in-flight check and the cursor.

Every run of a source carries ``cdc/source: <source>`` (the ingest job's tags, the source's
automation sensor's run tags); the run queue (deploy/dagster.yaml) lets one run per value of that
tag in progress at a time. The sensors also skip while a run of their job is in flight, so they
do not pile up requests behind it.
"""

import json
from dataclasses import asdict, dataclass

import dagster as dg

# Run tag of sensor runs: they ingest and normalize only what raw or the change log lacks.
INCREMENTAL_TAG = "cdc/mode"
INCREMENTAL = "incremental"
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
    requested, raw's Delta version at the last tick, and how many times raw was seen recreated
    (its version went back, e.g. tables cleared): what raw lacks starts over then, and the
    generation keeps the new run keys apart from the old ones."""

    run_key: str | None = None
    raw_version: int | None = None
    generation: int = 0

    @classmethod
    def parse(cls, text: str | None) -> "SensorCursor":
        data = json.loads(text) if text else {}
        if not isinstance(data, dict) or "generation" not in data:
            return cls()  # none yet, or an older format
        return cls(
            run_key=data.get("run_key"),
            raw_version=data.get("raw_version"),
            generation=int(data["generation"]),
        )

    def generation_at(self, version: int | None) -> int:
        """The generation for raw at ``version``: one more when raw went back (was recreated)."""
        if self.raw_version is not None and (version is None or version < self.raw_version):
            return self.generation + 1
        return self.generation

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)
