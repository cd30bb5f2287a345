"""The whole ../shared/corpus replayed, and every table it leaves, as comparable text.

``REPLAYS``: the fewest replays that cover the corpus (the standalone-cluster test replays the
same ones). A replay sets one key and one set of column types for every table it finds: the
Debezium, Maxwell and OGG files need them (no schema, or none Spark can use); Canal and
DataWorks carry their own, and these change no value; but Canal's filter-table file has tables
with other keys, so it replays without. A replay merges its files' changes of a table into one
table: files of one table (three PostgreSQL files, two Canal, three DataWorks) go to different
sources.

``tables(warehouse)``: every Delta table under a warehouse (raw, change logs, DDL and control
logs, quarantine, current), each as its rows in JSON, sorted. tests/fixtures/corpus_tables.json
holds them as the replay left them when it was last accepted: a change in any output shows."""

import json
from pathlib import Path

from cdc_platform import lake
from tests.conftest import CORPUS, FIXTURES

SNAPSHOT = FIXTURES / "corpus_tables.json"
DATE = "2026-01-01"
PRIMARY_KEY = ["id"]
COLUMN_TYPES = {"id": "int", "name": "string", "description": "string", "weight": "double"}
TYPED = ["--primary-key", ",".join(PRIMARY_KEY)] + [
    arg for col_type in COLUMN_TYPES.items() for arg in ("--column-type", "=".join(col_type))
]
REPLAYS = {
    "corpus_a": (
        True,
        [
            "debezium/debezium-data-schema-include.txt",
            "debezium/debezium-postgres-data-schema-include.txt",
            "maxwell/maxwell-data.txt",
            "ogg/ogg-data.txt",
            "canal/canal-data.txt",
            "dataworks/event-insert.txt",
        ],
    ),
    "corpus_b": (
        True,
        [
            "debezium/debezium-postgres-data-schema-exclude.txt",
            "canal/canal-data-with-init.txt",
            "dataworks/event-update-in-one.txt",
        ],
    ),
    "corpus_c": (
        True,
        ["debezium/debezium-postgres-data-replica-identity.txt", "dataworks/event-delete.txt"],
    ),
    "corpus_d": (False, ["canal/canal-data-filter-table.txt"]),
}


def tables(warehouse: str | Path) -> dict[str, list[str]]:
    """``layer/source/table`` -> the table's rows as sorted JSON lines (read with delta-rs; the
    corpus folder's path replaced, so any clone gives the same text)."""
    corpus = str(CORPUS.resolve())
    found = {}
    warehouse = str(warehouse)
    for layer in sorted(lake.LAYERS):
        for folder in lake.folders(lake.storage.join(warehouse, layer)):
            uris = (
                [folder]
                if lake.exists(folder)
                else lake.tables_under(warehouse, layer, lake.storage.name(folder))
            )
            for uri in uris:
                rows = lake.read_arrow(uri).to_pylist()
                text = [json.dumps(r, sort_keys=True, default=str).replace(corpus, "<corpus>")
                        for r in rows]  # fmt: skip
                found[lake.storage.relative(uri, warehouse)] = sorted(text)
    return found


def accept(found: dict[str, list[str]]) -> None:
    SNAPSHOT.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")


def assert_accepted(found: dict[str, list[str]], only: str | None = None) -> None:
    """``found`` holds the accepted tables (``only``: of that source), each with the accepted
    rows."""
    accepted = json.loads(SNAPSHOT.read_text())
    if only is not None:
        accepted = {k: v for k, v in accepted.items() if k.split("/")[1] == only}
    assert sorted(found) == sorted(accepted)
    for table, rows in accepted.items():
        assert found[table] == rows, table
