"""Parsing: the format parses each message into a parsed record with wire-text images; the records
get their total-order ``sequence`` (format position, then raw position) and qualified table name.

One pass: a batch's first messages are planned first (``predict_plans``), and the parse types the
rows that fit those plans in its own pass (``with_plans``): same table, format and message
schema, no column the plan has not seen. Only the rows that do not fit (a new schema version, a
new column, a table the first messages do not name) are planned and typed afterwards, from their
wire images (``split``)."""

from dataclasses import dataclass
from functools import reduce

from pyspark.errors import PySparkAssertionError
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from cdc_platform import formats
from cdc_platform.catalog import SourceConfig
from cdc_platform.formats import canonical as C
from cdc_platform.formats import confluent_avro
from cdc_platform.normalize.columns import image_columns
from cdc_platform.normalize.plan import (
    Known,
    SchemaGroup,
    TablePlan,
    inferred_types,
    plan_tables,
)
from cdc_platform.normalize.typed import group_column, with_typed_parts

# How many of a batch's first parsed messages ``predict_plans`` reads, and how many tables it
# plans (the parse computes one typed column per planned table).
SAMPLE_ROWS = 1000
MAX_TYPED_TABLES = 8
TYPED = "__typed"  # the index of the plan a parsed row fits (null: none)


def registry_reading(source: SourceConfig) -> confluent_avro.Reading | None:
    """How ``source`` reads Avro in the Confluent wire format (None: it has no registry)."""
    r = source.schema_registry
    if r is None:
        return None
    return confluent_avro.Reading(
        r.client_settings(),
        r.key_subject_name_strategy,
        r.value_subject_name_strategy,
        r.use_latest_version,
    )


def parse_messages(raw: DataFrame, source: SourceConfig) -> DataFrame:
    """Parsed records with ``sequence`` and ``qualified_table``; raw columns are kept (Avro
    keys and values as they arrived, read as the JsonConverter's JSON text)."""
    parser = formats.parser_for(source.format)
    reading = registry_reading(source)
    parsed = parser.parse(confluent_avro.decoded(raw, reading), source.format_options)
    parsed = confluent_avro.with_outcome(parsed, reading)
    return parsed.withColumn(
        "sequence", F.concat(F.coalesce("source_sequence", F.lit("")), F.lit("|"), C.raw_position())
    ).withColumn("qualified_table", F.concat_ws(".", "database", "schema", "table"))


def with_plans(parsed: DataFrame, typed: list[TablePlan]) -> DataFrame:
    """``parse_messages``' records, and per ``typed`` plan the typed parts of the changes that
    fit it: ``TYPED``, the index of the plan a change fits, and per plan ``typed_parts(i)``.
    Those rows drop their wire images and message schema, which nothing reads once they are
    typed, and their raw key and value unless they are rejected (the quarantine keeps them)."""
    if not typed:
        return parsed
    fit = F.lit(None).cast("int")
    for i, plan in reversed(list(enumerate(typed))):
        fit = F.when(fits(plan), F.lit(i)).otherwise(fit)
    parsed = parsed.withColumn(TYPED, fit)
    for i, plan in enumerate(typed):
        parsed = with_typed_parts(parsed, plan, typed_parts(i), F.col(TYPED) == i)
    untyped = F.col(TYPED).isNull()
    rejected = reduce(
        lambda a, b: a | b, [F.col(typed_parts(i))["reason"].isNotNull() for i in range(len(typed))]
    )
    wire = {c: F.when(untyped, F.col(c)) for c in ("before_image", "after_image", "value_schema")}
    # The raw message stays for the quarantine only.
    raw_kept = {c: F.when(untyped | rejected, F.col(c)) for c in ("key", "value")}
    return parsed.withColumns({**wire, **raw_kept})


def typed_parts(index: int) -> str:
    """The column of ``with_plans`` holding the typed parts of the rows fitting plan ``index``."""
    return f"__typed_{index}"


def fits(plan: TablePlan) -> Column:
    """True for a change of ``plan``'s table that its types cover: a format, encoding and message
    schema the plan was made from, and only columns it has seen."""
    seen = F.array(*[F.lit(c) for c in sorted(plan.seen)]).cast("array<string>")
    return (
        (F.col("kind") == C.KIND_CHANGE)
        & (F.col("qualified_table") == plan.qualified)
        & group_column(F.col("source_format"), F.col("image_encoding"), F.col("value_schema")).isin(
            *sorted(plan.groups)
        )
        & (F.size(F.array_except(image_columns(), seen)) == 0)
    )


