"""``format: auto``: recognise each message's format by its structure, so one topic may mix them.

Every format's ``claims(keys, value)`` is evaluated on every message (``keys``: its top-level
JSON keys, null when it is not a JSON object). Exactly one claimant parses the message; a message
no format claims, or that several claim, is quarantined with that reason. A Kafka tombstone
(null value) belongs to no format: it is a control record.
"""

from types import ModuleType

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_platform import formats
from cdc_platform.formats import canonical as C

NAME = "auto"


def candidates() -> dict[str, ModuleType]:
    """One entry per format module (aliases such as ``lindorm`` share Debezium's parser)."""
    found: dict[str, ModuleType] = {}
    for name, path in formats.FORMATS.items():
        if path != __name__ and path not in {m.__name__ for m in found.values()}:
            found[name] = formats.parser_for(name)
    return found


def __getattr__(name: str) -> dict[str, tuple[str, ...]]:
    # OPTIONS is every format's options (each parser takes the ones it knows), computed on
    # first use so that importing this module does not import every format.
    if name == "OPTIONS":
        return {k: v for m in candidates().values() for k, v in m.OPTIONS.items()}
    raise AttributeError(name)


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
