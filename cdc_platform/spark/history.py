"""Change log -> SCD type 2 history: one row per version of each key (Databricks AUTO CDC style).

A key's events are ordered by ``sequence`` only, so the result depends on the set of events and
never on arrival: callers recompute a key's whole history from the whole change log, and late,
repeated or shuffled batches give the history of one in-order replay. Events all newer than a
key's old ones may instead follow its open version (``seed_events``).

Everything is window functions over one partitioning (the key) and one order (the sequence):
Spark shuffles and sorts once, with no Python per row.
"""

import functools
from collections import Counter

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from cdc_platform.formats import canonical as C

START_AT = "__start_at"  # sequence of the event that opened the version
END_AT = "__end_at"  # sequence of the event that closed it (null: the key's last version)
START_TIME = "__start_time"
END_TIME = "__end_time"
IS_CURRENT = "__is_current"
IS_DELETED = "__is_deleted"  # opened by a delete, a truncate or the key moving away
OP = "__op"  # op of the opening event
HISTORY_META = (START_AT, END_AT, START_TIME, END_TIME, IS_CURRENT, IS_DELETED, OP)

_ROW_OPS = (C.INSERT, C.UPDATE, C.DELETE, C.READ)
_EVENT_FIELDS = ("__k", "__seq", "__time", "__op", "__del", "__image", "__present")


def touched_keys(changelog: DataFrame, key: list[str]) -> DataFrame:
    """The keys (one struct column ``key``) whose history events in ``changelog`` can change:
    each change's key and, for a key change, the key it moved away from."""
    moved = F.when(_complete(key), _before_key(changelog, key))
    # array_compact, not a filter with a lambda: Spark's generated code names a lambda's
    # variable, which PySpark numbers anew each time, so each micro-batch compiled it again.
    both = F.array_compact(F.array(F.col("key"), moved))
    return changelog.select(F.explode(both).alias("key"))


def truncate_counts(
    changelog: DataFrame, removed: DataFrame | None = None
) -> Counter[tuple[str, int | None]]:
    """How often each truncate, (sequence, event time in epoch microseconds), is in
    ``changelog``, less how often in ``removed``: one job without a shuffle (truncates are
    rare, so their rows are few)."""
    sides = [(changelog, 1)] + ([(removed, -1)] if removed is not None else [])
    rows = functools.reduce(
        DataFrame.unionByName,
        [
            frame.where(F.col("op") == C.TRUNCATE).select(
                "sequence", F.unix_micros("event_time").alias("us"), F.lit(sign).alias("n")
            )
            for frame, sign in sides
        ],
    ).collect()
    counts: Counter[tuple[str, int | None]] = Counter()
    for r in rows:
        counts[(r["sequence"], r["us"])] += r["n"]
    return counts


def truncates_of(counts: Counter[tuple[str, int | None]]) -> list[tuple[str, int | None]]:
    """The truncates present (``truncate_counts`` above zero), by sequence."""
    return sorted(t for t, n in counts.items() if n > 0)