def _token_image() -> Column | None:
    """A change's newest row image as a variant that keeps its JSON token types, for the formats
    that have them (``TOKEN_PATHS``); null for the others."""
    message = F.try_parse_json(F.col("value").cast("string"))

    def image(paths: tuple[str, ...]) -> Column:
        found = [F.try_variant_get(message, p, "variant") for p in paths]
        return F.coalesce(*[F.when(~F.is_variant_null(v), v) for v in found])

    cases = [
        (F.col("source_format") == name, image(module.TOKEN_PATHS))
        for name in formats.format_names()
        if formats.FORMATS[name] != formats.AUTO_MODULE
        and (module := formats.format_for(name)).TOKEN_PATHS
    ]
    return reduce(lambda acc, case: acc.when(*case), cases[1:], F.when(*cases[0]))


def schema_groups(changes: DataFrame, infer: bool = False) -> list[SchemaGroup]:
    """The schema groups of parsed changes: one small aggregation, collected (a few rows, one
    per table and message schema). Each carries its first message, so planning reads no more.
    ``infer``: also the merged JSON token types of the images of messages without a schema
    (``SchemaGroup.inferred``, for ``infer_types``), which parses those messages once more."""
    inferred = F.lit(None).cast("string")
    if infer:
        tokens = F.when(F.col("value_schema").isNull(), _token_image())
        inferred = F.schema_of_variant_agg(tokens)
    rows = (
        changes.groupBy(
            "qualified_table",
            "source_format",
            "image_encoding",
            F.xxhash64("value_schema").alias("schema_hash"),
        )
        .agg(
            F.first("value_schema", ignorenulls=True).alias("value_schema"),
            F.collect_set("key_columns").alias("keys"),
            F.array_distinct(F.flatten(F.collect_set(image_columns()))).alias("columns"),
            F.min("sequence").alias("first_seen"),
            F.min_by("value", "sequence").alias("first_value"),
            F.first(
                group_column(F.col("source_format"), F.col("image_encoding"), F.col("value_schema"))
            ).alias("group"),
            inferred.alias("inferred"),
        )
        .collect()
    )
    return [
        SchemaGroup(
            qualified_table=r["qualified_table"],
            source_format=r["source_format"],
            image_encoding=r["image_encoding"],
            schema_hash=r["schema_hash"],
            value_schema=r["value_schema"],
            group=r["group"],
            first_seen=r["first_seen"],
            first_value=r["first_value"],
            keys=tuple(tuple(k) for k in r["keys"] or [] if k is not None),
            columns=tuple(r["columns"] or []),
            inferred=tuple(inferred_types(r["inferred"]).items()),
        )
        for r in rows
    ]


@dataclass
class Prediction:
    """What a batch's first messages say about it: the plans the parse types rows by, and
    whether they were all changes of one table, which ``plans[0]`` types (then the whole batch
    likely is: its change log can be written straight from the parse, ``normalize``)."""

    plans: list[TablePlan]
    one_table: bool


def predict_plans(
    messages: DataFrame, source: SourceConfig, known: Known | None = None
) -> Prediction:
    """Plans of the tables the first ``SAMPLE_ROWS`` of ``messages`` (``parse_messages``
    without plans) change: at most ``MAX_TYPED_TABLES``, in the order they appear, for
    ``with_plans`` to type the rows that fit them in the parse's own pass. Tables that cannot
    be applied, whose schema changes incompatibly, or whose types come from JSON tokens
    (``infer_types``), are left to the plan of the whole batch."""
    others = Observation()  # messages of the sample that are not changes: seen by the same job
    sample = messages.limit(SAMPLE_ROWS).observe(
        others, F.count_if(F.col("kind") != C.KIND_CHANGE).alias("n")
    )
    changes = sample.where(F.col("kind") == C.KIND_CHANGE)
    plans = plan_tables(schema_groups(changes, source.infers_any), source, known)
    # Types inferred from the sample's tokens may be narrower than the batch's.
    usable = [p for p in plans.values() if not (p.problem or p.bad_schemas or p.inferred)]
    typed = usable[:MAX_TYPED_TABLES]
    one_table = len(plans) == len(typed) == 1 and _observed(others).get("n") == 0
    return Prediction(typed, one_table)


def _observed(observation: Observation) -> dict:
    """An observation's metrics; none when Spark Connect reports none (nothing is assumed)."""
    try:
        return observation.get
    except PySparkAssertionError:
        return {}
