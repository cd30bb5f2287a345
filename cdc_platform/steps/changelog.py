"""Change-log step: raw -> each table's change log, the DDL and control logs, the quarantine.

The change log appends incremental batches (``normalize_new``: the raw batches not normalized
yet; each commit records the raw version it reflects, so a rerun after a crash skips what is
done) or replaces the ``ingest_date`` partitions of the run's dates (``normalize_source``:
backfills of any source)."""

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.formats import canonical as C
from cdc_platform.lake import landing_files
from cdc_platform.normalize import Mispredicted, Normalized, normalize, routed_name
from cdc_platform.timings import phase

PREVIEW_ROWS = 10
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(kw_only=True)
class TableChanges:
    """What normalization wrote for one table."""

    name: str
    qualified: str
    key: list[str]
    ops: dict[str, int]
    version: int | None
    max_event_time: datetime | None = None
    sample: pa.Table | None = None  # the first rows written, for previews


@dataclass
class NormalizeResult:
    messages: int = 0
    quarantined: int = 0
    control: int = 0
    ddl: int = 0
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    tables: dict[str, TableChanges] = field(default_factory=dict)
    ddl_by_table: dict[str, int] = field(default_factory=dict)
    max_control_time: datetime | None = None  # newest heartbeat / transaction marker
    # What the step read and wrote, per table (raw and every output): the data files it added,
    # for checks of just this run's batch. None: a run that replaced whole dates.
    written: dict[str, list[str]] | None = None

    def add(self, other: "NormalizeResult") -> None:
        """Fold in a later step's result (an incremental run that finished a crashed one)."""
        self.messages += other.messages
        self.quarantined += other.quarantined
        self.control += other.control
        self.ddl += other.ddl
        for reason, n in other.quarantine_reasons.items():
            self.quarantine_reasons[reason] = self.quarantine_reasons.get(reason, 0) + n
        for name, n in other.ddl_by_table.items():
            self.ddl_by_table[name] = self.ddl_by_table.get(name, 0) + n
        for name, t in other.tables.items():
            if mine := self.tables.get(name):
                t.ops = {op: mine.ops.get(op, 0) + t.ops.get(op, 0) for op in {*mine.ops, *t.ops}}
                t.max_event_time = max(
                    filter(None, [mine.max_event_time, t.max_event_time]), default=None
                )
            self.tables[name] = t
        times = filter(None, [self.max_control_time, other.max_control_time])
        self.max_control_time = max(times, default=None)


def normalize_source(
    spark: SparkSession,
    warehouse: str,
    source: SourceConfig,
    dates: list[str],
) -> NormalizeResult:
    """Raw partitions ``dates`` -> replace those partitions of each table's change log, DDL log,
    the control log and the quarantine (files sources; backfills of any source). For a Kafka
    source the raw batches not normalized yet are appended first, so afterwards every output
    reflects the same raw version and the next incremental run starts from there."""
    raw_uri = lake.TableRef(lake.RAW, source.name).uri(warehouse)
    version = lake.version(raw_uri)
    if version is None:
        return NormalizeResult()
    if source.transport == "kafka":
        normalize_new(spark, warehouse, source, upto=version)
    raw = lake.read(spark, raw_uri, only_files=lake.files(raw_uri, version))
    raw = raw.where(F.col("ingest_date").isin(*dates))
    return _normalize(spark, warehouse, source, raw, version, dates)


def normalize_new(
    spark: SparkSession,
    warehouse: str,
    source: SourceConfig,
    upto: int | None = None,
) -> NormalizeResult:
    """Raw batches added since the last run -> appended to every output (a sensor run of any
    source: raw only grows between them), so a run costs what arrived, not the whole day.

    Exactly once: each output commit records the raw version it reflects (``lake.
    append_normalized``) and the quarantine is written last. A run that died between outputs
    left some at a newer version than the quarantine: that same range is finished first (the
    outputs that have it skip it), then the rest."""
    raw_uri = lake.TableRef(lake.RAW, source.name).uri(warehouse)
    upto = lake.version(raw_uri) if upto is None else upto
    result = NormalizeResult()
    if upto is None:
        return result
    finished = lake.normalized_raw_version(
        lake.TableRef(lake.QUARANTINE, source.name).uri(warehouse)
    )
    outputs = _normalize_outputs(warehouse, source)
    first = finished
    started = max(
        (v for uri in outputs if (v := lake.normalized_raw_version(uri)) is not None),
        default=None,
    )
    steps = []
    if started is not None and (finished is None or started > finished):
        steps.append((finished, started))  # finish the interrupted run first
        finished = started
    if finished is None or upto > finished:
        steps.append((finished, upto))
    before = {uri: lake.version(uri) for uri in outputs}
    for low, high in steps:
        with phase("normalize.find_raw"):
            raw = lake.read(spark, raw_uri, only_files=lake.files_between(raw_uri, low, high))
            # Re-ingested landing files (grown, rewritten): their old change records go first.
            replaced = landing_files.replaced_names(raw_uri, low, high)
        with phase("normalize.delete_replaced"):
            for uri in _normalize_outputs(warehouse, source) if replaced else []:
                _delete_landing_rows(spark, uri, replaced, high)
        result.add(_normalize(spark, warehouse, source, raw, high, None))
    with phase("normalize.written_files"):
        result.written = {raw_uri: lake.files_between(raw_uri, first, upto)} if steps else {}
        for uri in _normalize_outputs(warehouse, source):
            result.written[uri] = lake.files_between(uri, before.get(uri), lake.version(uri))
    return result


