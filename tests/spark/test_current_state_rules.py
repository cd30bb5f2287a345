"""Current-state rules beyond ordering: TOAST placeholders, null updates, column selection,
dropped columns, type widening, incompatible type changes, tombstone retention."""

import json

import pytest

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.steps.current import current_rows, merge_current
from cdc_platform.steps.replay import replay

pytestmark = pytest.mark.spark
NOW_MS = 1_900_000_000_000  # 2030: event times in the future of any test run
OLD_MS = 1_600_000_000_000  # 2020


def _field(name, connect_type):
    return {"field": name, "type": connect_type, "optional": True}


def _event(op, lsn, after=None, before=None, types=None, ts_ms=NOW_MS):
    """A Debezium Postgres event; with ``types`` (column -> Connect type) in the schema envelope."""
    payload = {
        "before": before, "after": after, "op": op, "ts_ms": ts_ms,
        "source": {"db": "app", "schema": "public", "table": "t", "lsn": lsn, "ts_ms": ts_ms},
    }  # fmt: skip
    if types is None:
        return payload
    image = {"type": "struct", "fields": [_field(c, t) for c, t in types.items()]}
    schema = {
        "type": "struct",
        "fields": [{**image, "field": "before"}, {**image, "field": "after"}],
    }
    return {"schema": schema, "payload": payload}


def _replay(spark, warehouse, tmp_path, day, events, table=None):
    path = tmp_path / f"dt={day}" / "events.kafka.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    images = [e.get("payload", e) for e in events]
    keys = [{"id": (i["after"] or i["before"])["id"]} for i in images]
    lines = [
        {"offset": i, "key": k, "value": e}
        for i, (k, e) in enumerate(zip(keys, events, strict=True))
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    source = SourceConfig(
        name="s",
        format="debezium",
        tables=[table or TableConfig(name="t", source_table="app.public.t")],
    )
    summary, result = replay(spark, warehouse, [path], source, day)
    return result


def _rows(spark, warehouse):
    df = current_rows(spark, warehouse, "s", "t")
    return sorted(df.toArrow().to_pylist(), key=lambda r: r["id"])


def test_toast_placeholder_keeps_the_previous_value(spark, warehouse, tmp_path):
    _replay(spark, warehouse, tmp_path, "2026-01-01", [
        _event("c", 10, after={"id": 1, "name": "a", "doc": "long text", "tags": ["x"]}),
        _event("c", 11, after={"id": 2, "name": "b", "doc": "other", "tags": ["y"]}),
        # Unchanged TOASTed columns: text, and an array of them.
        _event("u", 12, after={"id": 1, "name": "A", "doc": "__debezium_unavailable_value",
                               "tags": ["__debezium_unavailable_value"]}),
    ])  # fmt: skip
    _replay(spark, warehouse, tmp_path, "2026-01-02", [
        _event("u", 20, after={"id": 2, "name": "B", "doc": "__debezium_unavailable_value",
                               "tags": ["z"]}),
    ])  # fmt: skip
    assert _rows(spark, warehouse) == [
        {"id": "1", "name": "A", "doc": "long text", "tags": '["x"]'},
        {"id": "2", "name": "B", "doc": "other", "tags": '["z"]'},
    ]


@pytest.mark.parametrize("ignore", [True, False])
def test_ignore_null_updates(spark, warehouse, tmp_path, ignore):
    table = TableConfig(name="t", source_table="app.public.t", ignore_null_updates=ignore)
    _replay(spark, warehouse, tmp_path, "2026-01-01", [
        _event("c", 10, after={"id": 1, "name": "a", "city": "x"}),
        _event("u", 11, after={"id": 1, "name": None, "city": "y"}),
    ], table)  # fmt: skip
    assert _rows(spark, warehouse) == [{"id": "1", "name": "a" if ignore else None, "city": "y"}]


def test_column_list_and_except_column_list(spark, warehouse, tmp_path):
    events = [_event("c", 10, after={"id": 1, "name": "a", "secret": "s", "city": "x"})]
    only = TableConfig(name="t", source_table="app.public.t", column_list=["name"])
    _replay(spark, warehouse, tmp_path, "2026-01-01", events, only)
    assert _rows(spark, warehouse) == [{"id": "1", "name": "a"}]
    other = tmp_path / "other"
    without = TableConfig(name="t", source_table="app.public.t", except_column_list=["secret"])
    _replay(spark, other, tmp_path, "2026-01-01", events, without)
    assert _rows(spark, other) == [{"id": "1", "name": "a", "city": "x"}]


def test_column_dropped_at_the_source_becomes_null(spark, warehouse, tmp_path):
    _replay(spark, warehouse, tmp_path, "2026-01-01", [
        _event("c", 10, after={"id": 1, "name": "a", "city": "x"}),
    ])  # fmt: skip
    _replay(spark, warehouse, tmp_path, "2026-01-02", [
        _event("u", 20, after={"id": 1, "name": "b"}),
    ])  # fmt: skip
    assert _rows(spark, warehouse) == [{"id": "1", "name": "b", "city": None}]


def test_new_column_and_widened_type(spark, warehouse, tmp_path):
    v1 = {"id": "int32", "qty": "int32"}
    _replay(spark, warehouse, tmp_path, "2026-01-01", [
        _event("c", 10, after={"id": 1, "qty": 5}, types=v1),
    ])  # fmt: skip
    v2 = {"id": "int32", "qty": "int64", "note": "string"}
    big = 2**40
    _replay(spark, warehouse, tmp_path, "2026-01-02", [
        _event("c", 20, after={"id": 2, "qty": big, "note": "n"}, types=v2),
    ])  # fmt: skip
    assert _rows(spark, warehouse) == [
        {"id": 1, "qty": 5, "note": None},
        {"id": 2, "qty": big, "note": "n"},
    ]
    cur = lake.arrow_schema(lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse))
    assert str(cur.field("qty").type) == "int64"
    changelog = lake.image_types(lake.TableRef(lake.CHANGELOG, "s", "t").uri(warehouse))
    assert changelog["qty"] == "bigint"


