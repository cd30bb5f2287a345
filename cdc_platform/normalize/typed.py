"""Typing: a table's changes typed by its plan with native expressions, and why a change cannot be
applied (a null key, a value that does not fit its type, an incompatible message schema)."""

from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_platform.formats import canonical as C
from cdc_platform.formats.column_specs import (
    TOKEN_DECODERS,
    ColumnSpec,
    connect_tokens,
    decode,
    might_be_number,
)
from cdc_platform.normalize.columns import to_quarantine
from cdc_platform.normalize.plan import TablePlan

IMAGES = {"before": "before_image", "after": "after_image"}


def group_column(source_format: Column, image_encoding: Column, value_schema: Column) -> Column:
    """What a plan's types depend on, besides the table: the format, the image encoding and the
    message schema (hashed)."""
    return F.concat_ws("|", source_format, image_encoding, F.xxhash64(value_schema).cast("string"))


def _token_columns(plan: TablePlan) -> list[str]:
    specs = [plan.specs, *plan.group_specs.values()]
    return sorted({c for s in specs for c, spec in s.items() if spec.decoder in TOKEN_DECODERS})


def _tokens(plan: TablePlan, where: Column) -> Column:
    """The JSON tokens of the plan's ``TOKEN_DECODERS`` columns, read from the raw message only
    where a wire value may have been a number (a default base64 Decimal is not read twice)."""
    columns = _token_columns(plan)
    maybe = reduce(
        lambda a, b: a | b,
        [might_be_number(F.col(image)[c]) for image in IMAGES.values() for c in columns],
    )
    return F.when(where & F.coalesce(maybe, F.lit(False)), connect_tokens(F.col("value"), columns))


def _typed_image(
    image: str, plan: TablePlan, tokens: Column | None, group: Column | None
) -> Column:
    img = F.col(IMAGES[image])

    def decoded(c: str, spec: ColumnSpec) -> Column:
        token = None
        if tokens is not None and spec.decoder in TOKEN_DECODERS:
            token = F.to_json(tokens[image][c])
        return decode(img[c], spec, token)

    def typed(c: str) -> Column:
        value = decoded(c, plan.specs[c])
        own = [(g, specs[c]) for g, specs in sorted(plan.group_specs.items()) if c in specs]
        if not own or group is None:
            return value.alias(c)
        # Rows of a schema group that wrote the column otherwise: its own decoding.
        cases = [(group == g, decoded(c, spec).try_cast(plan.specs[c].type)) for g, spec in own]
        first = F.when(*cases[0])
        return reduce(lambda acc, case: acc.when(*case), cases[1:], first).otherwise(value).alias(c)

    return F.when(img.isNotNull(), F.struct(*[typed(c) for c in plan.specs]))


def _first_problem(plan: TablePlan, before: Column, after: Column) -> Column:
    """Why a typed change cannot be applied (null if it can): null key or undecodable value."""
    checks: list[tuple[Column, Column]] = [
        (F.xxhash64("value_schema") == F.lit(h), F.lit(why)) for h, why in plan.bad_schemas.items()
    ]
    key_image = F.when(F.col("op") == C.DELETE, before).otherwise(after)
    for k in plan.key:
        checks.append(
            (
                (F.col("op") != C.TRUNCATE) & key_image[k].isNull(),
                F.lit(f"primary key column {k!r} is null"),
            )
        )
    for name, image in (("before", before), ("after", after)):
        for c, spec in plan.specs.items():
            wire = F.col(f"{name}_image")[c]
            checks.append(
                (
                    wire.isNotNull() & image[c].isNull(),
                    F.concat(
                        F.lit(f"type mismatch: {name}.{c} = "),
                        F.substring(wire, 1, 80),
                        F.lit(f" is not {spec.type}"),
                    ),
                )
            )
    return (
        reduce(lambda acc, ck: acc.when(*ck), checks[1:], F.when(*checks[0]))
        if checks
        else F.lit(None)
    )