def history_rows(
    changelog: DataFrame,
    key: list[str],
    tracked: list[str],
    ignore_null_updates: bool = False,
    keys: DataFrame | None = None,
    truncates: list[tuple[str, int | None]] | None = None,
    seeds: DataFrame | None = None,
) -> DataFrame:
    """History rows of the keys in ``changelog`` (or only of ``keys``, a ``touched_keys`` frame):
    user columns, then ``HISTORY_META``. ``changelog`` must hold every event of those keys, or
    every event newer than their ``seeds`` (``seed_events``: a key's open version, standing in
    for the events before); ``tracked``: the columns whose changes open a new version;
    ``truncates``: the change log's ``truncates_of`` (collected here when not given)."""
    columns = [f.name for f in changelog.schema["after"].dataType.fields]
    values = [c for c in columns if c not in key]
    tracked_idx = [i for i, c in enumerate(values) if c in tracked]
    if truncates is None:
        truncates = truncates_of(truncate_counts(changelog))
    events = _events(changelog, key, keys, truncates)
    if seeds is not None:
        events = events.unionByName(seeds)
    # Every window partitions by key and orders by sequence: Spark shuffles and sorts once.
    # Until duplicates are dropped, a fixed tie-break makes the pick among them stable.
    tie = Window.partitionBy("__k").orderBy("__seq", "__op", "__image", "__present")
    w = Window.partitionBy("__k").orderBy("__seq")
    upto = Window.unboundedPreceding, Window.currentRow

    events = events.select(
        "*",
        (F.sum(_int("__del")).over(tie.rowsBetween(*upto)) - _int("__del")).alias("__life"),
        F.lag("__seq").over(tie).alias("__prev_seq"),
        F.lag("__del").over(tie).alias("__prev_del"),
    )

    # Each column takes the newest value carried since the key's last delete (a re-inserted row
    # starts afresh; a delete carries nothing, so its version keeps the values before deletion).
    # The struct tells a carried null from "not carried".
    def value(c: str) -> Column:
        tagged = F.struct(F.col("__life").alias("life"), F.col("__image")[c].alias("v"))
        last = F.last(F.when(_carries(c, ignore_null_updates), tagged), ignorenulls=True)
        newest = last.over(tie.rowsBetween(*upto))
        return F.when(newest["life"] == F.col("__life"), newest["v"])

    state = events.select(
        "__k", "__seq", "__time", "__op", "__del", "__prev_seq", "__prev_del",
        *[value(c).alias(f"__v{i}") for i, c in enumerate(values)],
    ).where(
        # The same event delivered twice counts once; a delete of a key that is not live (its
        # first event, or right after a delete) adds nothing.
        F.coalesce(F.col("__prev_seq") != F.col("__seq"), F.lit(True))
        & ~(F.col("__del") & F.coalesce("__prev_del", F.lit(True)))
    )  # fmt: skip

    # A version opens at a delete, after one (or at the first event), or when a tracked column
    # changes; other events update the open version in place (it keeps the newest values).
    opens = F.col("__del") | F.coalesce(F.lag("__del").over(w), F.lit(True))
    for i in tracked_idx:
        opens = opens | ~F.col(f"__v{i}").eqNullSafe(F.lag(f"__v{i}").over(w))
    state = state.withColumn("__opens", opens)
    # The last event of each version gives its row; the next event (which opens the next
    # version) closes it. A deleted version is a single event: its delete.
    start = F.last(F.when(F.col("__opens"), F.struct("__seq", "__time", "__op")), ignorenulls=True)
    state = state.select(
        "*",
        start.over(w.rowsBetween(*upto)).alias("__start"),
        F.lead("__opens").over(w).alias("__next_opens"),
        F.lead("__seq").over(w).alias("__next_seq"),
        F.lead("__time").over(w).alias("__next_time"),
    )
    value_of = {c: F.col(f"__v{i}") for i, c in enumerate(values)}
    return state.where(F.coalesce("__next_opens", F.lit(True))).select(
        *[(F.col("__k")[c] if c in key else value_of[c]).alias(c) for c in columns],
        F.col("__start.__seq").alias(START_AT),
        F.col("__next_seq").alias(END_AT),
        F.col("__start.__time").alias(START_TIME),
        F.col("__next_time").alias(END_TIME),
        F.col("__next_seq").isNull().alias(IS_CURRENT),
        F.col("__del").alias(IS_DELETED),
        F.col("__start.__op").alias(OP),
    )


