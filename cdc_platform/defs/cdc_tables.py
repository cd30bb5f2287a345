"""Assets of one source: raw -> change log per table (+ DDL and control logs, quarantine) ->
current and history per table; its ingest job and sensor."""

import dagster as dg
from pydantic import Field

from cdc_platform.catalog import Catalog, SourceConfig, TableConfig
from cdc_platform.defs import outputs, quality
from cdc_platform.defs.automation import MERGE_WHEN_CHANGELOG_UPDATES, automation_sensor
from cdc_platform.defs.continuous import build_continuous_job, build_continuous_sensor
from cdc_platform.defs.freshness import build_freshness_check
from cdc_platform.defs.kafka import build_kafka_raw_asset, build_kafka_sensor
from cdc_platform.defs.keys import asset_key
from cdc_platform.defs.metadata import (
    profiled,
)
from cdc_platform.defs.partitions import daily_partitions, with_start_date
from cdc_platform.defs.resources import LakeResource, SparkResource
from cdc_platform.defs.runs import (
    FULL_LISTING,
    INCREMENTAL,
    INCREMENTAL_TAG,
    LISTING_TAG,
    source_tags,
)
from cdc_platform.defs.sensors import build_landing_sensor
from cdc_platform.defs.transient import retried_if_transient
from cdc_platform.lake import (
    CHANGELOG,
    CONTROL,
    CURRENT,
    DDL,
    HISTORY,
    QUARANTINE,
    RAW,
    changelog_tables,
)
from cdc_platform.steps.changelog import normalize_new, normalize_source
from cdc_platform.steps.current import merge_current
from cdc_platform.steps.history import update_history
from cdc_platform.steps.raw import ingest_landing
from cdc_platform.timings import phase

# Every partitioned asset of a chain gets the same policy, or Dagster falls back to one
# partition per run.
SINGLE_RUN = dg.BackfillPolicy.single_run()


def build_raw_asset(source: SourceConfig, landing_dir: str) -> dg.AssetsDefinition:
    @dg.asset(
        key=asset_key(RAW, source.name),
        group_name=source.name,
        partitions_def=daily_partitions(source),
        backfill_policy=SINGLE_RUN,
        kinds={"delta"},
        description=(
            f"Raw topic of source `{source.name}` ({source.format}), read from {landing_dir}: "
            "every message exactly as received (value and key bytes, topic, partition, offset, "
            "timestamp, file, line), partitioned by ingest date. A sensor run ingests the files "
            "that are new or grew since; a backfill or manual run replaces its dates."
        ),
    )
    def raw(context: dg.AssetExecutionContext, lake: LakeResource) -> dg.MaterializeResult:
        with profiled(context), retried_if_transient(context):
            # A sensor run ingests the files raw does not hold as they are now, listed as its
            # tick listed them; any other run (a backfill, a manual one) replaces its dates.
            tags = context.run.tags
            incremental = tags.get(INCREMENTAL_TAG) == INCREMENTAL
            result = ingest_landing(
                lake.warehouse_uri,
                source.name,
                lake.landing_for(source.name),
                context.partition_keys,
                whole_date=not incremental,
                full=tags.get(LISTING_TAG) == FULL_LISTING,
            )
            return outputs.landing_raw(lake.warehouse_uri, source, result).result(context)

    return raw