def test_incompatible_type_change_is_quarantined(spark, warehouse, tmp_path):
    v1 = {"id": "int32", "qty": "int32"}
    _replay(spark, warehouse, tmp_path, "2026-01-01", [
        _event("c", 10, after={"id": 1, "qty": 5}, types=v1),
    ])  # fmt: skip
    result = _replay(spark, warehouse, tmp_path, "2026-01-02", [
        _event("u", 20, after={"id": 1, "qty": "five"}, types={"id": "int32", "qty": "string"}),
        _event("c", 21, after={"id": 2, "qty": 7}, types=v1),
    ])  # fmt: skip
    assert list(result.quarantine_reasons) == [
        "incompatible schema change: column 'qty' of app.public.t changes from int to string;"
        " set column_types or rebuild the table"
    ]
    assert _rows(spark, warehouse) == [{"id": 1, "qty": 5}, {"id": 2, "qty": 7}]


@pytest.mark.parametrize("retention", [None, 30.0])
def test_tombstone_retention(spark, warehouse, tmp_path, retention):
    table = TableConfig(name="t", source_table="app.public.t", tombstone_retention_days=retention)
    _replay(spark, warehouse, tmp_path, "2026-01-01", [
        _event("c", 10, after={"id": 1, "name": "a"}, ts_ms=OLD_MS),
        _event("d", 11, before={"id": 1, "name": "a"}, ts_ms=OLD_MS),
        _event("c", 12, after={"id": 2, "name": "b"}, ts_ms=OLD_MS),
        _event("d", 13, before={"id": 2, "name": "b"}, ts_ms=NOW_MS),
    ], table)  # fmt: skip
    merged = merge_current(spark, warehouse, "s", "t", options=table)
    assert merged.rows == 0
    # The 2020 tombstone is past 30 days; the 2030 one is not.
    assert merged.deleted_rows == (2 if retention is None else 1)


def test_ddl_events_are_kept_per_table(spark, warehouse, tmp_path):
    alter = "ALTER TABLE t ADD COLUMN note text"
    schema_change = {
        "source": {"db": "app", "schema": "public", "table": "t", "lsn": 15, "ts_ms": NOW_MS},
        "databaseName": "app", "ddl": alter, "ts_ms": NOW_MS,
    }  # fmt: skip
    path = tmp_path / "dt=2026-01-01" / "events.kafka.jsonl"
    path.parent.mkdir(parents=True)
    records = [
        {"offset": 0, "key": {"id": 1}, "value": _event("c", 10, after={"id": 1, "name": "a"})},
        {"offset": 1, "value": schema_change},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    source = SourceConfig(name="s", format="debezium", tables=[TableConfig(name="t")])
    for _ in range(2):  # reprocessing the date replaces its DDL rows
        _, result = replay(spark, warehouse, [path], source, "2026-01-01")
        assert result.ddl_by_table == {"t": 1}
    ddl = lake.read(spark, lake.TableRef(lake.DDL, "s", "t").uri(warehouse)).toArrow().to_pylist()
    assert [(r["statement"], r["table"], r["offset"]) for r in ddl] == [(alter, "t", 1)]
