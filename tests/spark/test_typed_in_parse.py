"""The parse types the rows that fit the plans of a batch's first messages in its own pass; the
rest are planned and typed afterwards. Whichever rows take which way, the tables come out the
same: the same batch normalized with every row typed in the parse, with only the first message's
table and schema typed there, and with none typed there (the plan of the whole batch) gives the
same change logs and quarantine (so the same current tables: one way's replay checks those).
A batch of one table's changes is written straight from the parse; one whose later messages
hold more comes out the same as when staged, and leaves no uncommitted file."""

import base64
import json
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.formats import canonical as C
from cdc_platform.ingest.landing import date_of
from cdc_platform.normalize import parse as normalize
from cdc_platform.steps.changelog import NormalizeResult, normalize_source
from cdc_platform.steps.raw import ingest_files
from cdc_platform.steps.replay import replay
from tests.conftest import CORPUS

pytestmark = pytest.mark.spark

DATE = "2026-01-01"


def _field(column: str, type_: str, **extra) -> dict:
    return {"field": column, "type": type_, "optional": True, **extra}


DECIMAL = {"name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2"}}
DATE_FIELD = {"name": "io.debezium.time.Date"}
# Table a: v2 widens id and adds a decimal and a date; table c: v2 changes name's type
# incompatibly (its rows are quarantined).
SCHEMAS = {
    ("a", 1): [_field("id", "int32"), _field("name", "string")],
    ("a", 2): [_field("id", "int64"), _field("name", "string"),
               _field("price", "bytes", **DECIMAL), _field("day", "int32", **DATE_FIELD)],
    ("b", 1): [_field("k", "string"), _field("n", "int32")],
    ("c", 1): [_field("id", "int32"), _field("name", "string")],
    ("c", 2): [_field("id", "int32"), _field("name", "int32")],
}  # fmt: skip


def _price(cents: int) -> str:
    return base64.b64encode(cents.to_bytes(3, "big", signed=True)).decode()


def _event(pos: int, table: str, version: int, op: str, before=None, after=None) -> str:
    image = {"type": "struct", "fields": SCHEMAS[(table, version)], "optional": True}
    schema = {
        "type": "struct",
        "fields": [
            {**image, "field": "before"},
            {**image, "field": "after"},
            {"type": "struct", "field": "source", "fields": []},
            {"type": "string", "field": "op"},
        ],
    }
    source = {"connector": "mysql", "db": "inv", "table": table, "ts_ms": 1000 + pos,
              "file": "mysql-bin.000001", "pos": pos, "row": 0}  # fmt: skip
    payload = {"before": before, "after": after, "op": op, "source": source, "ts_ms": 1000 + pos}
    return json.dumps({"schema": schema, "payload": payload})


EVENTS = [
    _event(10, "a", 1, "c", after={"id": 1, "name": "x"}),
    _event(20, "a", 1, "c", after={"id": 2, "name": "y"}),
    _event(30, "b", 1, "c", after={"k": "p", "n": 5}),
    _event(40, "a", 2, "u", before={"id": 1, "name": "x", "price": None, "day": None},
           after={"id": 1, "name": "x2", "price": _price(-1234), "day": 20000}),
    _event(50, "c", 1, "c", after={"id": 1, "name": "one"}),
    _event(60, "a", 1, "u", before={"id": 2, "name": "y"}, after={"id": 2, "name": "y2"}),
    _event(70, "b", 1, "u", before={"k": "p", "n": 5}, after={"k": "p", "n": "oops"}),
    _event(80, "c", 2, "u", before={"id": 1, "name": 1}, after={"id": 1, "name": 2}),
    _event(90, "a", 2, "d", before={"id": 2, "name": "y2", "price": None, "day": None}),
    _event(100, "b", 1, "c", after={"k": "q", "n": 7}),
]  # fmt: skip
TABLES = ("inv__a", "inv__b", "inv__c")
SOURCE = SourceConfig(
    name="s",
    format="debezium",
    tables=[
        TableConfig(name=f"inv__{t}", source_table=f"inv.{t}", primary_key=[key])
        for t, key in (("a", "id"), ("b", "k"), ("c", "id"))
    ],
)


def _tables(spark, warehouse, tables, merged: bool) -> dict:
    """Every output as sorted rows, with each table's schema (the current tables if
    ``merged``)."""
    out = {}
    layers = (lake.CHANGELOG, lake.CURRENT) if merged else (lake.CHANGELOG,)
    for layer, name in [(lake.QUARANTINE, None), *[(lk, t) for t in tables for lk in layers]]:
        uri = lake.TableRef(layer, "s", *([name] if name else [])).uri(warehouse)
        frame = lake.read(spark, uri)
        frame = frame.drop("timestamp")  # when the landing file was read
        rows = sorted(map(repr, frame.toArrow().to_pylist()))
        out[(layer, name)] = (frame.schema.simpleString(), rows)
    return out


