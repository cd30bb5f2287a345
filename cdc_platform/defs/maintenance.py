"""The daily maintenance of every table of the warehouse: a purge of the files whose deletion
vectors mark a large share of their rows (``lake.purge``, rewritten without them, with the
small files), vacuum (``cdc_platform.lake.vacuum``) and, for a table an older release created,
our table properties (``lake.upgrade_properties``).

A live source replaces data files all day (each merge rewrites the files holding its keys)
and the replaced files stay on disk until a vacuum: without it the warehouse grows with every
micro-batch, not with the data. The ``cdc_maintenance`` job runs on the ``maintenance.cron``
schedule (daily by default), or when launched from the UI.
"""

from collections.abc import Callable

import dagster as dg
from pyspark.sql import SparkSession

from cdc_platform import lake
from cdc_platform.catalog import MaintenanceConfig
from cdc_platform.defs.resources import LakeResource, SparkResource

JOB_NAME = "cdc_maintenance"


def maintain_tables(
    context: dg.OpExecutionContext, warehouse: str, hours: int, spark_of: Callable[[], SparkSession]
) -> dict:
    """Maintain every table; a table that fails is named at the end, after the others are done.
    ``spark_of``: the session, started only when a purge rewrites files."""
    files = size = upgraded = purged = 0
    failed = {}
    tables = lake.all_tables(warehouse)
    for uri in tables:
        try:
            if lake.upgrade_properties(uri):
                upgraded += 1
                context.log.info(f"{uri}: table properties set to {lake.TABLE_PROPERTIES}")
            rewritten = lake.purge(spark_of, uri)
            if rewritten:
                purged += rewritten
                context.log.info(f"{uri}: {rewritten} files rewritten without their deleted rows")
            done = lake.vacuum(uri, retention_hours=hours)
        except Exception as error:  # noqa: BLE001 - one table's trouble must not stop the rest
            failed[uri] = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
            continue
        if done.files:
            context.log.info(f"{uri}: {done.files} files deleted, {done.bytes:,} bytes")
        files, size = files + done.files, size + done.bytes
    if failed:
        lines = "\n".join(f"{uri}: {why}" for uri, why in failed.items())
        raise dg.Failure(f"{len(failed)} of {len(tables)} tables failed their maintenance\n{lines}")
    return {"tables": len(tables), "files_deleted": files, "bytes_deleted": size,
            "tables_upgraded": upgraded, "files_purged": purged}  # fmt: skip


def build_maintenance_defs(config: MaintenanceConfig) -> dg.Definitions:
    hours = config.retention_hours

    @dg.op(
        name="maintain_tables",
        description=(
            "In every table: rewrites the files whose deletion vectors mark at least "
            f"{lake.PURGE_SHARE:.0%} of their rows, deletes the data and deletion vector files "
            f"that are no longer in it (replaced by a merge, or left by a crashed write) once "
            f"they are {hours} hours old, and sets our table properties where an older release "
            "did not."
        ),
    )
    def maintain_op(
        context: dg.OpExecutionContext, lake: LakeResource, spark: SparkResource
    ) -> dg.Output[None]:
        found = maintain_tables(context, lake.warehouse_uri, hours, lambda: spark.spark_session)
        return dg.Output(None, metadata=found)

    @dg.job(
        name=JOB_NAME,
        description="Purges files of many deleted rows, vacuums every table; sets old tables'"
        " properties.",
    )
    def maintenance_job() -> None:
        maintain_op()

    schedule = dg.ScheduleDefinition(
        name=f"{JOB_NAME}_schedule",
        job=maintenance_job,
        cron_schedule=config.cron,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Runs {JOB_NAME} on the cron schedule {config.cron} (UTC).",
    )
    return dg.Definitions(jobs=[maintenance_job], schedules=[schedule])