def _delete_landing_rows(
    spark: SparkSession, uri: str, names_by_date: dict[str, list[str]], raw_version: int
) -> int:
    """Delete the rows of these landing files (date -> ``file`` names) from a normalize output
    that does not reflect ``raw_version`` yet: the rows of re-ingested files go before their
    new rows are appended. Skipped by an output that reflects it (a rerun after a crash must
    not delete what the crashed run appended). Returns rows deleted."""
    done = lake.normalized_raw_version(uri)
    if (done is not None and done >= raw_version) or "file" not in lake.arrow_schema(uri).names:
        return 0
    gone = functools.reduce(
        lambda a, b: a | b,
        [
            (F.col(lake.PARTITION_COLUMN) == F.lit(date).cast("date")) & F.col("file").isin(*names)
            for date, names in sorted(names_by_date.items())
        ],
    )
    return lake.delete_rows(spark, uri, gone, only_dates=sorted(names_by_date))


def _normalize_outputs(warehouse: str, source: SourceConfig) -> list[str]:
    """Every table a normalize step of ``source`` writes (that exists)."""
    return [
        *lake.tables_under(warehouse, lake.CHANGELOG, source.name),
        *lake.tables_under(warehouse, lake.DDL, source.name),
        *[
            uri
            for layer in (lake.CONTROL, lake.QUARANTINE)
            if lake.exists(uri := lake.TableRef(layer, source.name).uri(warehouse))
        ],
    ]


def _normalize(
    spark: SparkSession,
    warehouse: str,
    source: SourceConfig,
    raw: DataFrame,
    raw_version: int,
    dates: list[str] | None,
) -> NormalizeResult:
    """Parse ``raw`` and write each output: replacing the partitions ``dates``, or appending
    (``dates`` None). Every commit records ``raw_version``. Spark writes every output; the
    driver gets counts, the newest event times and a few preview rows."""

    def write(
        uri: str,
        data: DataFrame,
        state: lake.TableState | None = None,
        empty: bool = False,
        verify: Callable[[], None] | None = None,
    ) -> int | None:
        """``empty``: ``data`` is known to have no rows (a small batch mostly has no control
        messages, DDL or rejects): the commit then records the raw version (and removes the
        replaced dates' files) without a Spark job. ``verify``: called before the commit."""
        if dates is not None:
            return lake.overwrite_partitions(
                data, uri, dates, state, raw_version, empty=empty, verify=verify
            )
        return lake.append_normalized(data, uri, raw_version, state, empty=empty, verify=verify)

    def write_changelogs(normalized: Normalized) -> dict[str, TableChanges]:
        direct = normalized.counts is not None
        tables = {}
        for plan, data in normalized.tables:
            uri = lake.TableRef(lake.CHANGELOG, source.name, plan.name).uri(warehouse)
            state = lake.TableState(key=plan.key, qualified=plan.qualified)
            stats = Observation()
            with phase("write.changelog"):
                version = write(
                    uri, data.observe(stats, *_change_stats_columns()), state,
                    verify=normalized.confirm if direct else None,
                )  # fmt: skip
            if direct and version is None:
                # The log has this batch already (a rerun after a crash): what the batch holds
                # besides is learnt the staged way.
                raise Mispredicted("the change log reflects the batch already")
            with phase("normalize.changelog_stats"):
                ops, newest = _change_stats(stats if version is not None else None, data)
            with phase("metadata.preview"):
                # The rows just committed, read from their files without Spark: a direct
                # write's ``data`` is the parse of the raw messages, which would run again.
                if version is not None:
                    added = lake.files_between(uri, version - 1 if version else None, version)
                    sample = lake.head(uri, added, PREVIEW_ROWS)
                else:
                    sample = data.limit(PREVIEW_ROWS).toArrow()
            tables[plan.name] = TableChanges(
                name=plan.name,
                qualified=plan.qualified,
                key=plan.key,
                ops=ops,
                version=version,
                max_event_time=_utc(newest),
                sample=sample,
            )
        return tables

    result = NormalizeResult()
    staging = lake.Staging(warehouse)
    try:
        known = lake.changelog_facts(warehouse, source.name)
        # A batch whose first messages are all one table's changes is written straight from the
        # parse; if it holds more, its files are discarded and it is normalized staged.
        normalized = normalize(raw, source, known, staging, direct=True)
        try:
            result.tables = write_changelogs(normalized)
        except Mispredicted:
            normalized = normalize(raw, source, known, staging)
            result.tables = write_changelogs(normalized)
        result.messages = normalized.messages
        result.control = normalized.kinds.get(C.KIND_CONTROL, 0)
        result.ddl = normalized.kinds.get(C.KIND_DDL, 0)
        if dates is not None:
            # A table the reprocessed dates no longer hold keeps no stale rows for them.
            written = {plan.name for plan, _ in normalized.tables}
            for uri in lake.tables_under(warehouse, lake.CHANGELOG, source.name):
                if (name := Path(uri).name) not in written:
                    st = lake.state(uri)
                    version = write(uri, lake.read(spark, uri, only_files=[]), empty=True)
                    result.tables[name] = TableChanges(
                        name=name,
                        qualified=st.qualified or name,
                        key=st.key,
                        ops={},
                        version=version,
                    )
        if result.ddl or dates is not None:  # appending no statements writes no DDL log
            with phase("write.ddl"):
                result.ddl_by_table = _write_ddl_log(
                    warehouse, source, normalized.ddl(), result.ddl, write, dates is None
                )
        control = normalized.control()
        with phase("write.control"):
            uri = lake.TableRef(lake.CONTROL, source.name).uri(warehouse)
            stats = Observation()  # the newest event time, observed by the write
            observed = control.observe(stats, _newest("event_time").alias("newest"))
            version = write(uri, observed, empty=not result.control)
            if result.control:
                # Queried only when nothing was written (the log had the batch: a rerun).
                newest = (
                    stats.get["newest"]
                    if version is not None
                    else control.agg(_newest("event_time")).first()[0]
                )
                result.max_control_time = _utc(newest)
        # Last: its recorded raw version is where the next incremental run starts.
        with phase("write.quarantine"):
            reasons = []
            if not normalized.quarantine_empty:
                reasons = normalized.quarantine.groupBy("reason").count().collect()
            uri = lake.TableRef(lake.QUARANTINE, source.name).uri(warehouse)
            write(uri, normalized.quarantine, empty=not reasons)
        result.quarantine_reasons = {r["reason"]: r["count"] for r in reasons}
        result.quarantined = sum(result.quarantine_reasons.values())
    finally:
        staging.release()
    return result


