"""Change log -> the rows to merge into the current-state table (one per key, the newest).

Ordering is by ``sequence`` only, never by arrival, so batches may come late, twice or shuffled.
A delete becomes a tombstone row (``__deleted``) that keeps its sequence: a late, older change for
that key then loses the sequence comparison in the MERGE instead of resurrecting the row. A
truncate drops everything older than its sequence.
"""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_platform.formats import canonical as C

ROW_OPS = (C.INSERT, C.UPDATE, C.DELETE, C.READ)
# Merge-only column: which columns a row carries when the batch has no full image of it.
PARTIAL_COL = "__columns"
# Working columns of ``latest_per_key``, consumed by ``relative_to``: the sequence of the newest
# event carrying each non-key column, and of the newest full image (or delete) of the key.
_CARRIED = "__carried_at"
_FULL = "__full_at"
# What ``relative_to`` keeps of the table's row of each key (``held``), both null when the table
# holds none: its sequence, and whether it is live. The merge's live-row balance reads them.
HELD_SEQ = "__held_seq"
HELD_LIVE = "__held_live"
HELD = (HELD_SEQ, HELD_LIVE)


def latest_truncate(changelog: DataFrame) -> str | None:
    """The newest truncate's sequence in a change-log batch (None if the batch has none)."""
    row = changelog.where(F.col("op") == C.TRUNCATE).agg(F.max("sequence")).first()
    return row[0] if row else None


def latest_per_key(
    changelog: DataFrame,
    key: list[str],
    truncated_before: str | None,
    ignore_null_updates: bool = False,
) -> DataFrame:
    """Current-table rows for the keys the batch touches: user columns, ``__*`` metadata, and
    ``__columns`` (null when the batch gives the whole row; otherwise the columns it carries,
    the others keeping their values in the table). With ``ignore_null_updates`` an update
    carries only its non-null columns."""
    changes = changelog.where(F.col("op").isin(*ROW_OPS))
    if truncated_before:
        changes = changes.where(F.col("sequence") > F.lit(truncated_before))
    image_type = changelog.schema["after"].dataType
    columns = [f.name for f in image_type.fields]
    before_key = F.struct(*[F.col("before")[k].alias(k) for k in key])
    after_key = F.struct(*[F.col("after")[k].alias(k) for k in key])
    before_key_complete = F.col("before").isNotNull()
    for k in key:
        before_key_complete = before_key_complete & F.col("before")[k].isNotNull()
    no_columns = F.lit(None).cast("array<string>")
    present = F.col("after_columns")
    if ignore_null_updates:
        non_null = F.array_compact(
            F.array(*[F.when(F.col("after")[c].isNotNull(), F.lit(c)) for c in columns])
        )
        present = F.when(
            F.col("op") == C.UPDATE, F.coalesce(F.array_intersect(present, non_null), non_null)
        ).otherwise(present)
    # An update that changes the key moves the row: the old key gets a tombstone.
    # Internal columns are named "__*" so that no user column (an "op", a "sequence") can be
    # mistaken for them when the aggregation below names its outputs after user columns.
    moved = changes.where(
        (F.col("op") == C.UPDATE) & before_key_complete & (before_key != after_key)
    ).select(
        before_key.alias("__k"), F.lit(None).cast(image_type).alias("__image"),
        no_columns.alias("__present"), F.col("sequence").alias("__seq"),
        F.lit(C.DELETE).alias("__op"), F.col("event_time").alias("__time"),
    )  # fmt: skip
    rows = changes.select(
        F.col("key").alias("__k"),
        F.when(F.col("op") != C.DELETE, F.col("after")).alias("__image"),
        F.when(F.col("op") != C.DELETE, present).alias("__present"),
        F.col("sequence").alias("__seq"), F.col("op").alias("__op"),
        F.col("event_time").alias("__time"),
    ).unionByName(moved)  # fmt: skip

    def carries(c: str) -> F.Column:
        # A partial image carries only some columns (a full image or a delete all of them).
        return F.col("__present").isNull() | F.array_contains("__present", c)

    def newest_carrying(c: str) -> F.Column:
        # Each column takes its value from the newest event that carries it.
        return F.max_by(F.col("__image")[c], F.when(carries(c), F.col("__seq"))).alias(c)

    def carried_at(c: str) -> F.Column:
        return F.max(F.when(carries(c), F.col("__seq"))).alias(c)

    full_at = F.max(F.when(F.col("__present").isNull(), F.col("__seq")))
    values = [c for c in columns if c not in key]
    newest = rows.groupBy("__k").agg(
        *[newest_carrying(c) for c in values],
        F.max_by(F.struct("__seq", "__op", "__time", "__present"), "__seq").alias("__n"),
        F.when(full_at.isNull(), F.array_distinct(F.flatten(F.collect_list("__present")))).alias(
            PARTIAL_COL
        ),
        (F.struct(*map(carried_at, values)) if values else F.lit(None)).alias(_CARRIED),
        full_at.alias(_FULL),
    )
    return newest.select(
        *[(F.col("__k")[c] if c in key else F.col(c)).alias(c) for c in columns],
        F.col("__n.__seq").alias(C.SEQUENCE_COL),
        F.col("__n.__op").alias(C.OP_COL),
        F.col("__n.__time").alias(C.EVENT_TIME_COL),
        (F.col("__n.__op") == C.DELETE).alias(C.DELETED_COL),
        F.col("__n.__present").isNotNull().alias(C.PARTIAL_NEWEST_COL),
        PARTIAL_COL,
        _CARRIED,
        _FULL,
    )


