"""Landing sensors: a run for every ingest date whose files changed since the last tick."""

import hashlib
import json
from pathlib import Path

import dagster as dg

from cdc_platform.catalog import SourceConfig
from cdc_platform.defs.partitions import daily
from cdc_platform.ingest import landing


def fingerprint(files: list[Path]) -> str:
    """Changes when a file is added, removed, grown or rewritten."""
    h = hashlib.sha256()
    for p in files:
        st = p.stat()
        h.update(f"{p.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def build_landing_sensor(
    source: SourceConfig, landing_dir: Path, job_name: str
) -> dg.SensorDefinition:
    @dg.sensor(
        name=f"{source.name}__landing_sensor",
        job_name=job_name,
        minimum_interval_seconds=source.sensor_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"Requests a run of {job_name} (raw -> change log -> current) for every date with "
            f"new, grown or removed files in {landing_dir}."
        ),
    )
    def landing_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
        valid = set(daily.get_partition_keys())
        requests, skipped = [], []
        for date in landing.partition_dates(landing_dir):
            mark = fingerprint(landing.files_for_date(landing_dir, date))
            if seen.get(date) == mark:
                continue
            if date not in valid:
                skipped.append(date)
                continue
            # run_key from the new fingerprint: re-evaluating the same state requests nothing.
            requests.append(dg.RunRequest(partition_key=date, run_key=f"{date}:{mark}"))
            seen[date] = mark
        if skipped:
            context.log.warning(f"landing dates outside the partitions: {', '.join(skipped)}")
        return dg.SensorResult(run_requests=requests, cursor=json.dumps(seen, sort_keys=True))

    return landing_sensor
