"""``format: auto``: recognise each message's format by its structure, so one topic may mix them.

Every format's ``claims(keys, value)`` is evaluated on every message (``keys``: its top-level
JSON keys, null when it is not a JSON object). Exactly one claimant parses the message; a message
no format claims, or that several claim, is quarantined with that reason. A Kafka tombstone
(null value) belongs to no format: it is a control record.
"""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_platform import formats
from cdc_platform.formats import canonical as C
from cdc_platform.formats.contract import Format, Options

NAME = "auto"


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


def claimants(keys: Column, value: Column) -> Column:
    """The names of the formats that claim a message."""
    named = [F.when(m.claims(keys, value), F.lit(n)) for n, m in candidates().items()]
    return F.filter(F.array(*named), lambda name: name.isNotNull())


def _unclaimed(rows: DataFrame) -> DataFrame:
    claimed = F.col("_claimed")
    kind = F.when(F.col("value").isNull(), F.lit(C.KIND_CONTROL)).otherwise(F.lit(C.KIND_ERROR))
    reason = (
        F.when(F.col("value").isNull(), F.lit("kafka tombstone"))
        .when(F.size(claimed) == 0, F.lit("no format recognises this message"))
        .otherwise(F.concat(F.lit("ambiguous: claimed by "), F.array_join(claimed, " and ")))
    )
    fields = {f.name: F.lit(None).cast(f.dataType) for f in C.PARSED_SCHEMA.fields}
    fields.update(kind=kind, reason=reason, source_format=F.lit(NAME))
    return rows.select(*rows.columns, *[col.alias(name) for name, col in fields.items()])


def parse(raw: DataFrame, options: dict[str, str]) -> DataFrame:
    text = F.col("value").cast("string")
    keys = F.when(F.col("value").isNotNull(), F.json_object_keys(text))
    # Checkpointed so the claims run once, not once per format branch below.
    tagged = raw.withColumn("_claimed", claimants(keys, text)).localCheckpoint()
    one = F.size("_claimed") == 1
    parts = [_unclaimed(tagged.where(~one | F.col("value").isNull())).drop("_claimed")]
    for name, module in candidates().items():
        mine = tagged.where(one & F.col("value").isNotNull() & (F.col("_claimed")[0] == name))
        own = {k: v for k, v in options.items() if k in module.OPTIONS}
        parts.append(module.parse(mine.drop("_claimed"), own))
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result
