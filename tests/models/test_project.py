"""Loading models without Spark: refs and sources, config, YAML tests, cycles, rendering."""

from pathlib import Path

import pytest

from cdc_platform import lake
from cdc_platform.models.compile import render, template_line
from cdc_platform.models.graph import build_order, select
from cdc_platform.models.project import ModelError, Relation, load_project

TABLES = {
    (layer, source, table)
    for layer in ("current", "changelog")
    for source, table in (("shop", "customers"), ("shop", "orders"), ("lindorm", "users"))
}


def write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_the_example_models_load_with_their_inputs_config_and_tests():
    project = load_project(Path(__file__).resolve().parents[2] / "dbt_like_models", TABLES)
    assert sorted(project.models) == [
        "big_spenders", "customer_order_totals", "daily_changes", "order_facts"
    ]  # fmt: skip
    totals = project.models["customer_order_totals"]
    assert totals.materialized == "table"
    # source() names a current table; ref() of a name that is no model is the current table.
    assert totals.inputs == [
        Relation("current", "shop", "customers"),
        Relation("current", "shop", "orders"),
    ]
    assert project.models["big_spenders"].inputs == [
        Relation("models", None, "customer_order_totals")
    ]
    changes = project.models["daily_changes"]
    assert {r.layer for r in changes.inputs} == {"changelog"}
    assert changes.partition_by == ["change_date"]
    facts = project.models["order_facts"]
    assert (facts.materialized, facts.unique_key) == ("incremental", ["order_id"])
    assert [t.name for t in facts.tests] == [
        "order_id__unique", "order_id__not_null", "customer_id__relationships",
        "size__accepted_values",
    ]  # fmt: skip
    rel = facts.tests[2]
    assert (rel.to, rel.field, rel.severity) == (
        Relation("current", "shop", "customers"),
        "id",
        "warn",
    )
    assert facts.tests[3].values == ("small", "medium", "large")
    assert totals.columns["customer_id"].startswith("The customer's id")
    order = build_order(project)
    assert order.index("customer_order_totals") < order.index("big_spenders")
    assert select(project, ["big_spenders", "customer_order_totals"]) == [
        "customer_order_totals", "big_spenders"
    ]  # fmt: skip


def test_refs_render_as_view_names_and_incremental_builds_read_changed_rows(tmp_path):
    folder = write(tmp_path / "m", {
        "a.sql": "{{ config(materialized='incremental', unique_key='id') }}\n"
                 "select o.id, c.name from {{ ref('orders') }} o\n"
                 "join {{ source('shop', 'customers', all_rows=True) }} c on c.id = o.id\n"
                 "{% if is_incremental() %}-- merging into {{ this }}{% endif %}\n",
        "b.sql": "select * from {{ ref('a') }}\n",
    })  # fmt: skip
    project = load_project(folder, TABLES)
    a = project.models["a"]
    first = render(project, a)
    assert "from `current__shop__orders` o" in first
    assert "join `current__shop__customers` c" in first
    assert first.splitlines()[0] == ""  # config() renders as nothing; lines stay put
    merge = render(project, a, incremental=True)
    assert "from `current__shop__orders__changed` o" in merge
    assert "join `current__shop__customers` c" in merge  # all_rows=True
    assert "-- merging into `models__a`" in merge
    assert render(project, project.models["b"]) == "select * from `models__a`\n"
    assert project.models["b"].materialized == "view"  # dbt's default


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (
            "select 1\nfrom {{ ref('custmers') }}",
            2,
            "unknown ref 'custmers'.*did you mean 'customers'",
        ),
        (
            "select *\n\nfrom {{ source('shop', 'nope') }}",
            3,
            r"unknown source shop.nope \(current\)",
        ),
        (
            "select * from {{ source('shop', 'orders', layer='raw') }}",
            1,
            r"source\(\) layer must be one of",
        ),
        ("{{ config(materialized='incremental') }}\nselect 1", 1, "needs unique_key"),
        ("{{ config(materialized='snapshot') }}", 1, "materialized must be one of"),
        ("{{ config(materialized='view', partition_by='d') }}", 1, "a view has no partitions"),
        ("{{ config(unique='id') }}", 1, "config\\(\\) takes"),
        ("select 1\nfrom {{ ref(name) }}", 2, r"ref\(\) arguments must be literals"),
        ("select 1\nfrom {{ ref('a' }}", 2, "template syntax"),
    ],
)
def test_a_bad_model_is_one_line_with_file_and_line(tmp_path, text, line, message):
    folder = write(tmp_path / "m", {"bad.sql": text})
    with pytest.raises(ModelError, match=f"bad.sql:{line}: .*{message}") as e:
        load_project(folder, TABLES)
    assert "\n" not in str(e.value)


