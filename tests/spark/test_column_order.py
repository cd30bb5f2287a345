"""A new table's columns follow the order its first message writes them in, also for the formats
whose parse reads a message as a variant (Canal, Maxwell, OGG), which holds its keys sorted; a
column that only a later message has comes after them."""

import json

import pytest

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.formats import canonical as C
from cdc_platform.steps.replay import replay

pytestmark = pytest.mark.spark

FIRST = {"zeta": "1", "id": "7", "mid": "x"}  # deliberately not alphabetical
LATER = {"zeta": "2", "id": "8", "mid": "y", "added": "z"}


def _canal(row: dict, i: int) -> dict:
    types = {c: "varchar(10)" for c in row}
    return {"data": [row], "database": "db", "table": "t", "type": "INSERT", "isDdl": False,
            "pkNames": ["id"], "mysqlType": types, "es": 1000 + i, "ts": 1000 + i}  # fmt: skip


def _maxwell(row: dict, i: int) -> dict:
    return {"database": "db", "table": "t", "type": "insert", "ts": 1 + i, "xid": i,
            "commit": True, "data": row, "primary_key_columns": ["id"]}  # fmt: skip


def _ogg(row: dict, i: int) -> dict:
    return {"table": "DB.T", "op_type": "I", "op_ts": "2026-01-01 00:00:00.000000",
            "pos": f"{i:020d}", "primary_keys": ["id"], "after": row}  # fmt: skip


@pytest.mark.parametrize(
    ("fmt", "message", "table"),
    [
        ("canal", _canal, "db__t"),
        ("maxwell", _maxwell, "db__t"),
        ("ogg", _ogg, "DB__T"),
    ],  # fmt: skip
)
def test_a_new_tables_columns_keep_the_wire_order(spark, tmp_path, fmt, message, table):
    landing = tmp_path / "events.jsonl"
    lines = [json.dumps(message(row, i)) for i, row in enumerate([FIRST, LATER])]
    landing.write_text("\n".join(lines) + "\n")
    source = SourceConfig(name="s", format=fmt)
    replay(spark, tmp_path / "wh", [landing], source, "2026-01-01")
    log = lake.read(spark, lake.TableRef(lake.CHANGELOG, "s", table).uri(tmp_path / "wh"))
    assert log.schema["after"].dataType.names == ["zeta", "id", "mid", "added"]
    current = lake.read(spark, lake.TableRef(lake.CURRENT, "s", table).uri(tmp_path / "wh"))
    user = [c for c in current.columns if c not in C.CURRENT_META]
    assert user == ["zeta", "id", "mid", "added"]
    rows = {r["id"]: r["added"] for r in current.collect()}
    assert rows == {"7": None, "8": "z"}
