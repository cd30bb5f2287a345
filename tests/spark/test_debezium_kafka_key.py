"""The Kafka key of a Debezium message: it names the row of a delete without a before image
(bare, or the JsonConverter's ``{"schema", "payload"}``), and its fields name the key columns.
A delete with neither a before image nor a key that parses is quarantined."""

import json

import pytest
from pyspark.sql.pandas.types import from_arrow_schema

from cdc_platform.formats import debezium
from cdc_platform.ingest.landing import RAW_SCHEMA

pytestmark = pytest.mark.spark
SOURCE = {"db": "app", "table": "t", "file": "bin.000001", "pos": 1, "ts_ms": 1}
UNIDENTIFIED = "delete without before image or message key: the row cannot be identified"


def _message(op: str, before: dict | None = None, after: dict | None = None) -> bytes:
    value = {"before": before, "after": after, "op": op, "source": SOURCE, "ts_ms": 1}
    return json.dumps(value).encode()


def _parsed(spark, messages: list[tuple[str | None, bytes]]) -> list[tuple]:
    schema = from_arrow_schema(RAW_SCHEMA)
    rows = [
        {"offset": i, "key": key.encode() if key is not None else None, "value": value}
        for i, (key, value) in enumerate(messages)
    ]
    raw = spark.createDataFrame([{f.name: r.get(f.name) for f in schema} for r in rows], schema)
    parsed = debezium.parse(raw, {}).orderBy("offset")
    return [
        (r["kind"], r["reason"], r["before_image"], r["key_columns"])
        for r in parsed.select("kind", "reason", "before_image", "key_columns").collect()
    ]


def test_the_kafka_key_names_a_delete_without_a_before_image(spark):
    envelope = json.dumps({"schema": {"type": "struct"}, "payload": {"id": 6}})
    assert _parsed(
        spark,
        [
            ('{"id": 5}', _message("d")),
            (envelope, _message("d")),
            ('{"id": 7}', _message("d", before={"id": 7, "n": "x"})),  # its before image wins
            ('{"id": 8}', _message("c", after={"id": 8})),
            ('{"payload": 9}', _message("d")),  # a key column named payload, not an envelope
            (None, _message("d")),
            ("not json", _message("d")),
        ],
    ) == [
        ("change", None, {"id": "5"}, ["id"]),
        ("change", None, {"id": "6"}, ["id"]),
        ("change", None, {"id": "7", "n": "x"}, ["id"]),
        ("change", None, None, ["id"]),
        ("change", None, {"payload": "9"}, ["payload"]),
        ("error", UNIDENTIFIED, None, None),
        ("error", UNIDENTIFIED, None, None),
    ]
