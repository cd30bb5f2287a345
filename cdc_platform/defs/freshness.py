"""Freshness checks: a current table further behind its source than the configured minutes fails.

The lag comes from the source's own clock (event times of changes, heartbeats and transaction
markers; ``cdc_platform.freshness``), not from when Dagster last ran. The checks run after every
merge (they are part of the ingest job) and on the ``cdc_freshness`` schedule, so a source that
went silent turns red without any run of its own.
"""

import dagster as dg

from cdc_platform import freshness
from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.defs.metadata import freshness_metadata
from cdc_platform.defs.resources import LakeResource

# How often the freshness checks run on their own.
SCHEDULE_CRON = "*/5 * * * *"


def build_freshness_check(
    source: SourceConfig, table: TableConfig, current_key: dg.AssetKey
) -> dg.AssetChecksDefinition:
    limit = source.max_lag(table)

    @dg.asset_check(
        asset=current_key,
        name="freshness",
        description=(
            f"Fails when the table is more than {limit:g} minutes behind its source (newest "
            "source event time merged, or heartbeat seen with nothing left to merge)."
        ),
    )
    def check(lake: LakeResource) -> dg.AssetCheckResult:
        seen = freshness.current(lake.warehouse_uri, source.name, table.name)
        if seen.position is None:
            return dg.AssetCheckResult(
                passed=False,
                severity=dg.AssetCheckSeverity.WARN,
                description="no change or heartbeat of the source merged yet",
                metadata={"max_lag_minutes": limit},
            )
        lag_minutes = seen.lag_seconds / 60
        return dg.AssetCheckResult(
            passed=lag_minutes <= limit,
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"{lag_minutes:.1f} min behind the source (limit {limit:g})",
            metadata={**freshness_metadata(seen), "max_lag_minutes": limit},
        )

    return check


def build_freshness_schedule(checks: list[dg.AssetChecksDefinition]) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name="cdc_freshness",
        cron_schedule=SCHEDULE_CRON,
        target=dg.AssetSelection.checks(*checks),
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description="Runs the freshness checks every 5 minutes, whether or not data arrives.",
    )
