"""Planning: each table's name, key and column types, decided in plain Python from the few
schema groups a batch holds (one per table, format, image encoding and message schema; Spark
collects them in ``parse.schema_groups``), the configuration and what the change log holds.

Type evolution: schema versions are taken in order of appearance, each checked against the
types so far; widening is taken, an incompatible change rejects that schema's rows. Keys: the
table's ``primary_key``, else the source's, else the one the messages state, else the change
log's."""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from cdc_platform import formats
from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.formats import json_records
from cdc_platform.formats.column_specs import (
    STRING,
    ColumnSpec,
    common_type,
    configured_spec,
    hbase_spec,
)
from cdc_platform.lake.tables import ChangelogFacts

# What the change log holds already, by qualified table name.
Known = Mapping[str, ChangelogFacts]
_NOTHING = ChangelogFacts([], {})


@dataclass(frozen=True)
class SchemaGroup:
    """The changes of one table in one format, image encoding and message schema."""

    qualified_table: str
    source_format: str
    image_encoding: str | None
    schema_hash: int  # xxhash64 of the message schema, as the parse computes it
    value_schema: str | None
    group: str  # ``typed.group_column``'s value: what a plan made from this group covers
    first_seen: str  # the smallest sequence
    first_value: bytes | str | None  # that change's raw message
    keys: tuple[tuple[str, ...], ...] = ()  # key columns the messages state
    columns: tuple[str, ...] = ()  # every column an image names
    # (column, type) its JSON tokens say, merged over the group's messages (``infer_types``).
    inferred: tuple[tuple[str, str], ...] = ()


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
    # What the plan was made from (for ``parse.fits``): each schema group's ``group``, and
    # every image column, also those ``column_list`` leaves out.
    groups: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)
    # Per schema group (its ``group``), the columns its rows decode with the spec their own
    # schema states, then cast to the plan's type: one batch may hold a decimal at two scales,
    # or a timestamp in ms and in µs (a connector reconfigured), each decoded as written.
    group_specs: dict[str, dict[str, ColumnSpec]] = field(default_factory=dict)
    inferred: bool = False  # some types come from JSON tokens (``infer_types``)


def table_name(qualified: str) -> str:
    """Name of an undeclared source table: ``db.schema.table`` -> ``db__schema__table``."""
    parts = [re.sub(r"[^A-Za-z0-9_]+", "_", p).strip("_") or "_" for p in qualified.split(".")]
    name = "__".join(parts)
    return f"t_{name}" if name[0].isdigit() else name


def routed_name(qualified: str, source: SourceConfig) -> str:
    """The table name a qualified source name is stored under: declared, else derived."""
    cfg = match_table(qualified, source.tables)
    return cfg.name if cfg else table_name(qualified)


def match_table(qualified: str, tables: list[TableConfig]) -> TableConfig | None:
    """The declared table for a qualified name: exact, else a dotted suffix (``schema.table``)."""
    exact = [t for t in tables if t.match == qualified]
    suffix = [t for t in tables if qualified.endswith("." + t.match)]
    found = exact or sorted(suffix, key=lambda t: -len(t.match))
    return found[0] if found else None


def evolve(plan: TablePlan, col: str, spec: ColumnSpec, prior_type: str | None) -> str | None:
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
    # The wire decoder stays (base64 decimals, epoch days); each schema group's rows decode
    # with their own spec (``group_specs``) and are cast to the common type.
    plan.specs[col] = ColumnSpec(common, spec.decoder)
    return None


def stated_specs(source_format: str, value_schema: str | None) -> dict[str, ColumnSpec]:
    """Column types a message schema states ({} without one, or when it cannot be read)."""
    if not value_schema:
        return {}
    try:
        return formats.format_for(source_format).column_specs(value_schema)
    except (ValueError, TypeError, AttributeError, KeyError):
        return {}  # an unreadable schema leaves the columns to config or string


def _wire_order(group: SchemaGroup) -> list[str]:
    """The columns of a group's first message in wire order, for formats whose parsed images
    do not keep it ([] for the others)."""
    try:
        paths = formats.format_for(group.source_format).IMAGE_PATHS
    except ValueError:
        return []
    return json_records.wire_keys(group.first_value, paths) if paths else []


