"""format: auto on one topic that mixes formats: each message goes to its own table; on a batch
of one format it parses exactly as that format; unclaimed messages are quarantined with why."""

import itertools
import json
import struct

import pytest
from pyspark.sql import functions as F

from cdc_platform import formats
from cdc_platform.catalog import SourceConfig, TableConfig
from cdc_platform.formats import canonical as C
from cdc_platform.formats import detect
from cdc_platform.formats import json_records as J
from cdc_platform.ingest import landing
from cdc_platform.steps.current import current_rows
from cdc_platform.steps.replay import replay
from tests.conftest import CORPUS, FIXTURES
from tests.quality.test_fuzz import _land

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


@pytest.mark.parametrize("name", [*MIXED, "canal/canal-data-with-init.txt"])
def test_auto_parses_a_batch_of_one_format_as_that_format(spark, tmp_path, name):
    lines = (CORPUS / name).read_text().splitlines()
    raw = _raw(spark, tmp_path, [line.encode() for line in lines if line] + [None])

    named = _records(formats.parser_for(name.split("/")[0]).parse(raw, {}))
    auto = _records(detect.parse(raw, {}))

    *messages, tombstone = auto
    assert messages == named[:-1]
    assert (tombstone["kind"], tombstone["reason"], tombstone["source_format"]) == (
        C.KIND_CONTROL, "kafka tombstone", "auto"
    )  # fmt: skip


def test_auto_quarantines_what_no_format_or_several_claim(spark, tmp_path):
    canal = (CORPUS / "canal/canal-data.txt").read_text().splitlines()[0]
    ogg = (CORPUS / "ogg/ogg-data.txt").read_text().splitlines()[0]
    both = {"op_type": "I", "table": "S.T", "after": {"id": 1}, "op": "c", "source": {}}
    # JSON may start with whitespace; a byte no JSON object starts with skips the JSON parser
    values = [canal.encode(), b" \t\r\n" + ogg.encode(), b'{"hello": 1}',
              json.dumps(both).encode(), b"hello", b"[1, 2]", None,
              b"\x02" + ogg.encode()]  # fmt: skip

    got = {r["offset"]: r for r in _records(detect.parse(_raw(spark, tmp_path, values), {}))}

    assert [got[i]["source_format"] for i in (0, 1)] == ["canal", "ogg"]
    assert all(got[i]["kind"] != C.KIND_ERROR for i in (0, 1))
    assert {i: (r["kind"], r["reason"], r["source_format"]) for i, r in got.items() if i > 1} == {
        2: (C.KIND_ERROR, "no format recognises this message", "auto"),
        3: (C.KIND_ERROR, "ambiguous: claimed by debezium and ogg", "auto"),
        4: (C.KIND_ERROR, "no format recognises this message", "auto"),
        5: (C.KIND_ERROR, "no format recognises this message", "auto"),
        6: (C.KIND_CONTROL, "kafka tombstone", "auto"),
        7: (C.KIND_ERROR, "no format recognises this message", "auto"),
    }
    # the claims detection evaluates are every format's own
    keys = F.json_object_keys("value")
    docs = spark.createDataFrame([(canal,), (ogg,), (json.dumps(both),)], "value string")
    claimed = [list(r[0]) for r in docs.select(detect.claimants(keys, F.col("value"))).collect()]
    assert claimed == [["canal"], ["ogg"], ["debezium", "ogg"]]


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


def test_claims_once_for_each_distinct_keys_and_probe_name_what_each_message_would(spark, tmp_path):
    # The pass evaluates a JSON object's claims once for each distinct pair of its keys and its
    # probe (each field kept as what the claims test of it), not for each message: it must
    # find the names the claims give message by message, reading whole fields. Every corpus and
    # vendor-document message, messages differing only in what no claim tests, and what no
    # format claims.
    lines = [line for path in sorted(CORPUS.glob("*/*.txt")) for line in
             path.read_text().splitlines() if line.strip()]  # fmt: skip
    seeds = sorted((FIXTURES / "seeds").glob("*.json"))
    lines += [json.dumps(json.loads(p.read_text())) for p in seeds if _is_json(p.read_text())]
    ddl = {"schema": {}, "payload": {"ddl": "ALTER TABLE t ADD c INT", "op": None}}
    both = {"op_type": "I", "table": "S.T", "after": {}, "op": "c", "source": {}}
    lines += [json.dumps(ddl), json.dumps(both),
              json.dumps({**ddl, "payload": {"ddl": {"text": "x"}}}),
              json.dumps({"schema": {}, "payload": {"op": "cc"}}),
              json.dumps({"schema": {}, "payload": {"status": None}}),
              json.dumps({"meta": {"op": ""}, "data": {}}), "[1]", "hello",
              json.dumps({"_operation_type_": "I", "_sequence_id_": "1", "id": 1})]  # fmt: skip
    values = [line.encode() for line in lines] + [b"\x02\x00", None]
    raw = _raw(spark, tmp_path, values)

    # Message by message, on the fields' whole texts.
    keys = J.object_keys()
    claimed = detect._claimed_by(keys, J.text(), J.probe(keys, detect.CLAIM_PATHS))
    one_by_one = {r[0] for r in raw.select(claimed).collect()}
    found, tombstones = detect._found(raw)
    assert set(found) == one_by_one - {None}
    assert tombstones
    named = {"debezium", "dataworks", "canal", "maxwell", "ogg", "shareplex", "datahub-tuple"}
    assert named | {"", "debezium,ogg"} <= set(found)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _raw(spark, tmp_path, values: list[bytes | None]):
    """Raw rows of one Kafka partition holding ``values`` (None: a tombstone)."""
    path = tmp_path / "m.kafka.jsonl"
    _land(path, values)
    return spark.createDataFrame(landing.read_file(path, "2026-01-01", "t"))


def _records(parsed) -> list[dict]:
    fields = ["offset", *[f.name for f in C.PARSED_SCHEMA.fields]]
    rows = [r.asDict() for r in parsed.select(*fields).collect()]
    return sorted(rows, key=lambda r: (r["offset"], r["source_sequence"] or ""))