def build_changelog_asset(source: SourceConfig, tables: list[TableConfig]) -> dg.AssetsDefinition:
    """One Spark pass over the raw partitions writes every table's change log and the quarantine.

    ``tables`` are the declared tables plus those routed earlier without a declaration; a table
    seen for the first time is routed too (its change log is written) and reported, and gets its
    assets when the code location reloads.
    """

    def spec(layer: str, table: str | None, description: str) -> dg.AssetSpec:
        return dg.AssetSpec(
            asset_key(layer, source.name, table),
            deps=[asset_key(RAW, source.name)],
            group_name=source.name,
            partitions_def=daily_partitions(source),
            kinds={"spark", "delta"},
            description=description,
        )

    specs = [
        spec(
            CHANGELOG,
            t.name,
            f"Change log of `{t.match}`: one canonical change record per row change (op, key, "
            "typed before/after images, sequence, event time, transaction id, raw coordinates), "
            "partitioned like raw.",
        )
        for t in tables
    ]
    specs += [
        spec(
            DDL,
            t.name,
            f"DDL log of `{t.match}`: every schema-change statement the source sent for it "
            "(statement, sequence, event time, raw coordinates), partitioned like raw.",
        )
        for t in tables
    ]
    specs.append(
        spec(
            CONTROL,
            None,
            f"Control log of `{source.name}`: heartbeats, transaction markers and Kafka "
            "tombstones (op, event time, transaction id, raw coordinates). Their event times "
            "tell how far the source has got when no row changes: see the freshness checks.",
        )
    )
    specs.append(
        spec(
            QUARANTINE,
            None,
            f"Messages of `{source.name}` that could not be parsed, keyed, typed or routed, "
            "with the reason, raw bytes and coordinates. Nothing is dropped unseen.",
        )
    )

    @dg.multi_asset(
        name=f"{source.name}__changelog",
        specs=specs,
        check_specs=quality.changelog_check_specs(source, tables),
        backfill_policy=SINGLE_RUN,
    )
    def changelog(context: dg.AssetExecutionContext, spark: SparkResource, lake: LakeResource):
        with profiled(context), retried_if_transient(context, spark):
            with phase("spark.session"):
                spark.spark_session  # noqa: B018  (built on first use: timed apart)
            if context.run.tags.get(INCREMENTAL_TAG) == INCREMENTAL:
                # A sensor run (Kafka or landing source): only the raw batches not normalized yet.
                result = normalize_new(spark.spark_session, lake.warehouse_uri, source)
            else:
                result = normalize_source(
                    spark.spark_session, lake.warehouse_uri, source, context.partition_keys
                )
            new_tables = outputs.routed_without_assets(tables, result)
            if new_tables:
                context.log.warning(outputs.routed_without_assets_warning(new_tables))
            written = outputs.changelog(lake.warehouse_uri, source, tables, result, new_tables)
            yield from (output.result(context) for output in written)
            session, dates = spark.spark_session, context.partition_keys
            validated: list[quality.Validated] = []
            with (
                quality.reconciling(
                    session, lake.warehouse_uri, source, dates, result.written, validated
                ),
                phase("checks"),
            ):
                validated += quality.validate_changelogs(
                    session, lake.warehouse_uri, source, tables, dates, result.written
                )
            with phase("checks"):
                yield from quality.check_results(
                    context, validated, lake.warehouse_uri, source, tables
                )

    return changelog


def _merge_condition(source: SourceConfig) -> dg.AutomationCondition | None:
    """When automation merges a change log into current and history: after it is updated
    outside the ingest job. Never for a continuous source: its run merges whatever the change
    log holds when it starts, and an automation run would end it (it yields to queued runs)."""
    return None if source.continuous else MERGE_WHEN_CHANGELOG_UPDATES


class RebuildConfig(dg.Config):
    """Run config of the current and history assets (the launchpad's `config:` block)."""

    full_refresh: bool = Field(
        False, description="rebuild the whole table from the change log instead of merging"
    )


def build_current_asset(source: SourceConfig, table: TableConfig) -> dg.AssetsDefinition:
    @dg.asset(
        key=asset_key(CURRENT, source.name, table.name),
        deps=[asset_key(CHANGELOG, source.name, table.name)],
        group_name=source.name,
        kinds={"spark", "delta"},
        automation_condition=_merge_condition(source),
        check_specs=quality.current_check_specs(source, table),
        description=(
            f"Current state of `{table.match}`: one row per primary key, typed columns, built by "
            "merging change-log batches by sequence (late or replayed events never overwrite "
            "newer ones). Deleted keys stay as hidden tombstones (`__deleted`)."
        ),
    )
    def current(
        context: dg.AssetExecutionContext,
        config: RebuildConfig,
        spark: SparkResource,
        lake: LakeResource,
    ) -> dg.MaterializeResult:
        with profiled(context), retried_if_transient(context, spark):
            with phase("spark.session"):
                session = spark.spark_session
            merged = merge_current(
                session,
                lake.warehouse_uri,
                source.name,
                table.name,
                full_refresh=config.full_refresh,
                options=table,
            )
            output = outputs.current(lake.warehouse_uri, source, table, merged)
            with phase("checks"):
                validated = quality.validate_current(
                    session, lake.warehouse_uri, source, table, merged
                )
                checks = quality.check_results(
                    context, validated, lake.warehouse_uri, source, [table]
                )
            return dg.MaterializeResult(metadata=output.metadata, check_results=checks)

    return current


