"""A table read by three independent Delta readers: ours (Spark, ``lake.read``), delta-rs's
query engine (``QueryBuilder``, which applies deletion vectors; its Arrow conversions refuse
them), and DuckDB's ``delta_scan`` (the ``delta`` extension, on delta-kernel-rs).

DuckDB's extension comes from PyPI (``duckdb-extension-delta`` in the dev extra, built for one
exact duckdb version, which it pins) and is loaded from its file: ``INSTALL delta`` downloads
from extensions.duckdb.org."""

import functools
import json
from pathlib import Path

import duckdb
import duckdb_extension_delta
import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from cdc_platform import lake


@functools.cache
def duckdb_connection() -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the ``delta`` extension loaded (once: loading takes a while)."""
    folder = Path(duckdb_extension_delta.__file__).parent / "extensions"
    path = folder / f"v{duckdb.__version__}" / "delta.duckdb_extension"
    built = sorted(p.name for p in folder.iterdir())
    assert path.exists(), f"duckdb {duckdb.__version__}, delta extension built for {built}"
    con = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    con.load_extension(str(path))
    return con


def delta_scan(uri: str, where: str = "", params: list | None = None) -> pa.Table:
    sql = f"SELECT * FROM delta_scan('{uri}') {where}"
    return duckdb_connection().execute(sql, params or []).to_arrow_table()


def delta_rs(uri: str) -> pa.Table:
    """The snapshot through delta-rs's query engine, in the table's Arrow types (its engine
    gives string views)."""
    dt = DeltaTable(str(uri))
    table = pa.table(QueryBuilder().register("t", dt).execute("SELECT * FROM t"))
    schema = pa.schema(dt.schema())
    return table.select(schema.names).cast(schema)


def _rows(table: pa.Table, columns: list[str]) -> list[str]:
    picked = table.select(columns).to_pylist()
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in picked)


def agreed(spark, uri: str) -> list[str]:
    """The table's rows (as sorted JSON text), asserted the same in all three readers."""
    ours = lake.read(spark, str(uri)).toArrow()
    columns = ours.column_names
    rows = _rows(ours, columns)
    assert _rows(delta_rs(uri), columns) == rows, "delta-rs reads other rows"
    assert _rows(delta_scan(str(uri)), columns) == rows, "DuckDB reads other rows"
    return rows
