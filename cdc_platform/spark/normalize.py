"""Raw messages -> canonical, typed change log per table (+ quarantine), with Spark functions only.

Steps: the format parses each message into a parsed record with wire-text images; the records get
their total-order ``sequence`` (format position, then raw position); the few distinct (table,
schema) combinations are collected on the driver to decide each table's key and column types;
each table's images are then typed with native expressions. Whatever cannot be parsed, keyed or
typed becomes a quarantine row with its reason, raw bytes and coordinates.

One pass: a batch's first messages are planned first (``predict_plans``), and the parse types
the rows that fit those plans in its own pass (``parse_messages(..., typed)``): same table,
format and message schema, no column the plan has not seen. Only the rows that do not fit (a
new schema version, a new column, a table the first messages do not name) are planned and typed
afterwards, from their wire images, as before.
"""

import re
from dataclasses import dataclass, field
from functools import reduce

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

from cdc_platform import formats
from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.formats import canonical as C
from cdc_platform.formats import json_records
from cdc_platform.formats.column_specs import STRING, ColumnSpec, common_type, decode, hbase_spec

# How many of a batch's first messages ``predict_plans`` reads, and how many tables it plans (the
# parse computes one typed column per planned table).
SAMPLE_ROWS = 1000
MAX_TYPED_TABLES = 8
TYPED = "__typed"  # the index of the plan a parsed row fits (null: none)

QUARANTINE_COLUMNS = (
    "ingest_date", "topic", "partition", "offset", "timestamp", "key", "value", "file", "line",
    "reason", "source_format", "qualified_table",
)  # fmt: skip


def table_name(qualified: str) -> str:
    """Name of an undeclared source table: ``db.schema.table`` -> ``db__schema__table``."""
    parts = [re.sub(r"[^A-Za-z0-9_]+", "_", p).strip("_") or "_" for p in qualified.split(".")]
    name = "__".join(parts)
    return f"t_{name}" if name[0].isdigit() else name


def parse_messages(
    raw: DataFrame, source: SourceConfig, typed: list["TablePlan"] | None = None
) -> DataFrame:
    """Parsed records with ``sequence`` and ``qualified_table``; raw columns are kept.

    With ``typed`` plans: also ``TYPED``, the index of the plan a change fits, and per plan
    ``typed_parts(i)``: the fitting rows' typed parts. Those rows drop their wire images and
    message schema, which nothing reads once they are typed, and their raw key and value unless
    they are rejected (the quarantine keeps them)."""
    parser = formats.parser_for(source.format)
    parsed = parser.parse(raw, source.format_options)
    parsed = parsed.withColumn(
        "sequence", F.concat(F.coalesce("source_sequence", F.lit("")), F.lit("|"), C.raw_position())
    ).withColumn("qualified_table", F.concat_ws(".", "database", "schema", "table"))
    if not typed:
        return parsed
    fit = F.lit(None).cast("int")
    for i, plan in reversed(list(enumerate(typed))):
        fit = F.when(_fits(plan), F.lit(i)).otherwise(fit)
    parsed = parsed.withColumn(TYPED, fit)
    for i, plan in enumerate(typed):
        parsed = _with_typed_parts(parsed, plan, typed_parts(i), F.col(TYPED) == i)
    untyped = F.col(TYPED).isNull()
    rejected = reduce(
        lambda a, b: a | b, [F.col(typed_parts(i))["reason"].isNotNull() for i in range(len(typed))]
    )
    wire = {c: F.when(untyped, F.col(c)) for c in ("before_image", "after_image", "value_schema")}
    # The raw message stays for the quarantine only.
    raw_kept = {c: F.when(untyped | rejected, F.col(c)) for c in ("key", "value")}
    return parsed.withColumns({**wire, **raw_kept})


def typed_parts(index: int) -> str:
    """The column of ``parse_messages`` holding the typed parts of the rows fitting plan
    ``index``."""
    return f"__typed_{index}"


def _group(source_format: Column, image_encoding: Column, value_schema: Column) -> Column:
    """What a plan's types depend on, besides the table: the format, the image encoding and the
    message schema (hashed)."""
    return F.concat_ws("|", source_format, image_encoding, F.xxhash64(value_schema).cast("string"))


