"""Planning in plain Python: keys, type evolution, configured types, kept columns and their order,
decided from schema groups as Spark collects them (``normalize.parse.schema_groups``), with no
Spark session. The Spark tests check the same rules end to end on real messages."""

import json

from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.formats.column_specs import STRING, ColumnSpec, hbase_spec
from cdc_platform.lake import ChangelogFacts
from cdc_platform.normalize.plan import (
    SchemaGroup,
    joined_plan,
    match_table,
    plan_tables,
    routed_name,
    table_name,
)

QUALIFIED = "inv.products"


def _schema(**types: str) -> str:
    """A Debezium JsonConverter envelope schema whose images have ``types`` (Connect types)."""
    fields = [{"field": c, "type": t, "optional": True} for c, t in types.items()]
    image = {"type": "struct", "fields": fields, "optional": True}
    return json.dumps({"type": "struct", "fields": [{**image, "field": "after"}]})


def _group(
    seq: str,
    columns: tuple[str, ...],
    value_schema: str | None = None,
    keys: tuple[tuple[str, ...], ...] = (),
    fmt: str = "debezium",
    encoding: str | None = "json",
    first_value: str | None = None,
    qualified: str = QUALIFIED,
) -> SchemaGroup:
    schema_hash = hash(value_schema) if value_schema else 0
    return SchemaGroup(
        qualified_table=qualified,
        source_format=fmt,
        image_encoding=encoding,
        schema_hash=schema_hash,
        value_schema=value_schema,
        group=f"{fmt}|{encoding}|{schema_hash}",
        first_seen=seq,
        first_value=first_value,
        keys=keys,
        columns=columns,
    )


def _source(**options) -> SourceConfig:
    return SourceConfig(name="s", format="debezium", **options)


def _types(plan) -> dict[str, str]:
    return {c: s.type for c, s in plan.specs.items()}


def test_names_are_declared_or_derived():
    source = _source(tables=[TableConfig(name="items", source_table="products")])
    assert routed_name("inv.products", source) == "items"  # a dotted suffix matches
    assert routed_name("inv.orders", source) == "inv__orders"
    assert table_name("1db.my-schema.t") == "t_1db__my_schema__t"
    exact = TableConfig(name="exact", source_table="inv.products")
    assert match_table("inv.products", [*source.tables, exact]).name == "exact"


def test_the_key_is_the_tables_then_the_sources_then_the_messages_then_the_change_logs():
    stated = _group("1", ("id", "sku"), keys=(("id",),))
    known = {QUALIFIED: ChangelogFacts(["known"], {"known": "int"})}
    table = TableConfig(name="products", source_table=QUALIFIED, primary_key=["sku"])
    assert plan_tables([stated], _source(tables=[table]))[QUALIFIED].key == ["sku"]
    assert plan_tables([stated], _source(primary_key=["sku"]))[QUALIFIED].key == ["sku"]
    assert plan_tables([stated], _source(), known)[QUALIFIED].key == ["id"]
    plan = plan_tables([_group("1", ("id",))], _source(), known)[QUALIFIED]
    # The change log's key column keeps its type although this batch does not name it.
    assert plan.key == ["known"] and plan.specs["known"] == ColumnSpec("int")


def test_a_table_without_a_usable_key_cannot_be_applied():
    plan = plan_tables([_group("1", ("id",))], _source())[QUALIFIED]
    assert plan.problem.startswith("no primary key known for table inv.products")
    plan = plan_tables([_group("1", ("id",))], _source(primary_key=["sku"]))[QUALIFIED]
    assert plan.problem == "primary key column 'sku' is not a column of inv.products"