def plan_tables(
    groups: list[SchemaGroup], source: SourceConfig, known: Known | None = None
) -> dict[str, TablePlan]:
    """Decide key and column types of every table in ``groups``, by qualified name.

    ``known``: key and image column types of tables already in the change log, for batches that
    do not name them (e.g. one holding only a truncate)."""
    known = known or {}
    plans: dict[str, TablePlan] = {}
    for g in sorted(groups, key=lambda g: g.first_seen):
        plan = plans.get(g.qualified_table)
        if plan is None:
            name = routed_name(g.qualified_table, source)
            plan = plans[g.qualified_table] = TablePlan(name, g.qualified_table, [], {})
        cfg = match_table(g.qualified_table, source.tables)
        configured = set(_configured_types(source, cfg))
        _add_group(plan, g, known.get(g.qualified_table), configured, source.infers(cfg))
    for qualified, plan in plans.items():
        _finish(plan, source, match_table(qualified, source.tables), known.get(qualified))
    return plans


def _configured_types(source: SourceConfig, cfg: TableConfig | None) -> dict[str, str]:
    """The configured column types of a table: the source's, then the table's own."""
    return {**source.column_types, **(cfg.column_types if cfg else {})}


def _add_group(
    plan: TablePlan,
    g: SchemaGroup,
    facts: ChangelogFacts | None,
    configured: set[str],
    infer: bool,
) -> None:
    """One schema version, checked against the types so far (the table's, then earlier
    versions'); column order follows first appearance. A ``configured`` column's type is the
    configuration's, whatever the version states: it is not checked. ``infer``: a version
    without a schema types its columns by their JSON tokens."""
    if g.image_encoding == "hbase":
        plan.hbase = True
    plan.groups.add(g.group)
    plan.seen.update(g.columns)
    if facts is None and not plan.wire_order:
        plan.wire_order = _wire_order(g)
    known_types = (facts or _NOTHING).types
    stated = stated_specs(g.source_format, g.value_schema)
    plan.group_specs[g.group] = dict(stated)
    for col, spec in stated.items():
        if col in configured:
            continue
        prior = plan.specs[col].type if col in plan.typed_columns else known_types.get(col)
        if why := evolve(plan, col, spec, prior):
            plan.bad_schemas[g.schema_hash] = why
        plan.typed_columns.add(col)
    if infer and not stated:
        _infer(plan, g, known_types, configured)
    for col in g.columns:
        plan.specs.setdefault(col, STRING)
    for k in g.keys:
        if k and not plan.observed_key:
            plan.observed_key = list(k)


def _infer(plan: TablePlan, g: SchemaGroup, known: dict[str, str], configured: set[str]) -> None:
    """Types from a schemaless group's JSON tokens, widened with the types so far. A type the
    table cannot widen to keeps the table's: each value that does not fit it is then a type
    mismatch, row by row, rather than the whole version rejected."""
    for col, sql_type in g.inferred:
        if col in configured:
            continue
        prior = plan.specs[col].type if col in plan.typed_columns else known.get(col)
        if prior is not None and common_type(prior, sql_type) is None:
            sql_type = prior
        evolve(plan, col, ColumnSpec(sql_type), prior)
        plan.typed_columns.add(col)
        plan.inferred = True


# A variant type (``schema_of_variant``) -> the column type ``infer_types`` gives it.
_INTEGRAL_DIGITS = 18  # a DECIMAL(p,0) token of at most this many digits fits a bigint
_VARIANT_FIELD = re.compile(r"\s*(`(?:[^`]|``)*`|[^:]+):\s*")


def _variant_sql_type(variant: str) -> str | None:
    t = variant.strip().upper()
    if t == "BOOLEAN":
        return "boolean"
    if t in ("TINYINT", "SMALLINT", "INT", "BIGINT"):
        return "bigint"
    if m := re.fullmatch(r"DECIMAL\((\d+),\s*(\d+)\)", t):
        return "bigint" if m[2] == "0" and int(m[1]) <= _INTEGRAL_DIGITS else "double"
    if t in ("FLOAT", "DOUBLE"):
        return "double"
    if t == "VOID":  # only nulls seen: nothing to say
        return None
    return "string"  # strings, objects, arrays, and a mix of token types


