"""``cdc-platform models compile|run|test``: output, and one-line errors with file and line."""

import json

import pytest

from cdc_platform import cli
from tests.models.conftest import ROOT

pytestmark = pytest.mark.spark
SOURCES = str(ROOT / "sources.yaml")


def test_compile_prints_each_models_sql_in_build_order(demo_warehouse, capsys):
    rc = cli.main(["models", "compile", "--sources", SOURCES, "--warehouse", str(demo_warehouse)])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.index("-- models/customer_order_totals (table)") < out.index(
        "-- models/big_spenders (view)"
    )
    assert "from `models__customer_order_totals`" in out
    assert "{{" not in out


def test_run_select_builds_one_model_and_test_reports_results(warehouse_copy, capsys):
    args = ["--sources", SOURCES, "--warehouse", str(warehouse_copy), "--select", "order_facts"]
    assert cli.main(["models", "run", *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(x) for x in lines] == [
        {"model": "order_facts", "materialized": "incremental", "rows": 20, "delta_version": 0,
         "merged": False}
    ]  # fmt: skip
    # The only failing test is a warning: exit 0.
    assert cli.main(["models", "test", *args]) == 0
    results = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert {r["test"]: r["passed"] for r in results} == {
        "order_id__unique": True, "order_id__not_null": True,
        "customer_id__relationships": False, "size__accepted_values": True,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"a.sql": "select 1 as id\nfrom {{ ref('nope') }}"}, "a.sql:2: unknown ref 'nope'"),
        (
            {"a.sql": "select * from {{ ref('b') }}", "b.sql": "select *\nfrom {{ ref('a') }}"},
            "models form a cycle: a -> b -> a (a.sql:1 ref('b'); b.sql:2 ref('a'))",
        ),
        ({"a.sql": "select 1 as id\nfrom (\n"}, "a.sql:2: SQL does not parse"),
    ],
)
def test_model_errors_are_one_line_with_file_and_line(
    demo_warehouse, tmp_path, capsys, files, message
):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    rc = cli.main(
        ["models", "compile", "--sources", SOURCES, "--warehouse", str(demo_warehouse),
         "--models", str(tmp_path)]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("cdc-platform: error: ") and err.count("\n") == 1
    assert message in err


def test_select_of_an_unknown_model_is_a_user_error(demo_warehouse, capsys):
    rc = cli.main(
        ["models", "run", "--sources", SOURCES, "--warehouse", str(demo_warehouse),
         "--select", "nope"]
    )  # fmt: skip
    assert rc == 2
    assert "no model named nope" in capsys.readouterr().err
