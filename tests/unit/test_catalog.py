"""sources.yaml validation: good files load, bad ones fail with one line naming the key."""

import datetime as dt
from pathlib import Path

import pytest

from cdc_platform.catalog import CatalogError, load_catalog

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "sources.yaml"
    p.write_text(text)
    return p


def test_demo_catalog_loads_with_paths_relative_to_the_file(monkeypatch):
    monkeypatch.delenv("CDC_WAREHOUSE", raising=False)
    catalog = load_catalog(ROOT / "sources.yaml")
    assert [s.name for s in catalog.sources] == ["shop", "lindorm", "crm"]
    crm = catalog.source("crm")
    assert (crm.transport, crm.kafka.bootstrap_servers) == ("kafka", "127.0.0.1:19092")
    assert (crm.sensor_interval_seconds, crm.max_lag(crm.tables[0])) == (5, 10)
    assert catalog.warehouse_uri == str(ROOT / "var" / "warehouse")
    assert catalog.source("lindorm").tables[0].column_types == {
        "f_name": "string",
        "f_city": "string",
    }


def test_environment_overrides_storage(tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "w"))
    assert load_catalog(ROOT / "sources.yaml").warehouse_uri == str(tmp_path / "w")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sources: [{name: a, format: nope}]", "sources.0: unknown format 'nope'"),
        ("sources: [{name: a, colour: red}]", "sources.0.colour: Extra inputs are not permitted"),
        ("sources: [{name: a, tables: [{name: t, column_types: {x: nubmer}}]}]",
         "sources.0.tables.0.column_types: unknown column type 'nubmer'"),
        ("sources: [{name: a, format: canal, format_options: {canal.convention: old}}]",
         "format option canal.convention='old' must be one of current, legacy"),
        ("sources: [{name: 1a}]", "sources.0.name: must be letters"),
        ("sources: [{name: a}, {name: a}]", "source names repeat"),
        ("warehouse: w", "sources: Field required"),
        ("sources: [", "not valid YAML"),
        ("sources: [{name: a, start_date: 2024-02-30}]",
         "sources.0.start_date: 2024-02-30 is not a real date (day is out of range for month)"),
        ("sources: [{name: a, start_date: '2024-1-5'}]",
         "sources.0.start_date: must be a date YYYY-MM-DD, not '2024-1-5'"),
        ("sources: [{name: a, start_date: 2024-01-05T10:00:00}]",
         "sources.0.start_date: must be a date YYYY-MM-DD"),
        ("sources: [{name: a, start_date: 20240105}]",
         "sources.0.start_date: must be a date YYYY-MM-DD, not 20240105"),
        ("sources: [{name: a, start_date: 2999-01-01}]",
         "sources.0.start_date: 2999-01-01 is after today"),
        ("sources: [{name: models}]", "sources.0.name: models is reserved"),
        ("maintenance: {retention_hours: 1}\nsources: []",
         "maintenance.retention_hours: Input should be greater than or equal to 24"),
        ("maintenance: {retention_hours: 720}\nsources: []",
         "maintenance.retention_hours: Input should be less than or equal to 168"),
        ("maintenance: {cron: daily}\nsources: []", "maintenance.cron: not a cron schedule"),
    ],
)  # fmt: skip
def test_bad_catalogs_name_the_problem(tmp_path, text, message):
    with pytest.raises(CatalogError) as err:
        load_catalog(_write(tmp_path, text))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_start_date_is_an_iso_date_up_to_today(tmp_path):
    catalog = load_catalog(_write(tmp_path, "sources: [{name: a, start_date: 2024-02-29}]"))
    assert catalog.source("a").start_date == dt.date(2024, 2, 29)
    today = dt.datetime.now(dt.UTC).date().isoformat()
    catalog = load_catalog(_write(tmp_path, f"sources: [{{name: a, start_date: '{today}'}}]"))
    assert catalog.source("a").start_date.isoformat() == today
    assert load_catalog(_write(tmp_path, "sources: [{name: a}]")).source("a").start_date is None


def test_missing_file(tmp_path):
    with pytest.raises(CatalogError, match="sources file not found"):
        load_catalog(tmp_path / "absent.yaml")