def relative_to(
    newest: DataFrame, current: DataFrame, key: list[str], small: bool = False
) -> DataFrame:
    """``latest_per_key``'s rows, each with ``__columns`` set to what it may change in the
    current table: everything (null) when the batch has a full image (or delete) newer than
    the current row, else only the columns some event newer than the current row carries. A
    batch's older full image must not overwrite what a newer current row holds, even when a
    newer partial image follows it (TOAST, SharePlex, ignored nulls). Keys not in ``current``
    keep the batch's own ``__columns``. ``current``: the table's rows of the batch's keys
    (``lake.rows_of_keys``); ``small``: they are few enough to be broadcast. Each row keeps
    what its key's row in ``current`` was (the ``HELD`` columns)."""
    target = held(current, key)
    if small:
        target = F.broadcast(target)
    at = F.col(HELD_SEQ)
    carried = newest.schema[_CARRIED].dataType
    values = [f.name for f in carried.fields] if hasattr(carried, "fields") else []
    newer = F.array_compact(
        F.array(
            *[F.lit(k) for k in key],
            *[F.when(F.col(_CARRIED)[c] > at, F.lit(c)) for c in values],
        )
    )
    columns = (
        F.when(at.isNull(), F.col(PARTIAL_COL))
        .when(F.col(_FULL) > at, F.lit(None).cast("array<string>"))
        .otherwise(newer)
    )
    return without_working_columns(
        newest.join(target, key, "left").withColumn(PARTIAL_COL, columns)
    )


def held(current: DataFrame, key: list[str]) -> DataFrame:
    """The ``HELD`` columns of the table's rows ``current``, by key (to join ``left``)."""
    return current.select(
        *key,
        F.col(C.SEQUENCE_COL).alias(HELD_SEQ),
        (~F.col(C.DELETED_COL)).alias(HELD_LIVE),
    )


def without_working_columns(newest: DataFrame) -> DataFrame:
    """``latest_per_key``'s rows without the working columns ``relative_to`` consumes."""
    return newest.drop(_CARRIED, _FULL)


def touching(changelog: DataFrame, keys: DataFrame, key: list[str]) -> DataFrame:
    """The change records of ``keys`` (a frame of key columns): those on the key, and key
    changes moving away from it."""
    on_key = F.struct(*[F.col("key")[k].alias(k) for k in key])
    before_key = F.struct(*[F.col("before")[k].alias(k) for k in key])
    wanted = keys.select(F.struct(*key).alias("__wanted"))
    moves = changelog.where(before_key != on_key)  # null-safe enough: no before, no move
    return changelog.join(wanted, on_key == F.col("__wanted"), "left_semi").unionByName(
        moves.join(wanted, before_key == F.col("__wanted"), "left_semi")
    )