def with_typed_parts(frame: DataFrame, plan: TablePlan, name: str, where: Column) -> DataFrame:
    """``frame`` plus column ``name``, null where ``where`` is not true: a change's typed parts
    under ``plan`` (``key``, ``before``, ``after``, ``after_columns``: which columns a partial
    after image carries, null for a full one; ``reason``: why it cannot be applied)."""
    b, a, t, g = f"{name}_before", f"{name}_after", f"{name}_tokens", f"{name}_group"
    tokens = group = None
    # Their own columns, so that Spark computes them once per message, not at every use.
    if _token_columns(plan):
        frame, tokens = frame.withColumn(t, _tokens(plan, where)), F.col(t)
    if plan.group_specs:
        schema_group = group_column(F.col("source_format"), F.col("image_encoding"),
                                    F.col("value_schema"))  # fmt: skip
        frame, group = frame.withColumn(g, F.when(where, schema_group)), F.col(g)
    frame = frame.withColumns(
        {b: F.when(where, _typed_image("before", plan, tokens, group)),
         a: F.when(where, _typed_image("after", plan, tokens, group))}
    )  # fmt: skip
    key_image = F.when(F.col("op") == C.DELETE, F.col(b)).otherwise(F.col(a))
    parts = F.struct(
        F.struct(*[key_image[k].alias(k) for k in plan.key]).alias("key"),
        F.col(b).alias("before"),
        F.col(a).alias("after"),
        F.when(F.col("after_partial"), F.map_keys("after_image")).alias("after_columns"),
        _first_problem(plan, F.col(b), F.col(a)).alias("reason"),
    )
    return frame.withColumn(name, F.when(where, parts)).drop(b, a, t, g)


def typed_records(frame: DataFrame, name: str, plan: TablePlan, final: TablePlan) -> DataFrame:
    """The change-log columns, ``reason``, and what a quarantine row needs besides (``raw_key``
    and ``value`` on rejected rows only), from the typed parts in column ``name`` (made with
    ``plan``), in ``final``'s columns and types (a column ``plan`` lacks is null)."""
    parts = F.col(name)

    def typed(image: str) -> Column:
        got = parts[image]
        if final.specs == plan.specs:
            return got
        return F.when(
            got.isNotNull(),
            F.struct(*[_as(got, c, plan, final).alias(c) for c in final.specs]),
        )

    key = parts["key"]
    if any(final.specs[k].type != plan.specs[k].type for k in plan.key):
        key = F.struct(*[_as(key, k, plan, final).alias(k) for k in plan.key])
    bad = parts["reason"].isNotNull()
    return frame.select(
        "op", "database", "schema", "table", key.alias("key"),
        typed("before").alias("before"), typed("after").alias("after"),
        parts["after_columns"].alias("after_columns"),
        "sequence", "event_time", "tx_id", "source_format",
        "topic", "partition", "offset", "file", "line", "ingest_date",
        parts["reason"].alias("reason"), "timestamp", "qualified_table",
        F.when(bad, F.col("key")).alias("raw_key"), F.when(bad, F.col("value")).alias("value"),
    )  # fmt: skip


def _as(struct: Column, column: str, plan: TablePlan, final: TablePlan) -> Column:
    """A field of a struct typed by ``plan``, in ``final``'s type (null when ``plan`` lacks it)."""
    if column not in plan.specs:
        return F.lit(None).cast(final.specs[column].type)
    value = struct[column]
    same = plan.specs[column].type == final.specs[column].type
    return value if same else value.cast(final.specs[column].type)


def type_changes(changes: DataFrame, plan: TablePlan) -> DataFrame:
    """``typed_records`` of a table's changes, typed from their wire images by ``plan``."""
    rows = changes.where(F.col("qualified_table") == plan.qualified)
    return typed_records(
        with_typed_parts(rows, plan, "__parts", F.lit(True)), "__parts", plan, plan
    )


def rejected_table(changes: DataFrame, plan: TablePlan) -> DataFrame:
    """Quarantine rows for every change of a table that cannot be applied at all (no key)."""
    rows = changes.where(F.col("qualified_table") == plan.qualified)
    return to_quarantine(rows.withColumn("reason", F.lit(plan.problem)))
