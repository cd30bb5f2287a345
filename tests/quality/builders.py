"""Tables shaped like the warehouse's, written with delta-rs, for the suite tests."""

import datetime as dt
from pathlib import Path

import pyarrow as pa

from cdc_platform import lake

DATE = "2026-03-01"
ROW = pa.struct([pa.field("id", pa.int32()), pa.field("name", pa.string())])
CHANGELOG = pa.schema(
    [
        ("op", pa.string()), ("database", pa.string()), ("schema", pa.string()),
        ("table", pa.string()), ("key", pa.struct([pa.field("id", pa.int32())])),
        ("before", ROW), ("after", ROW), ("after_columns", pa.list_(pa.string())),
        ("sequence", pa.string()), ("event_time", pa.timestamp("us", tz="UTC")),
        ("tx_id", pa.string()), ("source_format", pa.string()), ("topic", pa.string()),
        ("partition", pa.int32()), ("offset", pa.int64()), ("file", pa.string()),
        ("line", pa.int64()), ("ingest_date", pa.date32()),
    ]
)  # fmt: skip
T0 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)


def change(op: str, id_: int | None, line: int, **over) -> dict:
    """A change record of app.t; ``over`` replaces any column (``before``/``after`` images)."""
    image = {"id": id_, "name": f"n{id_}"}
    row = {
        "op": op, "database": "app", "schema": None, "table": "t", "key": {"id": id_},
        "before": image if op in ("u", "d") else None,
        "after": image if op in ("c", "r", "u") else None, "after_columns": None,
        "sequence": f"{line:08d}|f#{line}", "event_time": T0, "tx_id": None,
        "source_format": "debezium", "topic": "t", "partition": None, "offset": None,
        "file": "f.jsonl", "line": line, "ingest_date": dt.date.fromisoformat(DATE),
    }  # fmt: skip
    if op == "t":
        row.update(key={"id": None}, before=None, after=None)
    return {**row, **over}


def write_changelog(spark, warehouse: Path, source: str, table: str, rows: list[dict]) -> str:
    uri = lake.TableRef(lake.CHANGELOG, source, table).uri(warehouse)
    state = lake.TableState(key=["id"], qualified="app.t")
    data = spark.createDataFrame(pa.Table.from_pylist(rows, CHANGELOG))
    lake.overwrite_partitions(data, uri, [DATE], state)
    return uri


COORDS = pa.schema(
    [("ingest_date", pa.date32()), ("topic", pa.string()), ("partition", pa.int32()),
     ("offset", pa.int64()), ("file", pa.string()), ("line", pa.int64())]
)  # fmt: skip


def coordinates(lines: list[int], **extra: list) -> pa.Table:
    """Rows with the raw coordinates of landing-file lines ``lines`` (plus ``extra`` columns)."""
    day = dt.date.fromisoformat(DATE)
    data = {"ingest_date": [day] * len(lines), "topic": ["t"] * len(lines),
            "partition": [None] * len(lines), "offset": [None] * len(lines),
            "file": ["f.jsonl"] * len(lines), "line": lines}  # fmt: skip
    table = pa.table(data, COORDS)
    for name, values in extra.items():
        table = table.append_column(name, pa.array(values))
    return table


def write(
    spark, warehouse: Path, layer: str, source: str, table: str | None, data: pa.Table
) -> None:
    uri = lake.TableRef(layer, source, table).uri(warehouse)
    lake.overwrite_partitions(spark.createDataFrame(data), uri, [DATE])