def seed_events(versions: DataFrame, changelog: DataFrame, key: list[str]) -> DataFrame:
    """One event per open, live history row of ``versions``: at the sequence and time that
    opened it, with its values as a whole image. Followed by events all newer than the key's
    old ones, it gives the versions those old events and the new ones give (``history_rows``):
    the values carried so far are the open version's. A key whose last version is a delete
    has no seed (a delete first adds nothing)."""
    after = changelog.schema["after"].dataType
    have = set(versions.columns)
    image = F.struct(
        *[
            (F.col(f"`{f.name}`") if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in after.fields
        ]
    )
    return versions.where(F.col(IS_CURRENT) & ~F.col(IS_DELETED)).select(
        _event(
            F.struct(*[F.col(f"`{k}`") for k in key]).cast(changelog.schema["key"].dataType),
            F.col(START_AT), F.col(START_TIME), F.col(OP), F.lit(False), image,
            F.lit(None).cast("array<string>"),
        ).alias("e")
    ).select("e.*")  # fmt: skip


def _int(name: str) -> Column:
    return F.col(name).cast("int")


def _before_key(changelog: DataFrame, key: list[str]) -> Column:
    struct = F.struct(*[F.col("before")[k].alias(k) for k in key])
    return struct.cast(changelog.schema["key"].dataType)


def _complete(key: list[str]) -> Column:
    """An update whose before image names a whole key other than its after key: a key change."""
    cond = (F.col("op") == C.UPDATE) & F.col("before").isNotNull()
    for k in key:
        cond = cond & F.col("before")[k].isNotNull()
    after_key = F.struct(*[F.col("after")[k].alias(k) for k in key])
    before_key = F.struct(*[F.col("before")[k].alias(k) for k in key])
    return cond & (before_key != after_key)


def _carries(column: str, ignore_null_updates: bool) -> Column:
    present = F.col("__present")
    carries = ~F.col("__del") & (present.isNull() | F.array_contains(present, column))
    if ignore_null_updates:
        carries = carries & ~((F.col("__op") == C.UPDATE) & F.col("__image")[column].isNull())
    return carries


def _event(*fields: Column) -> Column:
    return F.struct(*[f.alias(n) for f, n in zip(fields, _EVENT_FIELDS, strict=True)])


def _events(
    changelog: DataFrame,
    key: list[str],
    keys: DataFrame | None,
    truncates: list[tuple[str, int | None]],
) -> DataFrame:
    """One row per (key, event) with ``_EVENT_FIELDS``, from one scan of the change log. A key
    change adds a delete of the old key; a truncate, deletes of the keys live just before it."""
    op, seq, time, k = F.col("op"), F.col("sequence"), F.col("event_time"), F.col("key")
    no_image = F.lit(None).cast(changelog.schema["after"].dataType)
    no_columns = F.lit(None).cast("array<string>")
    deleted = op == C.DELETE
    image, present = F.when(~deleted, F.col("after")), F.when(~deleted, F.col("after_columns"))
    produced = [
        _event(k, seq, time, op, deleted, image, present),
        F.when(_complete(key), _event(
            _before_key(changelog, key), seq, time, op, F.lit(True), no_image, no_columns
        )),
    ]  # fmt: skip
    if truncates:
        # A key is live just before a truncate iff its last event before it is not a delete, so
        # the first truncate after each live event is the only one that can delete it (no join
        # needed). Copies of it from several events of a key count once (duplicates); after a
        # delete it adds nothing, like any delete of a key that is not live.
        listed = F.array(
            *[
                F.struct(F.lit(s).alias("seq"), F.timestamp_micros(F.lit(us)).alias("time"))
                for s, us in truncates
            ]
        )
        t = F.array_min(F.filter(listed, lambda x: x["seq"] > seq))
        produced.append(
            F.when(
                ~deleted & t.isNotNull(),
                _event(
                    k, t["seq"], t["time"], F.lit(C.TRUNCATE), F.lit(True), no_image, no_columns
                ),
            )
        )
    events = changelog.where(op.isin(*_ROW_OPS)).select(
        F.inline(F.array_compact(F.array(*produced)))
    )  # fmt: skip
    if keys is not None:
        events = events.join(keys.select(F.col("key").alias("__k")), "__k", "left_semi")
    return events
