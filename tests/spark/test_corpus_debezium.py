"""The Debezium files of ../shared/corpus, replayed end to end, against EXPECTED.json."""

import struct

import pytest

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.normalize import table_name
from cdc_platform.steps.current import current_rows
from cdc_platform.steps.replay import replay
from tests.conftest import CORPUS

pytestmark = pytest.mark.spark

DEBEZIUM_FILES = sorted(str(p.relative_to(CORPUS)) for p in (CORPUS / "debezium").glob("*.txt"))
# EXPECTED.json names Kafka Connect types; schema-less files get them from configuration.
CONNECT_TO_SQL = {"int32": "int", "int64": "bigint", "string": "string", "double": "double"}


def _column_types(entry: dict) -> dict[str, str]:
    return {c: CONNECT_TO_SQL[t.split()[0]] for c, t in entry["column_types"].items()}


def _float32(x: float | None) -> float | None:
    return None if x is None else struct.unpack("f", struct.pack("f", x))[0]


def _comparable(rows: list[dict], entry: dict) -> list[dict]:
    f32 = [c for c, how in entry.get("compare", {}).items() if how == "float32"]
    return [{c: _float32(v) if c in f32 else v for c, v in r.items()} for r in rows]


def _replay(spark, warehouse, entry: dict, path) -> tuple[dict, list[dict]]:
    summary, _ = replay(
        spark,
        warehouse,
        [path],
        SourceConfig(
            name="corpus",
            format="debezium",
            primary_key=entry["primary_key"],
            column_types=_column_types(entry),
        ),
        "2026-01-01",
    )
    rows = current_rows(spark, warehouse, "corpus", table_name(entry["table"]))
    ordered = rows.orderBy(*entry["primary_key"]).toArrow().to_pylist()
    return summary, ordered


@pytest.mark.parametrize("name", DEBEZIUM_FILES)
def test_corpus_file_reaches_final_state(spark, warehouse, expected, name):
    entry = expected[name]
    summary, rows = _replay(spark, warehouse, entry, CORPUS / name)

    assert _comparable(rows, entry) == _comparable(entry["final_state"], entry)
    counts = summary["tables"][entry["table"]]
    unappliable = len(entry.get("unappliable_messages", []))
    assert counts["inserted"] == entry["counts"]["insert"]
    assert counts["updated"] == entry["counts"]["update"]
    assert counts["deleted"] == entry["counts"]["delete"] - unappliable
    assert summary["quarantined"] == unappliable


def test_unidentifiable_delete_is_quarantined_not_applied(spark, warehouse, expected):
    name = "debezium/debezium-postgres-data-replica-identity.txt"
    _replay(spark, warehouse, expected[name], CORPUS / name)

    quarantine = lake.read(spark, lake.TableRef(lake.QUARANTINE, "corpus").uri(warehouse))
    rows = quarantine.toArrow().to_pylist()
    assert [r["line"] for r in rows] == [m["line"] for m in expected[name]["unappliable_messages"]]
    assert "cannot be identified" in rows[0]["reason"]
    assert rows[0]["value"] == (CORPUS / name).read_bytes().splitlines()[15]


@pytest.mark.slow
def test_replaying_twice_changes_nothing(spark, warehouse, expected):
    name = "debezium/debezium-data-schema-include.txt"
    entry = expected[name]
    _, first = _replay(spark, warehouse, entry, CORPUS / name)
    cur = lake.TableRef(lake.CURRENT, "corpus", table_name(entry["table"])).uri(warehouse)
    changelog = lake.TableRef(lake.CHANGELOG, "corpus", table_name(entry["table"])).uri(warehouse)
    before = lake.read(spark, cur).toArrow()

    _, second = _replay(spark, warehouse, entry, CORPUS / name)

    assert second == first
    assert lake.read(spark, cur).sort(*entry["primary_key"]).toArrow() == before.sort_by(
        [(k, "ascending") for k in entry["primary_key"]]
    )
    assert lake.read(spark, changelog).count() == entry["counts"]["insert"] + 4 + 1