def _change_stats_columns() -> list[Column]:
    """A change log's batch counted by op, and its newest event time (epoch microseconds)."""
    return [
        *[F.count_if(F.col("op") == op).alias(op) for op in C.OPS],
        _newest("event_time").alias("newest"),
    ]


def _change_stats(stats: Observation | None, data: DataFrame) -> tuple[dict[str, int], int | None]:
    """Changes by op and the newest event time (epoch microseconds) of ``data``: observed by
    its write (``stats``), with no job of their own, or counted by a query when nothing was
    written (the output had the batch already: a rerun after a crash)."""
    got = stats.get if stats is not None else data.agg(*_change_stats_columns()).first().asDict()
    return {op: int(got[op]) for op in C.OPS if got[op]}, got["newest"]


def _newest(column: str) -> Column:
    """The newest timestamp as microseconds since the epoch: a value that means the same
    whatever time zone the driver's Python runs in."""
    return F.max(F.unix_micros(column))


def _utc(micros: int | None) -> datetime | None:
    return None if micros is None else _EPOCH + timedelta(microseconds=micros)


def _write_ddl_log(
    warehouse: str,
    source: SourceConfig,
    ddl: DataFrame,
    statements: int,
    write: Callable[..., int | None],
    appending: bool,
) -> dict[str, int]:
    """Each table's DDL statements (``statements`` in all) into ddl/<source>/<table>. Replacing
    dates rewrites every DDL log of the source, so a reprocessed date never keeps stale rows;
    appending skips tables without new statements."""
    # A few rows: one per table.
    found = ddl.groupBy("qualified_table").count().collect() if statements else []
    qualified: dict[str, list[str | None]] = {}
    counts: dict[str, int] = {}
    for r in found:
        name = routed_name(r["qualified_table"], source)
        qualified.setdefault(name, []).append(r["qualified_table"])
        counts[name] = counts.get(name, 0) + r["count"]
    existing = (
        set()
        if appending
        else {Path(u).name for u in lake.tables_under(warehouse, lake.DDL, source.name)}
    )
    for name in sorted(existing | set(qualified)):
        names = qualified.get(name, [])
        mine = F.col("qualified_table").isin(*[q for q in names if q is not None])
        if None in names:
            mine = mine | F.col("qualified_table").isNull()
        rows = ddl.where(mine if names else F.lit(False)).drop("qualified_table")
        counts.setdefault(name, 0)
        write(
            lake.TableRef(lake.DDL, source.name, name).uri(warehouse), rows, empty=not counts[name]
        )
    return counts
