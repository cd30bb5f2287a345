"""The frames the suites validate, built from the Delta tables with Spark functions only.

Each is narrow: what the rules look at, plus the columns that identify a failing row (key
columns, sequence, raw coordinates), so validating costs little next to the write it checks.
"""

from collections.abc import Iterator
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.formats import canonical as C

COORDINATES = list(C.RAW_COORDINATES)
KEY_PREFIX = "key__"


def _dates(df: DataFrame, dates: list[str] | None) -> DataFrame:
    return df if dates is None else df.where(F.col(lake.PARTITION_COLUMN).isin(*dates))


def _read(
    spark: SparkSession, uri: str, dates: list[str] | None, written: dict[str, list[str]] | None
) -> DataFrame | None:
    """A table's rows of ``dates`` (None: all), or with ``written`` (table -> data files a run
    added) just the rows that run wrote: checks then cost what the run wrote, not the day."""
    if written is None:
        df = lake.read(spark, uri)
        return None if df is None else _dates(df, dates)
    return lake.read(spark, uri, only_files=written.get(uri, []))


def changelog_frame(
    spark: SparkSession,
    warehouse: str,
    source: str,
    table: str,
    dates: list[str] | None,
    before_formats: list[str],
    written: dict[str, list[str]] | None = None,
) -> tuple[DataFrame, list[str]] | None:
    """The change-log rows of ``dates`` (None: all): op, images as presence flags, key columns
    as ``key__<col>``, sequence, event_time, source_format, ``before_expected`` (the format always
    carries an update's before image), raw coordinates. Returns (frame, key column names).
    ``written``: just the rows a run wrote (see ``_read``)."""
    uri = lake.TableRef(lake.CHANGELOG, source, table).uri(warehouse)
    df = _read(spark, uri, dates, written)
    if df is None:
        return None
    key = lake.state(uri).key or [f.name for f in df.schema["key"].dataType.fields]
    keys = [F.col("key")[k].alias(KEY_PREFIX + k) for k in key]
    frame = df.select(
        "op",
        F.when(F.col("before").isNotNull(), F.lit(True)).alias("before"),
        F.when(F.col("after").isNotNull(), F.lit(True)).alias("after"),
        *keys,
        "sequence",
        "event_time",
        "source_format",
        F.col("source_format").isin(*before_formats).alias("before_expected"),
        *_coordinates(),
    )
    return frame, [KEY_PREFIX + k for k in key]


def coordinate_key() -> Column:
    """One text value per raw message (null-safe, unlike a join on the six columns)."""
    return F.concat_ws(
        "\x1f", *[F.coalesce(F.col(c).cast("string"), F.lit("\x00")) for c in COORDINATES]
    )


def _outputs(
    spark: SparkSession,
    warehouse: str,
    source: str,
    dates: list[str] | None,
    written: dict[str, list[str]] | None,
) -> Iterator[tuple[str, DataFrame]]:
    """(outcome, its rows' raw coordinates) for every table a raw message can end up in."""
    layers = [
        ("change", lake.tables_under(warehouse, lake.CHANGELOG, source)),
        ("control", [lake.TableRef(lake.CONTROL, source).uri(warehouse)]),
        ("ddl", lake.tables_under(warehouse, lake.DDL, source)),
        ("quarantine", [lake.TableRef(lake.QUARANTINE, source).uri(warehouse)]),
    ]
    for outcome, uris in layers:
        for uri in uris:
            df = _read(spark, uri, dates, written)
            # The columns from the log: asking Spark Connect would be a round trip.
            if df is not None and set(COORDINATES) <= set(lake.arrow_schema(uri).names):
                yield outcome, df.select(*_coordinates())


def _coordinates() -> list[Column]:
    """The raw coordinates, the partition date as text (as the frame shows it)."""
    partition = lake.PARTITION_COLUMN
    return [F.col(c).cast("string") if c == partition else F.col(c) for c in COORDINATES]