def _normalized(spark, warehouse, landing, source, merge: bool) -> NormalizeResult | None:
    """The landing file through raw to the change logs, and on to the current tables if
    ``merge``: how the rows were typed shows in the change logs, so one way merges."""
    if merge:
        replay(spark, warehouse, [landing], source, DATE)
        return None
    date = date_of(landing, DATE)
    ingest_files(warehouse, source.name, [(landing, str(landing.resolve()))], date, False)
    return normalize_source(spark, warehouse, source, [date])


def _replay(spark, tmp_path, name, lines, source, monkeypatch, sample, most, tables, merge):
    monkeypatch.setattr(normalize, "SAMPLE_ROWS", sample)
    monkeypatch.setattr(normalize, "MAX_TYPED_TABLES", most)
    # One landing file: its path is part of each change's sequence.
    landing = tmp_path / "events.jsonl"
    landing.write_text("\n".join(lines) + "\n")
    warehouse = tmp_path / name
    _normalized(spark, warehouse, landing, source, merge)
    return _tables(spark, warehouse, tables, merge)


def _without_current(tables: dict) -> dict:
    return {k: v for k, v in tables.items() if k[0] != lake.CURRENT}


WAYS = {"all in the parse": (1000, 8), "first message only": (1, 8), "none": (1000, 0)}


@pytest.mark.slow
def test_schema_versions_and_tables_come_out_the_same_whichever_way(spark, tmp_path, monkeypatch):
    results = {
        way: _replay(spark, tmp_path, str(i), EVENTS, SOURCE, monkeypatch, *how, TABLES, i == 0)
        for i, (way, how) in enumerate(WAYS.items())
    }
    first = results["all in the parse"]
    for way, tables in results.items():
        assert _without_current(tables) == _without_current(first), way
    log_schema = first[(lake.CHANGELOG, "inv__a")][0]
    assert "after:struct<id:bigint,name:string,price:decimal(38,2),day:date>" in log_schema
    current = first[(lake.CURRENT, "inv__a")][1]
    assert len(current) == 2 and "Decimal('-12.34')" in current[0]  # id 1; id 2 a tombstone
    reasons = " ".join(first[(lake.QUARANTINE, None)][1])
    assert "type mismatch: after.n = oops is not int" in reasons
    assert (
        "incompatible schema change: column 'name' of inv.c changes from string to int" in reasons
    )


def test_corpus_canal_comes_out_the_same_whichever_way(spark, tmp_path, monkeypatch):
    """Real Canal messages: several rows a message, partial ``old`` images, a DDL."""
    lines = (CORPUS / "canal" / "canal-data.txt").read_text().splitlines()
    source = SourceConfig(name="s", format="canal")
    # With every row typed in the parse it is what the Canal tests check against EXPECTED.json.
    results = [
        _replay(spark, tmp_path, str(i), lines, source, monkeypatch, *WAYS[way],
                ("inventory__products2",), False)
        for i, way in enumerate(("all in the parse", "first message only"))
    ]  # fmt: skip
    assert results[0] == results[1]


def test_the_parse_types_what_fits_the_first_messages_plans(spark, tmp_path, monkeypatch):
    landing = tmp_path / "events.jsonl"
    landing.write_text("\n".join(EVENTS) + "\n")
    raw = spark.read.text(str(landing)).select(
        F.col("value"), F.lit(None).cast("binary").alias("key"),
        *[F.lit(None).cast(t).alias(c) for c, t in [
            ("ingest_date", "date"), ("topic", "string"), ("partition", "int"),
            ("offset", "long"), ("timestamp", "timestamp")]],
        F.lit("events.jsonl").alias("file"), F.monotonically_increasing_id().alias("line"),
    )  # fmt: skip

    def typed_rows(sample: int) -> dict[str, int]:
        monkeypatch.setattr(normalize, "SAMPLE_ROWS", sample)
        messages = normalize.parse_messages(raw, SOURCE)
        parsed = normalize.with_plans(messages, normalize.predict_plans(messages, SOURCE).plans)
        changes = parsed.where(F.col("kind") == C.KIND_CHANGE)
        fitted = changes.where(F.col(normalize.TYPED).isNotNull())
        return {r["table"]: r["count"] for r in fitted.groupBy("table").count().collect()}

    # Table c changes its schema incompatibly: the plan of the whole batch decides it.
    assert typed_rows(1000) == {"a": 5, "b": 3}
    assert typed_rows(1) == {"a": 3}  # the first message's table and schema version


