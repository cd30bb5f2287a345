"""format: auto on one topic that mixes formats: each message goes to its own table."""

import itertools
import struct

import pytest

from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.steps.merge import current_rows
from cdc_platform.steps.replay import replay
from tests.conftest import CORPUS

pytestmark = pytest.mark.spark

MIXED = {
    "debezium/debezium-postgres-data-schema-exclude.txt": "pg_products",
    "canal/canal-data.txt": "canal_products",
    "maxwell/maxwell-data.txt": "maxwell_product",
    "ogg/ogg-data.txt": "ogg_tbl_test",
}
SQL_TYPES = {"int32": "int", "INT": "int", "string": "string", "STRING": "string",
             "double": "double", "FLOAT": "double"}  # fmt: skip


def _f32(x):
    return None if x is None else struct.unpack("f", struct.pack("f", x))[0]


def test_a_topic_mixing_four_formats_replays_to_the_right_tables(
    spark, warehouse, expected, tmp_path
):
    # Interleave the files line by line: each table keeps its own order, the topic mixes them.
    lines = [(CORPUS / name).read_text().splitlines() for name in MIXED]
    mixed = [line for group in itertools.zip_longest(*lines) for line in group if line]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(mixed) + "\n")
    tables = [
        TableConfig(
            name=table,
            source_table=expected[name]["table"],
            primary_key=expected[name]["primary_key"],
            # Canal carries its types; the others are configured like a user would.
            column_types={}
            if name.startswith("canal")
            else {c: SQL_TYPES[t.split()[0]] for c, t in expected[name]["column_types"].items()},
        )
        for name, table in MIXED.items()
    ]
    source = SourceConfig(name="mixed", format="auto", tables=tables)

    summary, result = replay(spark, warehouse, [path], source, "2026-01-01")

    assert summary["quarantined"] == 0
    assert result.ddl == expected["canal/canal-data.txt"]["counts"]["other"]
    for name, table in MIXED.items():
        entry = expected[name]
        rows = current_rows(spark, warehouse, "mixed", table)
        got = rows.orderBy("id").toArrow().to_pylist()
        want = entry["final_state"]
        assert [{**r, "weight": _f32(r["weight"])} for r in got] == [
            {**r, "weight": _f32(r["weight"])} for r in want
        ], name
