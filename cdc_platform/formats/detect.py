"""``format: auto``: recognise each message's format by its structure, so one topic may mix them.

Every format's ``claims(keys, value)`` is evaluated on every message (``keys``: its top-level
JSON keys, null when it is not a JSON object). Exactly one claimant parses the message; a message
no format claims, or that several claim, is quarantined with that reason. A Kafka tombstone
(null value) belongs to no format: it is a control record.

What it costs: a first pass over the values only names the claimants found. It parses a
message at most twice: for its top-level keys, and for the nested fields the claims read (every
format's ``CLAIM_PATHS`` at once, only in messages with one of their top-level keys, each kept
as what the claims test of it). The claims of a JSON object read nothing else, and a batch's
messages share a few such pairs: they are evaluated once for each distinct pair, not for each
message. Then each format found parses its own messages and nothing else: where
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


def _claim_paths() -> dict[str, str]:
    """The nested fields every claim reads, parsed out of a message together: each with the
    richest test a format makes of it."""
    paths: dict[str, str] = {}
    for m in candidates().values():
        for path, test in m.CLAIM_PATHS.items():
            paths[path] = max(paths.get(path, test), test, key=J.CLAIM_TESTS.index)
    return dict(sorted(paths.items()))


CLAIM_PATHS = _claim_paths()
_TOMBSTONE = "_tombstone"


def _names(keys: Column, value: Column, probe: Column) -> Column:
    """The names of the formats that claim a message, comma-separated ("" for none)."""
    claims = [F.when(m.claims(keys, value, probe), F.lit(n)) for n, m in candidates().items()]
    return F.concat_ws(",", *claims)


def _claimed_by(keys: Column, value: Column, probe: Column) -> Column:
    """The names of the formats that claim a message, comma-separated (null for a tombstone)."""
    return F.when(value.isNotNull(), _names(keys, value, probe))


def claimants(keys: Column, value: Column) -> Column:
    """The names of the formats that claim a message."""
    claimed = _claimed_by(keys, value, J.tested(J.probe(keys, CLAIM_PATHS), CLAIM_PATHS))
    return F.when(claimed == "", F.array().cast("array<string>")).otherwise(F.split(claimed, ","))


def _probed(raw: DataFrame) -> DataFrame:
    """``raw`` with each message's keys (``_KEYS``) and probe (``_PROBE``), in columns of their
    own: every claim reads them, and Spark keeps a column that several expressions read from
    being computed once for each."""
    keyed = raw.withColumn(_KEYS, J.object_keys())
    return keyed.withColumn(_PROBE, J.probe(F.col(_KEYS), CLAIM_PATHS))


def _with_claims(raw: DataFrame) -> DataFrame:
    claimed = _claimed_by(F.col(_KEYS), J.text(), J.tested(F.col(_PROBE), CLAIM_PATHS))
    return _probed(raw).withColumn(_CLAIMED, claimed).drop(_KEYS, _PROBE)


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


def _found(raw: DataFrame) -> tuple[list[str], bool]:
    """The claimants' names (as ``_CLAIMED`` gives them) of the batch's messages, and whether it
    has tombstones, in one pass over the values. A JSON object's claims read only its keys and
    its probe, which a batch's messages share a few of: the claims are evaluated once for each
    distinct pair. A message that is no JSON object (a DTS Avro record) is claimed from its
    bytes, one by one."""
    keys, value = F.col(_KEYS), F.col("value")
    probe = J.tested(F.col(_PROBE), CLAIM_PATHS)
    kinds = (
        _probed(raw.select(value))
        .select(
            keys,
            probe.alias(_PROBE),
            F.when(keys.isNull(), _claimed_by(keys, J.text(), probe)).alias(_CLAIMED),
            value.isNull().alias(_TOMBSTONE),
        )
        .distinct()
    )
    names = F.when(keys.isNull(), F.col(_CLAIMED)).otherwise(
        _names(keys, F.lit(None).cast("string"), F.col(_PROBE))
    )
    # The distinct rows themselves (a few) come back, not an aggregate of them: Spark drops a
    # distinct under aggregates that ignore duplicates, and the claims would then be evaluated
    # for each message again.
    rows = kinds.select(names, _TOMBSTONE).collect()
    return sorted({r[0] for r in rows if r[0] is not None}), any(r[1] for r in rows)


def parse(raw: DataFrame, options: dict[str, str]) -> DataFrame:
    found, tombstones = _found(raw)
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
