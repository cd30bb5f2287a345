"""What each step reports to Dagster, built from what it returns: one ``Output`` (asset key and
materialization metadata) per table it wrote. The asset bodies (a run per batch) turn them into
``MaterializeResult``s, the continuous run into ``AssetMaterialization``s, so both report the
same things."""

from dataclasses import dataclass
from datetime import datetime

import dagster as dg
import pyarrow.compute as pc

from cdc_platform import freshness, lake
from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.defs.keys import asset_key
from cdc_platform.defs.metadata import (
    add_partition_row_counts,
    arrow_preview,
    delta_metadata,
    freshness_metadata,
)
from cdc_platform.formats import canonical as C
from cdc_platform.ingest.kafka import KafkaIngestResult
from cdc_platform.lake import CHANGELOG, CONTROL, CURRENT, DDL, HISTORY, QUARANTINE, RAW, TableRef
from cdc_platform.steps.changelog import PREVIEW_ROWS, NormalizeResult
from cdc_platform.steps.current import MergeResult
from cdc_platform.steps.history import HistoryResult
from cdc_platform.steps.raw import IngestResult
from cdc_platform.timings import phase


@dataclass(frozen=True)
class Output:
    """One asset's materialization: its metadata, and for a daily-partitioned Delta table its
    location (``partitioned``), whose rows per date each partition's materialization gets."""

    key: dg.AssetKey
    metadata: dict[str, object]
    partitioned: str | None = None

    def result(self, context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """As the asset body of a run returns it (its partitions' row counts added)."""
        if self.partitioned:
            with phase("metadata.delta"):
                add_partition_row_counts(context, self.partitioned, self.key)
        return dg.MaterializeResult(asset_key=self.key, metadata=self.metadata)

    def materializations(self, dates: list[str]) -> list[dg.AssetMaterialization]:
        """As a continuous run logs it: one per date for a partitioned table."""
        if not self.partitioned:
            return [dg.AssetMaterialization(self.key, metadata=self.metadata)]
        with phase("metadata.delta"):
            counts = lake.partition_row_counts(self.partitioned)
        return [
            dg.AssetMaterialization(
                self.key,
                partition=date,
                metadata={**self.metadata, "dagster/partition_row_count": counts.get(date, 0)},
            )
            for date in dates
        ]


def landing_raw(warehouse: str, source: SourceConfig, result: IngestResult) -> Output:
    uri = TableRef(RAW, source.name).uri(warehouse)
    files = [{"name": f.name, "size": f.size, "mtime_ns": f.mtime_ns} for f in result.files]
    metadata = {
        "messages_by_date": result.messages,
        "files_ingested": len(result.files),
        "files": dg.MetadataValue.json(files),
        "dates_replaced": dg.MetadataValue.json(result.replaced_dates),
        **delta_metadata(uri),
    }
    return Output(asset_key(RAW, source.name), metadata, uri)


def kafka_raw(warehouse: str, source: SourceConfig, batch: KafkaIngestResult) -> Output:
    uri = TableRef(RAW, source.name).uri(warehouse)
    metadata = {
        "ingested_records": batch.records,
        "ingested_bytes": batch.bytes,
        "offsets": dg.MetadataValue.json(batch.offsets),
        "more_waiting": batch.bounded,
        **delta_metadata(uri),
    }
    return Output(asset_key(RAW, source.name), metadata, uri)


def changelog(
    warehouse: str,
    source: SourceConfig,
    tables: list[TableConfig],
    result: NormalizeResult,
    new_tables: list[str],
) -> list[Output]:
    """The change log and DDL log of each of ``tables``, the control log and the quarantine
    (``new_tables``: routed tables that have no assets yet)."""

    def output(layer: str, table: str | None, metadata: dict[str, object]) -> Output:
        uri = TableRef(layer, source.name, table).uri(warehouse)
        with phase("metadata.delta"):
            described = delta_metadata(uri)
        return Output(asset_key(layer, source.name, table), metadata | described, uri)

    outputs = []
    for table in tables:
        written = result.tables.get(table.name)
        fresh = freshness.changelog(warehouse, source.name, table.name)
        metadata = {
            "rows_by_op": dg.MetadataValue.json(written.ops if written else {}),
            # The run's messages of the whole source that went to quarantine instead.
            "quarantined": result.quarantined,
            **_event_time(written.max_event_time if written else None),
            **freshness_metadata(fresh),
            **({"preview": arrow_preview(written.sample)} if written else {}),
        }
        outputs.append(output(CHANGELOG, table.name, metadata))
    for table in tables:
        statements = result.ddl_by_table.get(table.name, 0)
        outputs.append(output(DDL, table.name, {"ddl_statements": statements}))
    control = {"control_messages": result.control, **_event_time(result.max_control_time)}
    outputs.append(output(CONTROL, None, control))
    quarantine = {
        "quarantined": result.quarantined,
        "quarantined_by_reason": dg.MetadataValue.json(result.quarantine_reasons),
        "messages": result.messages,
        "control_messages": result.control,
        "ddl_messages": result.ddl,
        "new_routed_tables": dg.MetadataValue.json(new_tables),
    }
    outputs.append(output(QUARANTINE, None, quarantine))
    return outputs


def routed_without_assets(tables: list[TableConfig], result: NormalizeResult) -> list[str]:
    """The tables ``result`` wrote that are not among ``tables`` (routed for the first time:
    their assets appear when the code location reloads)."""
    known = {t.name for t in tables}
    return sorted(t.qualified for t in result.tables.values() if t.name not in known)


def routed_without_assets_warning(names: list[str]) -> str:
    return (
        f"routed tables without assets yet: {', '.join(names)}; reload the code location "
        "(Reload definitions) to see their assets"
    )


def _event_time(value: datetime | None) -> dict[str, dg.MetadataValue]:
    return {"max_event_time": dg.MetadataValue.timestamp(value)} if value else {}


def current(
    warehouse: str,
    source: SourceConfig,
    table: TableConfig,
    merged: MergeResult,
) -> Output:
    with phase("metadata.preview"):
        shown = {"preview": current_preview(merged)} if lake.exists(merged.uri) else {}
    with phase("metadata.delta"):
        fresh = freshness.current(warehouse, source.name, table.name)
        described = delta_metadata(merged.uri)
    metadata = {
        "dagster/row_count": merged.rows,
        "tombstones": merged.deleted_rows,
        "merged_inserted": merged.inserted,
        "merged_updated": merged.updated,
        "made_live": merged.made_live,
        "made_deleted": merged.made_dead,
        "truncated_rows": merged.truncated,
        "tombstones_purged": merged.tombstones_purged,
        "changelog_version": merged.changelog_version,
        **freshness_metadata(fresh),
        **described,
        **shown,
    }
    return Output(asset_key(CURRENT, source.name, table.name), metadata)


def current_preview(merged: MergeResult) -> dg.MetadataValue:
    """Live rows of the files the merge wrote (of the table, when it built it whole), by key:
    the first of each file in turn (a current table's files are sorted by key), read without
    Spark."""
    files = lake.files(merged.uri) if merged.written is None else merged.written
    rows = lake.head(merged.uri, files, PREVIEW_ROWS, where=~pc.field(C.DELETED_COL))
    rows = rows.drop_columns([c for c in C.CURRENT_META if c in rows.column_names])
    key = lake.state(merged.uri).key or []
    return arrow_preview(rows.sort_by([(k, "ascending") for k in key]) if key else rows)


def history(source: SourceConfig, table: TableConfig, built: HistoryResult) -> Output:
    metadata = {
        "dagster/row_count": built.rows,
        "versions_written": built.versions_written,
        "versions_removed": built.versions_removed,
        "changelog_version": built.changelog_version,
        **delta_metadata(built.uri),
    }
    return Output(asset_key(HISTORY, source.name, table.name), metadata)