def inferred_types(schema: str | None) -> dict[str, str]:
    """``schema_of_variant``'s ``OBJECT<a: BIGINT, `b c`: STRING>`` -> {column: SQL type}."""
    if not schema or not schema.startswith("OBJECT<"):
        return {}
    body, fields, depth, start, quoted = schema[len("OBJECT<") : -1], [], 0, 0, False
    for i, ch in enumerate(body):  # split on the top level's commas, outside `names`
        quoted ^= ch == "`"
        depth += {"<": 1, "(": 1, ">": -1, ")": -1}.get(ch, 0) if not quoted else 0
        if ch == "," and depth == 0 and not quoted:
            fields.append(body[start:i])
            start = i + 1
    fields.append(body[start:])
    out = {}
    for f in fields:
        m = _VARIANT_FIELD.match(f)
        if not m:
            continue
        name = m[1].strip()
        if name.startswith("`"):
            name = name[1:-1].replace("``", "`")
        if (sql_type := _variant_sql_type(f[m.end() :])) is not None:
            out[name] = sql_type
    return out


def _finish(
    plan: TablePlan, source: SourceConfig, cfg: TableConfig | None, facts: ChangelogFacts | None
) -> None:
    """Configured types and key, the kept columns and their order, and why the table cannot be
    applied, if it cannot."""
    known_key, known_types = facts or _NOTHING
    configured = _configured_types(source, cfg)
    for col, text in configured.items():
        spec, encoded = configured_spec(text)
        plan.specs[col] = hbase_spec(spec.type) if plan.hbase else spec
        for stated in plan.group_specs.values():
            # A schema that states the configured type itself keeps its decoder (base64 bytes,
            # epoch days); every other row decodes as the configuration says.
            if encoded or (col in stated and stated[col].type != spec.type):
                stated.pop(col, None)
        if not plan.hbase and (why := evolve(plan, col, plan.specs[col], known_types.get(col))):
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
        (cfg.primary_key if cfg else None) or source.primary_key or plan.observed_key or known_key
    )
    for k in plan.key:
        if k not in plan.specs and k in known_types:
            plan.specs[k] = ColumnSpec(known_types[k])
    if cfg is not None:  # column_list / except_column_list
        plan.specs = {c: spec for c, spec in plan.specs.items() if cfg.keeps(c, plan.key)}
    if plan.wire_order:  # columns the first message lacks keep their place after it
        rank = {c: i for i, c in enumerate(plan.wire_order)}
        plan.specs = dict(sorted(plan.specs.items(), key=lambda kv: rank.get(kv[0], len(rank))))
    plan.group_specs = _own_decoding(plan)
    missing = [k for k in plan.key if k not in plan.specs]
    if plan.problem:
        return
    if not plan.key:
        plan.problem = (
            f"no primary key known for table {plan.qualified}: set primary_key in sources.yaml"
            " (or --primary-key)"
        )
    elif missing:
        plan.problem = f"primary key column {missing[0]!r} is not a column of {plan.qualified}"


def _own_decoding(plan: TablePlan) -> dict[str, dict[str, ColumnSpec]]:
    """The group specs that decode differently from the plan's own (a text cast to the plan's
    type needs none). A spec every group states, in the plan's type, becomes the plan's own, so
    a table with one schema decodes without asking for the group."""
    if plan.hbase:
        return {}
    for c, spec in plan.specs.items():
        stated = [specs.get(c) for specs in plan.group_specs.values()]
        if stated and stated[0] is not None and stated[0].type == spec.type:
            if all(other == stated[0] for other in stated):
                plan.specs[c] = stated[0]
    own = {}
    for group, stated in plan.group_specs.items():
        differ = {
            c: spec
            for c, spec in stated.items()
            if c in plan.specs
            and spec != plan.specs[c]
            and not (spec.decoder == plan.specs[c].decoder == "cast")
        }
        if differ:
            own[group] = differ
    return own


def joined_plan(typed: TablePlan, rest: TablePlan | None) -> TablePlan:
    """The plan of a table whose rows were typed in the parse by ``typed`` and afterwards by
    ``rest`` (planned with ``typed``'s types as the table's): ``typed``'s columns, then the new
    ones; a type ``rest`` widened is the wider."""
    if rest is None:
        return typed
    joined = TablePlan(**{**vars(rest), "key": typed.key, "specs": {**typed.specs, **rest.specs}})
    joined.typed_columns = typed.typed_columns | rest.typed_columns
    joined.group_specs = {**typed.group_specs, **rest.group_specs}
    return joined