def _fits(plan: "TablePlan") -> Column:
    """True for a change of ``plan``'s table that its types cover: a format, encoding and message
    schema the plan was made from, and only columns it has seen."""
    seen = F.array(*[F.lit(c) for c in sorted(plan.seen)]).cast("array<string>")
    return (
        (F.col("kind") == C.KIND_CHANGE)
        & (F.col("qualified_table") == plan.qualified)
        & _group(F.col("source_format"), F.col("image_encoding"), F.col("value_schema")).isin(
            *sorted(plan.groups)
        )
        & (F.size(F.array_except(_image_columns(), seen)) == 0)
    )


def _image_columns() -> Column:
    """The columns a change's images name (before's and after's)."""
    none = F.array().cast("array<string>")
    return F.array_union(
        F.coalesce(F.map_keys("after_image"), none), F.coalesce(F.map_keys("before_image"), none)
    )


@dataclass
class TablePlan:
    """How one source table is keyed and typed."""

    name: str
    qualified: str
    key: list[str]
    specs: dict[str, ColumnSpec]
    hbase: bool = False
    problem: str | None = None  # set when the table cannot be applied (e.g. no key)
    observed_key: list[str] = field(default_factory=list)
    # Columns whose type a message schema or the configuration states (others are guessed).
    typed_columns: set[str] = field(default_factory=set)
    # xxhash64 of a message schema -> why its rows cannot be applied (incompatible type change).
    bad_schemas: dict[int, str] = field(default_factory=dict)
    # A new table's columns as its first message writes them, when the parsed images lost that
    # order (formats.contract.Format.IMAGE_PATHS).
    wire_order: list[str] = field(default_factory=list)
    # What the plan was made from (for ``_fits``): each (format, encoding, schema) ``_group``,
    # and every image column, also those ``column_list`` leaves out.
    groups: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)


def _evolve(plan: TablePlan, col: str, spec: ColumnSpec, prior_type: str | None) -> str | None:
    """Take a column's newly stated type; returns why not when it is incompatible with what the
    table holds. Widening (int -> bigint, float -> double, more decimal digits) is taken: the
    lake widens the table on write. A narrower type is decoded, then written as the wider one."""
    if prior_type is None or prior_type == spec.type:
        plan.specs[col] = spec
        return None
    common = common_type(prior_type, spec.type)
    if common is None:
        plan.specs.setdefault(col, ColumnSpec(prior_type))  # the table's type stays
        return (
            f"incompatible schema change: column {col!r} of {plan.qualified} changes from "
            f"{prior_type} to {spec.type}; set column_types or rebuild the table"
        )
    # A wire decoder (base64 decimals, epoch days) is tied to its own type: keep it.
    plan.specs[col] = spec if spec.decoder != "cast" else ColumnSpec(common)
    return None


def ddl_records(parsed: DataFrame) -> DataFrame:
    """The DDL log rows of a parsed batch: statement, where it applies, when, and whence."""
    return parsed.where(F.col("kind") == C.KIND_DDL).select(
        "qualified_table", "database", "schema", "table", F.col("ddl").alias("statement"),
        "op", "sequence", "event_time", "source_format",
        "topic", "partition", "offset", "file", "line", "ingest_date",
    )  # fmt: skip


def control_records(parsed: DataFrame) -> DataFrame:
    """The control log rows of a parsed batch: heartbeats, transaction markers, tombstones.
    Their event times tell how far the source has got even when no row changes."""
    return parsed.where(F.col("kind") == C.KIND_CONTROL).select(
        "op", "database", "schema", "table", "sequence", "event_time", "tx_id", "source_format",
        "topic", "partition", "offset", "file", "line", "ingest_date",
    )  # fmt: skip


def routed_name(qualified: str, source: SourceConfig) -> str:
    """The table name a qualified source name is stored under: declared, else derived."""
    cfg = _match(qualified, source.tables)
    return cfg.name if cfg else table_name(qualified)


def _match(qualified: str, tables: list[TableConfig]) -> TableConfig | None:
    """The declared table for a qualified name: exact, else a dotted suffix (``schema.table``)."""
    exact = [t for t in tables if t.match == qualified]
    suffix = [t for t in tables if qualified.endswith("." + t.match)]
    found = exact or sorted(suffix, key=lambda t: -len(t.match))
    return found[0] if found else None


def _wire_order(changes: DataFrame, group: Row) -> list[str]:
    """The columns of a group's first message in wire order, for formats whose parsed images
    do not keep it ([] for the others): that one message is read again, on the driver."""
    try:
        paths = formats.format_for(group["source_format"]).IMAGE_PATHS
    except ValueError:
        return []
    if not paths:
        return []
    first = changes.where(
        (F.col("qualified_table") == group["qualified_table"])
        & (F.col("sequence") == group["first_seen"])
    ).select("value")
    row = first.first()
    return json_records.wire_keys(row["value"] if row else None, paths)