def test_a_ref_to_a_table_in_several_sources_must_use_source(tmp_path):
    folder = write(tmp_path / "m", {"x.sql": "select * from {{ ref('users') }}"})
    tables = TABLES | {("current", "crm", "users")}
    with pytest.raises(
        ModelError,
        match=r"x.sql:1: ref\('users'\) is ambiguous: use source\('crm', 'users'\) or "
        r"source\('lindorm', 'users'\)",
    ):
        load_project(folder, tables)


def test_a_model_shadows_a_table_of_the_same_name(tmp_path):
    folder = write(
        tmp_path / "m",
        {"orders.sql": "select 1 as id", "x.sql": "select * from {{ ref('orders') }}"},
    )  # noqa: E501
    project = load_project(folder, TABLES)
    assert project.models["x"].inputs == [Relation(lake.MODELS, None, "orders")]


def test_a_cycle_names_the_models_files_and_lines(tmp_path):
    folder = write(tmp_path / "m", {
        "a.sql": "select * from {{ ref('b') }}",
        "b.sql": "select *\nfrom {{ ref('c') }}",
        "c.sql": "select *\n\nfrom {{ ref('a') }}",
        "d.sql": "select * from {{ ref('a') }}",
    })  # fmt: skip
    project = load_project(folder, TABLES)
    with pytest.raises(ModelError, match="models form a cycle") as e:
        build_order(project)
    message = str(e.value)
    for step in ("a.sql:1 ref('b')", "b.sql:2 ref('c')", "c.sql:3 ref('a')"):
        assert step in message
    assert "d" not in message.split("(")[0].replace("models form a cycle", "")


def test_yaml_mistakes_are_reported(tmp_path):
    folder = write(tmp_path / "m", {
        "x.sql": "select 1 as id",
        "x.yml": "columns:\n  - name: id\n    tests: [unique, {between: {min: 1}}]\n",
    })  # fmt: skip
    with pytest.raises(ModelError, match=r"x.yml: column id: unknown test"):
        load_project(folder, TABLES)
    (folder / "x.yml").write_text(
        "columns:\n  - name: id\n    tests:\n"
        "      - relationships: {to: \"ref('nope')\", field: id}\n"
    )
    with pytest.raises(ModelError, match="unknown ref 'nope'"):
        load_project(folder, TABLES)
    (folder / "x.yml").write_text("columns: [\n")
    with pytest.raises(ModelError, match=r"x.yml:\d+: not valid YAML"):
        load_project(folder, TABLES)


def test_two_tests_of_one_kind_get_distinct_check_names(tmp_path):
    folder = write(tmp_path / "m", {
        "x.sql": "select 'a' as s",
        "x.yml": "columns:\n  - name: s\n    tests:\n"
                 "      - accepted_values: {values: [a]}\n"
                 "      - accepted_values: {values: [a, b], severity: warn}\n",
    })  # fmt: skip
    tests = load_project(folder, TABLES).models["x"].tests
    assert [t.name for t in tests] == ["s__accepted_values", "s__accepted_values_2"]


def test_lines_of_compiled_sql_map_back_to_the_file(tmp_path):
    text = "{% if is_incremental() %}\nwhere x\n{% endif %}\nselect 1\nfrom t frm\n"
    folder = write(tmp_path / "m", {"x.sql": text})
    project = load_project(folder, TABLES)
    model = project.models["x"]
    sql = render(project, model)
    assert sql.splitlines()[2] == "from t frm"  # two lines fewer than the file
    assert template_line(model, sql, 3) == 5