def test_schema_versions_widen_in_order_and_an_incompatible_one_is_rejected():
    v1 = _group("1", ("id", "n"), _schema(id="int32", n="int32"), keys=(("id",),))
    v2 = _group("2", ("id", "n"), _schema(id="int64", n="int32"))
    v3 = _group("3", ("id", "n"), _schema(id="int64", n="string"))
    plan = plan_tables([v3, v1, v2], _source())[QUALIFIED]  # taken by first appearance
    assert _types(plan) == {"id": "bigint", "n": "int"}
    assert list(plan.bad_schemas) == [v3.schema_hash]
    assert (
        "column 'n' of inv.products changes from int to string" in plan.bad_schemas[v3.schema_hash]
    )
    assert plan.groups == {v1.group, v2.group, v3.group} and plan.problem is None


def test_the_change_logs_types_bound_a_new_schema_and_win_over_guesses():
    known = {QUALIFIED: ChangelogFacts(["id"], {"id": "bigint", "n": "int", "note": "date"})}
    stated = _group("1", ("id", "n", "note"), _schema(id="int32", n="string"))
    plan = plan_tables([stated], _source(), known)[QUALIFIED]
    # int fits in the table's bigint; string does not fit in int; note is untyped here: a guess.
    assert _types(plan) == {"id": "bigint", "n": "int", "note": "date"}
    assert len(plan.bad_schemas) == 1


def test_configured_types_win_and_an_incompatible_one_blocks_the_table():
    stated = _group("1", ("id", "price"), _schema(id="int32", price="string"), keys=(("id",),))
    table = TableConfig(name="p", source_table=QUALIFIED, column_types={"price": "decimal(10,2)"})
    plan = plan_tables([stated], _source(tables=[table], column_types={"id": "bigint"}))[QUALIFIED]
    assert _types(plan) == {"id": "bigint", "price": "decimal(10,2)"}
    known = {QUALIFIED: ChangelogFacts(["id"], {"id": "int", "price": "date"})}
    plan = plan_tables([stated], _source(tables=[table]), known)[QUALIFIED]
    assert "changes from date to decimal(10,2)" in plan.problem


def test_column_lists_keep_the_key_and_the_first_message_orders_the_columns():
    first = json.dumps({"data": {"b": "1", "id": "2", "a": "3"}, "type": "insert"})
    maxwell = _group("1", ("a", "b", "id", "z"), fmt="maxwell", first_value=first)
    table = TableConfig(
        name="p", source_table=QUALIFIED, primary_key=["id"], except_column_list=["a"]
    )
    plan = plan_tables([maxwell], _source(tables=[table]))[QUALIFIED]
    assert list(plan.specs) == ["b", "id", "z"]  # wire order; z, not in the first, last
    assert plan.seen == {"a", "b", "id", "z"}  # what the parse may type: a is seen, not kept
    table = TableConfig(name="p", source_table=QUALIFIED, primary_key=["id"], column_list=["b"])
    assert list(plan_tables([maxwell], _source(tables=[table]))[QUALIFIED].specs) == ["b", "id"]


def test_hbase_cells_decode_from_bytes():
    cells = _group("1", ("row", "n", "bin"), keys=(("row",),), fmt="lindorm", encoding="hbase")
    plan = plan_tables([cells], _source(column_types={"n": "bigint", "bin": "binary"}))[QUALIFIED]
    assert plan.hbase
    assert plan.specs == {
        "row": hbase_spec(None),
        "n": hbase_spec("bigint"),
        "bin": hbase_spec("binary"),
    }


def test_a_joined_plan_keeps_the_parses_columns_then_the_new_ones():
    v1 = _group("1", ("id", "n"), _schema(id="int32", n="int32"), keys=(("id",),))
    typed = plan_tables([v1], _source())[QUALIFIED]
    known = {QUALIFIED: ChangelogFacts(typed.key, _types(typed))}
    v2 = _group("2", ("id", "n", "m"), _schema(id="int64", n="int32", m="string"))
    rest = plan_tables([v2], _source(), known)[QUALIFIED]
    joined = joined_plan(typed, rest)
    assert _types(joined) == {"id": "bigint", "n": "int", "m": "string"}
    assert joined.key == ["id"] and joined_plan(typed, None) is typed
    assert rest.specs["m"] == STRING