def _stated_specs(source_format: str, value_schema: str | None) -> dict[str, ColumnSpec]:
    """Column types a message schema states ({} without one, or when it cannot be read)."""
    if not value_schema:
        return {}
    try:
        return formats.format_for(source_format).column_specs(value_schema)
    except (ValueError, TypeError, AttributeError, KeyError):
        return {}  # an unreadable schema leaves the columns to config or string


def plan_tables(
    changes: DataFrame,
    source: SourceConfig,
    known: dict[str, tuple[list[str], dict[str, str]]] | None = None,
) -> dict[str, TablePlan]:
    """Decide key and column types of every table in ``changes`` (one small aggregation).

    ``known``: key and image column types of tables already in the change log, by qualified
    name, for batches that do not name them (e.g. one holding only a truncate).
    """
    # A few rows (one per table and schema): sorted here, which spares Spark a sampling job.
    found = (
        changes.groupBy(
            "qualified_table",
            "source_format",
            "image_encoding",
            F.xxhash64("value_schema").alias("h"),
        )
        .agg(
            F.first("value_schema", ignorenulls=True).alias("value_schema"),
            F.collect_set("key_columns").alias("keys"),
            F.array_distinct(F.flatten(F.collect_set(_image_columns()))).alias("columns"),
            F.min("sequence").alias("first_seen"),
            F.first(
                _group(F.col("source_format"), F.col("image_encoding"), F.col("value_schema"))
            ).alias("group"),
        )
        .collect()
    )
    groups = sorted(found, key=lambda g: g["first_seen"])
    plans: dict[str, TablePlan] = {}
    for g in groups:
        qualified = g["qualified_table"]
        cfg = _match(qualified, source.tables)
        plan = plans.get(qualified)
        if plan is None:
            name = cfg.name if cfg else table_name(qualified)
            plan = plans[qualified] = TablePlan(name, qualified, [], {})
        if g["image_encoding"] == "hbase":
            plan.hbase = True
        plan.groups.add(g["group"])
        plan.seen.update(g["columns"] or [])
        if qualified not in (known or {}) and not plan.wire_order:
            plan.wire_order = _wire_order(changes, g)
        known_types = (known or {}).get(qualified, ([], {}))[1]
        # Schema versions in order of appearance, each checked against the types so far (the
        # table's, then earlier versions'); column order follows first appearance.
        for col, spec in _stated_specs(g["source_format"], g["value_schema"]).items():
            prior = plan.specs[col].type if col in plan.typed_columns else known_types.get(col)
            if why := _evolve(plan, col, spec, prior):
                plan.bad_schemas[g["h"]] = why
            plan.typed_columns.add(col)
        for col in g["columns"] or []:
            plan.specs.setdefault(col, STRING)
        for k in g["keys"] or []:
            if k and not plan.observed_key:
                plan.observed_key = list(k)
    for qualified, plan in plans.items():
        cfg = _match(qualified, source.tables)
        known_types = (known or {}).get(qualified, ([], {}))[1]
        configured = {**source.column_types, **(cfg.column_types if cfg else {})}
        for col, sql_type in configured.items():
            if plan.hbase:
                plan.specs[col] = hbase_spec(sql_type)
            elif col not in plan.specs or plan.specs[col].type != sql_type:
                # Same type as the format says: keep the format's decoder (base64 bytes, ...).
                plan.specs[col] = ColumnSpec(sql_type)
            if not plan.hbase and (
                why := _evolve(plan, col, plan.specs[col], known_types.get(col))
            ):
                plan.problem = why
            plan.typed_columns.add(col)
        for col in plan.specs.keys() - plan.typed_columns:
            if col in known_types and not plan.hbase:
                plan.specs[col] = ColumnSpec(known_types[col])  # a guess yields to the table
        if plan.hbase:
            for col, spec in plan.specs.items():
                if col not in configured:
                    plan.specs[col] = hbase_spec(None if spec == STRING else spec.type)
        plan.key = list(
            (cfg.primary_key if cfg else None)
            or source.primary_key
            or plan.observed_key
            or (known or {}).get(qualified, ([], {}))[0]
        )
        for k in plan.key:
            if k not in plan.specs and k in known_types:
                plan.specs[k] = ColumnSpec(known_types[k])
        if cfg is not None:  # column_list / except_column_list
            plan.specs = {c: spec for c, spec in plan.specs.items() if cfg.keeps(c, plan.key)}
        if plan.wire_order:  # columns the first message lacks keep their place after it
            rank = {c: i for i, c in enumerate(plan.wire_order)}
            plan.specs = dict(sorted(plan.specs.items(), key=lambda kv: rank.get(kv[0], len(rank))))
        missing = [k for k in plan.key if k not in plan.specs]
        if plan.problem:
            continue
        if not plan.key:
            plan.problem = (
                f"no primary key known for table {qualified}: set primary_key in sources.yaml"
                " (or --primary-key)"
            )
        elif missing:
            plan.problem = f"primary key column {missing[0]!r} is not a column of {qualified}"
    return plans