def build_history_asset(source: SourceConfig, table: TableConfig) -> dg.AssetsDefinition:
    tracked = table.track_history_column_list or table.track_history_except_column_list

    @dg.asset(
        key=asset_key(HISTORY, source.name, table.name),
        deps=[asset_key(CHANGELOG, source.name, table.name)],
        group_name=source.name,
        kinds={"spark", "delta"},
        automation_condition=_merge_condition(source),
        description=(
            f"SCD type 2 history of `{table.match}`: one row per version of each key with "
            "`__start_at`/`__end_at` (sequence) and `__start_time`/`__end_time` (event time), "
            "`__is_current`, `__is_deleted`. Late events are placed where they belong"
            + ("; only changes to the tracked columns open a version." if tracked else ".")
        ),
    )
    def history(
        context: dg.AssetExecutionContext,
        config: RebuildConfig,
        spark: SparkResource,
        lake: LakeResource,
    ) -> dg.MaterializeResult:
        with profiled(context), retried_if_transient(context, spark):
            built = update_history(
                spark.spark_session, lake.warehouse_uri, source.name, table, config.full_refresh
            )
            return dg.MaterializeResult(metadata=outputs.history(source, table, built).metadata)

    return history


def build_source_defs(source: SourceConfig, catalog: Catalog) -> dg.Definitions:
    """Everything one source contributes: assets, the job its sensor runs, the sensor, its
    automation sensor, and the freshness checks of its tables."""
    source = with_start_date(source, catalog)  # its partitions start where its data starts
    tables = source.with_found(changelog_tables(catalog.warehouse_uri, source.name))
    raw_key = asset_key(RAW, source.name)
    if source.transport == "kafka":
        raw = build_kafka_raw_asset(source, raw_key)
    else:
        raw = build_raw_asset(source, catalog.landing_for(source))
    changelog = build_changelog_asset(source, tables)
    currents = [build_current_asset(source, t) for t in tables]
    currents += [build_history_asset(source, t) for t in tables if t.history]
    # The whole chain in one run (one Spark session): raw and change log for the run's date,
    # then the merges. Backfills and manual runs of the change log are followed by automation.
    job = dg.define_asset_job(
        f"{source.name}__ingest",
        selection=dg.AssetSelection.assets(raw, changelog, *currents),
        description="Raw and change log for the requested date, then current and history.",
        # The run queue lets one run per source in progress (deploy/dagster.yaml).
        tags=source_tags(source.name),
    )
    jobs: list[dg.JobDefinition | dg.UnresolvedAssetJobDefinition] = [job]
    if source.continuous:
        # One long run takes every batch; the ingest job stays for manual runs and backfills,
        # whose merges the continuous run's catch-up does when it starts again after them.
        continuous = build_continuous_job(source, tables, daily_partitions(source))
        jobs.append(continuous)
        sensors = [build_continuous_sensor(source, continuous.name)]
    else:
        if source.transport == "kafka":
            sensor = build_kafka_sensor(source, job.name)
        else:
            sensor = build_landing_sensor(source, daily_partitions(source), job.name)
        automation = automation_sensor(
            f"{source.name}__automation",
            dg.AssetSelection.assets(raw, changelog, *currents),
            source.name,
            f"Materializes the current and history tables of `{source.name}` (eager) after "
            "their change logs update outside its ingest job (a backfill, a manual run).",
        )
        sensors = [sensor, automation]
    checks = [
        build_freshness_check(source, t, asset_key(CURRENT, source.name, t.name)) for t in tables
    ]
    return dg.Definitions(
        assets=[raw, changelog, *currents],
        asset_checks=checks,
        jobs=jobs,
        sensors=sensors,
    )
