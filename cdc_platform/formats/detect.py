"""``format: auto``: recognise each message's format by its structure, so one topic may mix them.

Every format's ``claims(keys, value)`` is evaluated on every message (``keys``: its top-level
JSON keys, null when it is not a JSON object). Exactly one claimant parses the message; a message
no format claims, or that several claim, is quarantined with that reason. A Kafka tombstone
(null value) belongs to no format: it is a control record.

What it costs: a first pass over the values only names each message's claimants and collects
the names found. It parses a message at most twice: for its top-level keys, and for the nested
fields the claims read (every format's ``CLAIM_PATHS`` at once, only in messages with one of
their top-level keys). Then each format found parses its own messages and nothing else: where
one format claims every message (tombstones aside), its parser reads the batch with no filter,
so ``auto`` costs that format plus the pass. Only a batch that mixes formats, or holds messages
no format or several claim, keeps the names (a local checkpoint) and filters on them.
"""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_platform import formats
from cdc_platform.formats import canonical as C
from cdc_platform.formats import json_records as J
from cdc_platform.formats.contract import Format, Options

NAME = "auto"
_KEYS = "_keys"
_PROBE = "_probe"
# The names of a message's claimants, comma-separated ("" for none; null for a tombstone).
_CLAIMED = "_claimed"


def candidates() -> dict[str, Format]:
    """One entry per format module (aliases such as ``lindorm`` share Debezium's parser)."""
    found: dict[str, Format] = {}
    seen = {__name__}
    for name, path in formats.FORMATS.items():
        if path not in seen:
            seen.add(path)
            found[name] = formats.format_for(name)
    return found


# Every format's options: each parser takes the ones it knows. A plain attribute computed at
# import: from Python 3.12 isinstance against ``contract.Parser`` looks attributes up statically.
OPTIONS: Options = {k: v for m in candidates().values() for k, v in m.OPTIONS.items()}
# The nested fields every claim reads, parsed out of a message together.
CLAIM_PATHS = sorted({p for m in candidates().values() for p in m.CLAIM_PATHS})


def _claimed_by(keys: Column, value: Column, probe: Column) -> Column:
    """The names of the formats that claim a message, comma-separated (null for a tombstone)."""
    return F.when(
        value.isNotNull(),
        F.concat_ws(
            ",",
            *[
                F.when(value.isNull(), F.lit(None)).when(m.claims(keys, value, probe), F.lit(n))
                for n, m in candidates().items()
            ],
        ),
    )


def claimants(keys: Column, value: Column) -> Column:
    """The names of the formats that claim a message."""
    claimed = _claimed_by(keys, value, J.probe(keys, CLAIM_PATHS))
    return F.when(claimed == "", F.array().cast("array<string>")).otherwise(F.split(claimed, ","))


def _with_claims(raw: DataFrame) -> DataFrame:
    text = J.text()
    # The keys and the probe in columns of their own: every claim reads them, and Spark keeps a
    # column that several expressions read from being computed once for each.
    keyed = raw.withColumn(_KEYS, J.object_keys())
    probed = keyed.withColumn(_PROBE, J.probe(F.col(_KEYS), CLAIM_PATHS))
    claimed = _claimed_by(F.col(_KEYS), text, F.col(_PROBE))
    return probed.withColumn(_CLAIMED, claimed).drop(_KEYS, _PROBE)


def _unrouted(rows: DataFrame, claimed: Column) -> DataFrame:
    """Records for messages no parser takes: tombstones, and those claimed by none or several."""
    kind = F.when(F.col("value").isNull(), F.lit(C.KIND_CONTROL)).otherwise(F.lit(C.KIND_ERROR))
    reason = (
        F.when(F.col("value").isNull(), F.lit("kafka tombstone"))
        .when(claimed == "", F.lit(C.UNRECOGNISED))
        .otherwise(
            F.concat(F.lit("ambiguous: claimed by "), F.regexp_replace(claimed, ",", " and "))
        )
    )
    fields = {f.name: F.lit(None).cast(f.dataType) for f in C.PARSED_SCHEMA.fields}
    fields.update(kind=kind, reason=reason, source_format=F.lit(NAME))
    return rows.select(*rows.columns, *[col.alias(name) for name, col in fields.items()])


def _parse_as(name: str, rows: DataFrame, options: dict[str, str]) -> DataFrame:
    module = candidates()[name]
    return module.parse(rows, {k: v for k, v in options.items() if k in module.OPTIONS})


def parse(raw: DataFrame, options: dict[str, str]) -> DataFrame:
    # One pass over the values: the claimants found in this batch, and whether it has tombstones.
    claimed = raw.select("value").transform(_with_claims)
    [(found, tombstones)] = claimed.agg(
        F.collect_set(_CLAIMED), F.coalesce(F.bool_or(F.col("value").isNull()), F.lit(False))
    ).collect()
    routes = sorted(c for c in found if "," not in c and c)  # formats that claim messages alone
    unrouted = set(found) - set(routes)  # "" (no claimant) or several names
    value = F.col("value")
    if not unrouted and len(routes) <= 1:
        # At most one format, besides tombstones: its parser reads the messages unfiltered.
        messages = raw.where(value.isNotNull()) if tombstones else raw
        parts = [_parse_as(name, messages, options) for name in routes]
        if tombstones or not parts:
            parts.append(_unrouted(raw.where(value.isNull()), F.lit(None)))
    else:
        # Mixed: the claimants once more, kept, so that each format's share is a plain filter.
        routed = _with_claims(raw).localCheckpoint()
        mine = F.col(_CLAIMED)
        unclaimed = routed.where(mine.isNull() | ~mine.isin(*routes))
        parts = [_unrouted(unclaimed, mine).drop(_CLAIMED)]
        for name in routes:
            parts.append(_parse_as(name, routed.where(mine == name).drop(_CLAIMED), options))
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result
