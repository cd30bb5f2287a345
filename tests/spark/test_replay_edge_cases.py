"""Replays that once broke: a batch with only a truncate, user columns named like internals."""

import json

import pytest

from cdc_platform.catalog import SourceConfig
from cdc_platform.steps.current import current_rows
from cdc_platform.steps.replay import replay

pytestmark = pytest.mark.spark
SOURCE = SourceConfig(name="edge", format="auto")


def _event(op, pos, after=None, before=None):
    source = {"db": "app", "table": "t", "file": "mysql-bin.000001", "pos": pos, "row": 0,
              "ts_ms": 1_700_000_000_000 + pos}  # fmt: skip
    return {"before": before, "after": after, "source": source, "op": op, "ts_ms": 1}


def _land(tmp_path, name, records):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _rows(spark, warehouse):
    df = current_rows(spark, warehouse, "edge", "app__t")
    return sorted(tuple(r.values()) for r in df.toArrow().to_pylist())


def test_internal_names_as_columns_and_truncate_only_batch(spark, warehouse, tmp_path):
    row = {"k": 1, "n": "x", "op": "o", "sequence": "s", "image": "i"}
    first = _land(tmp_path, "a.kafka.jsonl", [
        {"offset": 0, "key": {"k": 1}, "value": _event("c", 10, after=row)},
        {"offset": 1, "key": {"k": 2}, "value": _event("c", 20, after={**row, "k": 2})},
    ])  # fmt: skip
    summary, _ = replay(spark, warehouse, [first], SOURCE, "2026-01-01")
    assert summary["tables"]["app.t"]["rows"] == 2
    assert _rows(spark, warehouse)[0] == ("1", "x", "o", "s", "i")

    # A truncate names no key columns: the table's recorded key applies.
    truncate = _land(tmp_path, "b.jsonl", [_event("t", 30)])
    summary, _ = replay(spark, warehouse, [truncate], SOURCE, "2026-01-02")
    assert summary["quarantined"] == 0
    assert _rows(spark, warehouse) == []
