"""Raw messages -> canonical, typed change log per table (+ quarantine), with Spark functions only.

Steps: the format parses each message into a parsed record with wire-text images; the records get
their total-order ``sequence`` (format position, then raw position); the few distinct (table,
schema) combinations are collected on the driver to decide each table's key and column types;
each table's images are then typed with native expressions. Whatever cannot be parsed, keyed or
typed becomes a quarantine row with its reason, raw bytes and coordinates.
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

QUARANTINE_COLUMNS = (
    "ingest_date", "topic", "partition", "offset", "timestamp", "key", "value", "file", "line",
    "reason", "source_format", "qualified_table",
)  # fmt: skip


def table_name(qualified: str) -> str:
    """Name of an undeclared source table: ``db.schema.table`` -> ``db__schema__table``."""
    parts = [re.sub(r"[^A-Za-z0-9_]+", "_", p).strip("_") or "_" for p in qualified.split(".")]
    name = "__".join(parts)
    return f"t_{name}" if name[0].isdigit() else name


def parse_messages(raw: DataFrame, source: SourceConfig) -> DataFrame:
    """Parsed records with ``sequence`` and ``qualified_table``; raw columns are kept."""
    parser = formats.parser_for(source.format)
    parsed = parser.parse(raw, source.format_options)
    return parsed.withColumn(
        "sequence", F.concat(F.coalesce("source_sequence", F.lit("")), F.lit("|"), C.raw_position())
    ).withColumn("qualified_table", F.concat_ws(".", "database", "schema", "table"))


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
    key_override: list[str] | None = None,
    types_override: dict[str, str] | None = None,
    known: dict[str, tuple[list[str], dict[str, str]]] | None = None,
) -> dict[str, TablePlan]:
    """Decide key and column types of every table in ``changes`` (one small aggregation).

    ``known``: key and image column types of tables already in the change log, by qualified
    name, for batches that do not name them (e.g. one holding only a truncate).
    """
    groups = (
        changes.groupBy(
            "qualified_table",
            "source_format",
            "image_encoding",
            F.xxhash64("value_schema").alias("h"),
        )
        .agg(
            F.first("value_schema", ignorenulls=True).alias("value_schema"),
            F.collect_set("key_columns").alias("keys"),
            F.array_distinct(
                F.flatten(
                    F.collect_set(
                        F.array_union(
                            F.coalesce(F.map_keys("after_image"), F.array().cast("array<string>")),
                            F.coalesce(F.map_keys("before_image"), F.array().cast("array<string>")),
                        )
                    )
                )
            ).alias("columns"),
            F.min("sequence").alias("first_seen"),
        )
        .orderBy("first_seen")
        .collect()
    )
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
        configured = {**(cfg.column_types if cfg else {}), **(types_override or {})}
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
            key_override
            or (cfg.primary_key if cfg else None)
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


def _typed_image(image: str, plan: TablePlan) -> Column:
    img = F.col(image)
    return F.when(
        img.isNotNull(),
        F.struct(*[decode(img[c], spec).alias(c) for c, spec in plan.specs.items()]),
    )


def _first_problem(plan: TablePlan) -> Column:
    """Why a typed change cannot be applied (null if it can): null key or undecodable value."""
    checks: list[tuple[Column, Column]] = [
        (F.xxhash64("value_schema") == F.lit(h), F.lit(why)) for h, why in plan.bad_schemas.items()
    ]
    key_image = F.when(F.col("op") == C.DELETE, F.col("before")).otherwise(F.col("after"))
    for k in plan.key:
        checks.append(
            (
                (F.col("op") != C.TRUNCATE) & key_image[k].isNull(),
                F.lit(f"primary key column {k!r} is null"),
            )
        )
    for image in ("before", "after"):
        for c, spec in plan.specs.items():
            wire = F.col(f"{image}_image")[c]
            checks.append(
                (
                    wire.isNotNull() & F.col(image)[c].isNull(),
                    F.concat(
                        F.lit(f"type mismatch: {image}.{c} = "),
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


def rejected_table(changes: DataFrame, plan: TablePlan) -> DataFrame:
    """Quarantine rows for every change of a table that cannot be applied at all (no key)."""
    rows = changes.where(F.col("qualified_table") == plan.qualified)
    return to_quarantine(rows.withColumn("reason", F.lit(plan.problem)))


def to_quarantine(rows: DataFrame) -> DataFrame:
    return rows.select(*QUARANTINE_COLUMNS)


def type_changes(changes: DataFrame, plan: TablePlan) -> DataFrame:
    """One pass for the change log and its rejects: the change-log columns, ``reason``, and
    what a quarantine row needs besides (``raw_key`` and ``value`` on rejected rows only)."""
    rows = changes.where(F.col("qualified_table") == plan.qualified)
    typed = (
        rows.withColumn("before", _typed_image("before_image", plan))
        .withColumn("after", _typed_image("after_image", plan))
        .withColumn("reason", _first_problem(plan))
    )
    key_image = F.when(F.col("op") == C.DELETE, F.col("before")).otherwise(F.col("after"))
    bad = F.col("reason").isNotNull()
    return typed.select(
        "op", "database", "schema", "table",
        F.struct(*[key_image[k].alias(k) for k in plan.key]).alias("key"),
        "before", "after",
        # Which columns a partial after image carries (null: a full image).
        F.when(F.col("after_partial"), F.map_keys("after_image")).alias("after_columns"),
        "sequence", "event_time", "tx_id", "source_format",
        "topic", "partition", "offset", "file", "line", "ingest_date",
        "reason", "timestamp", "qualified_table",
        F.when(bad, F.col("key")).alias("raw_key"), F.when(bad, F.col("value")).alias("value"),
    )  # fmt: skip