def test_a_later_batch_keeps_the_change_logs_types_whichever_way(spark, tmp_path, monkeypatch):
    """The first batch states the types (schema envelope); the second has no schema, and only its
    later message carries column n: n keeps the change log's int, whichever way it is typed."""
    first = [_event(10, "b", 1, "c", after={"k": "p", "n": 5})]
    schemaless = [
        json.dumps({"op": "c", "after": after, "source": {"db": "inv", "table": "b", "pos": pos,
                                                          "file": "mysql-bin.000001", "row": 0}})
        for pos, after in ((20, {"k": "q"}), (30, {"k": "r", "n": 7}))
    ]  # fmt: skip
    landing = {}
    for day, lines in (("01", first), ("02", schemaless)):
        landing[day] = tmp_path / f"dt=2026-01-{day}" / "events.jsonl"
        landing[day].parent.mkdir()
        landing[day].write_text("\n".join(lines) + "\n")
    results = {}
    for i, (way, (sample, most)) in enumerate(WAYS.items()):
        monkeypatch.setattr(normalize, "SAMPLE_ROWS", sample)
        monkeypatch.setattr(normalize, "MAX_TYPED_TABLES", most)
        merge = way == "none"
        for day in ("01", "02"):
            _normalized(spark, tmp_path / str(i), landing[day], SOURCE, merge)
        results[way] = _tables(spark, tmp_path / str(i), ("inv__b",), merge)
    for way, tables in results.items():
        assert _without_current(tables) == _without_current(results["none"]), way
    log_schema = results["none"][(lake.CHANGELOG, "inv__b")][0]
    assert "after:struct<k:string,n:int>" in log_schema
    assert len(results["none"][(lake.CURRENT, "inv__b")][1]) == 3


# One table's changes: a batch of them is written straight from the parse, not staged.
ONE_TABLE = [_event(10 * i, "b", 1, "c", after={"k": f"k{i}", "n": i}) for i in range(1, 6)]
LATER = {
    "another table": _event(35, "a", 1, "c", after={"id": 1, "name": "x"}),
    "a value that is not its type": _event(35, "b", 1, "c", after={"k": "bad", "n": "oops"}),
    "a message that is not JSON": "not json",
}


def _unstaged(warehouse) -> bool:
    return not (warehouse / "_staging").exists()


def _only_committed_files(warehouse, table: str) -> bool:
    uri = lake.TableRef(lake.CHANGELOG, "s", table).uri(warehouse)
    on_disk = {p.name for p in Path(uri).rglob("*.parquet")}
    return on_disk == {Path(f).name for f in lake.files(uri, lake.version(uri))}


def test_one_tables_changes_are_written_straight_from_the_parse(spark, tmp_path, monkeypatch):
    direct = _replay(spark, tmp_path, "d", ONE_TABLE, SOURCE, monkeypatch, 2, 8, ("inv__b",), False)
    assert _unstaged(tmp_path / "d")
    staged = _replay(spark, tmp_path, "s", ONE_TABLE, SOURCE, monkeypatch, 2, 0, ("inv__b",), False)
    assert not _unstaged(tmp_path / "s")
    assert direct == staged
    assert len(direct[(lake.CHANGELOG, "inv__b")][1]) == 5


def test_a_direct_writes_preview_shows_the_rows_it_committed(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(normalize, "SAMPLE_ROWS", 2)
    landing = tmp_path / "events.jsonl"
    landing.write_text("\n".join(ONE_TABLE) + "\n")
    result = _normalized(spark, tmp_path / "w", landing, SOURCE, False)
    assert _unstaged(tmp_path / "w")
    uri = lake.TableRef(lake.CHANGELOG, "s", "inv__b").uri(tmp_path / "w")
    committed = lake.read(spark, uri).toArrow()
    shown = result.tables["inv__b"].sample.to_pylist()
    assert sorted(map(repr, shown)) == sorted(map(repr, committed.to_pylist()))


@pytest.mark.parametrize("later", LATER)
def test_a_batch_holding_more_than_its_first_messages_comes_out_the_same(
    spark, tmp_path, monkeypatch, later
):
    """The first two messages are one table's changes; a later one is not: the files written
    straight from the parse are discarded and the batch is normalized staged."""
    lines = [*ONE_TABLE[:3], LATER[later], *ONE_TABLE[3:]]
    tables = ("inv__a", "inv__b") if later == "another table" else ("inv__b",)
    predicted = _replay(spark, tmp_path, "p", lines, SOURCE, monkeypatch, 2, 8, tables, False)
    staged = _replay(spark, tmp_path, "s", lines, SOURCE, monkeypatch, 2, 0, tables, False)
    assert predicted == staged
    assert not _unstaged(tmp_path / "p")
    assert _only_committed_files(tmp_path / "p", "inv__b")
    assert len(predicted[(lake.CHANGELOG, "inv__b")][1]) == 5