def reconciliation_frame(
    spark: SparkSession,
    warehouse: str,
    source: str,
    dates: list[str] | None,
    written: dict[str, list[str]] | None = None,
) -> DataFrame | None:
    """One row per raw message of ``dates``: its coordinates and ``outcome``, the first of
    change, control, ddl, quarantine whose table holds its coordinates (null: none does).

    Raw coordinates, not counts: a Canal message yields several change records, and a DataWorks
    or DataHub update pair yields one change record (the after half's coordinates) and one
    control record (the consumed before half's). ``written``: just the raw messages a run read
    and the outputs it wrote (see ``_read``).

    Raw and the outputs in one aggregate by coordinates (one shuffle; a join with raw would be
    another): each group says how many raw messages have them, and the first outcome."""
    raw = _read(spark, lake.TableRef(lake.RAW, source).uri(warehouse), dates, written)
    if raw is None:
        return None
    # Each output's rows by the rank of their outcome (null: a raw message), so the aggregate
    # keeps numbers only (Spark's hash aggregate; a text value in it makes a sort aggregate).
    rank = {outcome: i for i, outcome in enumerate(("change", "control", "ddl", "quarantine"))}
    no_rank = F.lit(None).cast("int")
    outputs = [
        df.withColumn("__rank", F.lit(rank[outcome]))
        for outcome, df in _outputs(spark, warehouse, source, dates, written)
    ]
    rows = reduce(
        DataFrame.unionByName, outputs, raw.select(*_coordinates(), no_rank.alias("__rank"))
    )
    # Grouped by the coordinates themselves: null equals null there, as it must.
    groups = rows.groupBy(*COORDINATES).agg(
        F.count_if(F.col("__rank").isNull()).alias("__messages"), F.min("__rank").alias("__rank")
    )
    # Null for a null rank. Not element_at: on a literal array Spark 4.3 gives the last element.
    outcome = F.get(F.array(*[F.lit(o) for o in rank]), F.col("__rank"))
    # A row per raw message (as a join with raw would give), none for an output's rows alone.
    return (
        groups.where(F.col("__messages") > 0)
        .select(
            F.explode(F.array_repeat(F.lit(0), F.col("__messages").cast("int"))).alias("__n"),
            *COORDINATES,
            outcome.alias("outcome"),
        )
        .drop("__n")
    )


def current_frame(
    spark: SparkSession,
    warehouse: str,
    source: str,
    table: str,
    key: list[str],
    written: list[str] | None = None,
    changes: list[str] | None = None,
) -> DataFrame | None:
    """The current table, with ``__key`` (the key as JSON text) and ``__exposed`` (the row is in
    the exposed state that readers get from ``steps.current.current_rows``).

    ``written``: the data files a merge committed; then only the rows of those files and of the
    files whose key range overlaps theirs (``lake.files_sharing_keys``, from the log), which is
    where a merge could have left a key twice; with ``changes`` (the change-log files the merge
    read), just the rows of their keys among those. The check costs what the merge changed, not
    the table (a rewritten file is read, not validated row by row)."""
    uri = lake.TableRef(lake.CURRENT, source, table).uri(warehouse)
    if not lake.exists(uri):
        return None
    unkeyed = reduce(lambda a, b: a | b, [F.col(k).isNull() for k in key])
    narrowed = written is not None and changes is not None  # to the rows of the changed keys
    columns = [*key, C.SEQUENCE_COL, C.DELETED_COL]
    if written is None:
        df = lake.read(spark, uri, columns=columns)
    else:
        files = lake.files_sharing_keys(uri, written, key[0])
        df = lake.read(spark, uri, only_files=files, columns=columns)
    df = df.select(*columns, F.lit(False).alias("__change"))
    if narrowed:
        log = lake.TableRef(lake.CHANGELOG, source, table).uri(warehouse)
        changed = lake.read(spark, log, only_files=changes, columns=["key"])
        keys = changed.where(F.col("key").isNotNull()).select(
            *[F.col("key")[k].alias(k) for k in key], F.lit(True).alias("__change")
        )
        # Only the rows of those keys (and those with a null key part) go into the window: a
        # batch of keys spread over the table would otherwise shuffle every row it read.
        wanted = df.join(keys.select(*key), key, "left_semi").unionByName(df.where(unkeyed))
        df = wanted.unionByName(keys, allowMissingColumns=True)
    # One window over the key (one shuffle; not a distinct and joins) says whether the key has a
    # live row in the table, so is exposed (a key with a null part never is, as a join on the
    # key would say), and whether the merge changed it (a row of ``keys`` is in it).
    by_key = Window.partitionBy(*key)
    change = F.col("__change")
    live = F.max(F.when(~change, (~F.col(C.DELETED_COL)).cast("int"))).over(by_key) == 1
    frame = df.select(
        *key,
        C.SEQUENCE_COL,
        C.DELETED_COL,
        F.to_json(F.struct(*key)).alias("__key"),
        F.when(unkeyed, F.lit(False)).otherwise(F.coalesce(live, F.lit(False))).alias("__exposed"),
        change,
        (F.max(change.cast("int")).over(by_key) == 1).alias("__changed"),
    )
    if narrowed:
        # The table's rows of the changed keys, and those with a null key part: they are what
        # pk_not_null looks for.
        frame = frame.where(~change & (F.col("__changed") | unkeyed))
    return frame.drop("__change", "__changed")