def predict_plans(
    raw: DataFrame,
    source: SourceConfig,
    known: dict[str, tuple[list[str], dict[str, str]]] | None = None,
) -> list[TablePlan]:
    """Plans of the tables a batch's first messages change (``SAMPLE_ROWS``; at most
    ``MAX_TYPED_TABLES``, in the order they appear), for the parse to type their rows in its
    own pass. Tables that cannot be applied, or whose schema changes incompatibly, are left
    to the plan of the whole batch."""
    sample = parse_messages(raw.limit(SAMPLE_ROWS), source)
    changes = sample.where(F.col("kind") == C.KIND_CHANGE)
    plans = plan_tables(changes, source, known)
    usable = [p for p in plans.values() if not p.problem and not p.bad_schemas]
    return usable[:MAX_TYPED_TABLES]


def joined_plan(typed: TablePlan, rest: TablePlan | None) -> TablePlan:
    """The plan of a table whose rows were typed in the parse by ``typed`` and afterwards by
    ``rest`` (planned with ``typed``'s types as the table's): ``typed``'s columns, then the new
    ones; a type ``rest`` widened is the wider."""
    if rest is None:
        return typed
    joined = TablePlan(**{**vars(rest), "key": typed.key, "specs": {**typed.specs, **rest.specs}})
    joined.typed_columns = typed.typed_columns | rest.typed_columns
    return joined


def _typed_image(image: str, plan: TablePlan) -> Column:
    img = F.col(image)
    return F.when(
        img.isNotNull(),
        F.struct(*[decode(img[c], spec).alias(c) for c, spec in plan.specs.items()]),
    )


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


def _with_typed_parts(frame: DataFrame, plan: TablePlan, name: str, where: Column) -> DataFrame:
    """``frame`` plus column ``name``, null where ``where`` is not true: a change's typed parts
    under ``plan`` (``key``, ``before``, ``after``, ``after_columns``: which columns a partial
    after image carries, null for a full one; ``reason``: why it cannot be applied)."""
    b, a = f"{name}_before", f"{name}_after"
    frame = frame.withColumns(
        {b: F.when(where, _typed_image("before_image", plan)),
         a: F.when(where, _typed_image("after_image", plan))}
    )  # fmt: skip
    key_image = F.when(F.col("op") == C.DELETE, F.col(b)).otherwise(F.col(a))
    parts = F.struct(
        F.struct(*[key_image[k].alias(k) for k in plan.key]).alias("key"),
        F.col(b).alias("before"),
        F.col(a).alias("after"),
        F.when(F.col("after_partial"), F.map_keys("after_image")).alias("after_columns"),
        _first_problem(plan, F.col(b), F.col(a)).alias("reason"),
    )
    return frame.withColumn(name, F.when(where, parts)).drop(b, a)


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


def rejected_table(changes: DataFrame, plan: TablePlan) -> DataFrame:
    """Quarantine rows for every change of a table that cannot be applied at all (no key)."""
    rows = changes.where(F.col("qualified_table") == plan.qualified)
    return to_quarantine(rows.withColumn("reason", F.lit(plan.problem)))


def to_quarantine(rows: DataFrame) -> DataFrame:
    return rows.select(*QUARANTINE_COLUMNS)


def type_changes(changes: DataFrame, plan: TablePlan) -> DataFrame:
    """``typed_records`` of a table's changes, typed from their wire images by ``plan``."""
    rows = changes.where(F.col("qualified_table") == plan.qualified)
    return typed_records(
        _with_typed_parts(rows, plan, "__parts", F.lit(True)), "__parts", plan, plan
    )
