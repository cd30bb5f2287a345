"""The Confluent wire format's reader without Spark: Avro schemas as Kafka Connect schemas, messages
decoded through confluent-kafka's in-memory ``mock://`` registry into the JsonConverter's JSON,
subject name strategies with ``use_latest_version``, the ``schema_registry`` settings, mutual
TLS against the registry test double, and the unreachable registry as a transient error."""

import io
import json
from decimal import Decimal

import fastavro
import pytest
from confluent_kafka.schema_registry import record_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from cdc_platform.catalog import CatalogError, SchemaRegistryConfig
from cdc_platform.defs.transient import transient_reason
from cdc_platform.formats import confluent_avro as A
from cdc_platform.formats.column_specs import connect_field_spec
from tests.kafka.schema_registry_double import SchemaRegistryDouble, make_tls

ROW = {"type": "record", "name": "Row", "namespace": "db.t", "fields": [
    {"name": "id", "type": "int"},
    {"name": "small", "type": {"type": "int", "connect.type": "int16"}},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9,
                               "scale": 3}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}],
     "default": None},
    {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "either", "type": ["null", "int", "string"], "default": None},
    {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "BLUE"]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "again", "type": ["null", "Color"], "default": None},
    {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "tu", "type": {"type": "long", "logicalType": "time-micros"}},
    {"name": "tsm", "type": {"type": "long", "logicalType": "timestamp-millis"}},
]}  # fmt: skip


def _specs(avro: dict) -> dict[str, tuple[str, str]]:
    struct = A.connect_schema(avro)
    return {f["field"]: (connect_field_spec(f).type, f.get("name", "")) for f in struct["fields"]}


def test_avro_types_map_to_the_connect_types_the_json_path_reads():
    specs = _specs(ROW)
    assert specs["id"][0] == "int"
    assert specs["small"][0] == "smallint"  # connect.type
    assert specs["price"][0] == "decimal(9,3)"  # an Avro decimal without connect.name
    assert specs["day"][0] == "date"
    assert specs["at"][0] == "timestamp"  # timestamp-micros: Debezium's MicroTimestamp
    assert specs["uid"] == ("string", "io.debezium.data.Uuid")
    assert specs["either"][0] == "string"  # a union of several types stays JSON text
    assert specs["color"][0] == specs["again"][0] == "string"  # a named type used twice
    assert specs["tm"] == ("string", "org.apache.kafka.connect.data.Time")  # HH:MM:SS.ffffff
    assert specs["tu"] == ("string", "io.debezium.time.MicroTime")
    assert specs["tsm"] == ("timestamp", "org.apache.kafka.connect.data.Timestamp")
    assert A.connect_schema(ROW)["name"] == "db.t.Row"


def _decoder(url: str, **reading) -> A.Decoder:
    return A.Decoder(A.Reading({"url": url}, **reading))


def _value(serializer: AvroSerializer, record: dict, topic: str = "t") -> bytes:
    return serializer(record, SerializationContext(topic, MessageField.VALUE))


ROW_VALUE = {"id": 7, "small": -3, "price": Decimal("-1.250"), "day": 3, "at": None,
             "uid": "6f1c0e8a-0000-4000-8000-000000000001", "either": "x", "color": "BLUE",
             "tags": ["a"], "again": "RED", "tm": 45_000_123, "tu": 45_000_123_456,
             "tsm": 1_772_366_400_000}  # fmt: skip


def test_a_framed_message_reads_as_the_json_converter_writes_it():
    decoder = _decoder("mock://unit-read")
    data = _value(AvroSerializer(decoder.client, json.dumps(ROW)), ROW_VALUE)
    message = json.loads(decoder.json_text(data, "t", "value"))
    assert message["schema"] == A.connect_schema(ROW)
    # The decimal as base64 of its unscaled two's complement (-1250), the date as its days.
    assert message["payload"] == {**ROW_VALUE, "price": "+x4=", "day": 3}


def test_messages_that_cannot_be_read_say_why():
    decoder = _decoder("mock://unit-errors")
    data = _value(AvroSerializer(decoder.client, json.dumps(ROW)), ROW_VALUE)
    with pytest.raises(A.MessageError, match="schema id 42 is not in the schema registry"):
        decoder.json_text(b"\x00\x00\x00\x00\x2a" + data[5:], "t", "value")
    with pytest.raises(A.MessageError, match="1 bytes after the record"):
        decoder.json_text(data + b"\x00", "t", "value")
    with pytest.raises(A.MessageError, match="schema id 1: "):
        decoder.json_text(data[:8], "t", "value")


def test_use_latest_version_reads_with_the_subjects_newest_schema():
    """Record name strategy: the subject is the record's full name, whatever the topic."""
    decoder = _decoder(
        "mock://unit-latest", value_subject_name_strategy="record", use_latest_version=True
    )
    v2 = {**ROW, "fields": [*ROW["fields"], {"name": "note", "type": ["null", "string"],
                                             "default": None}]}  # fmt: skip
    conf = {"subject.name.strategy": record_subject_name_strategy}
    old = _value(AvroSerializer(decoder.client, json.dumps(ROW), conf=conf), ROW_VALUE, "a")
    _value(AvroSerializer(decoder.client, json.dumps(v2), conf=conf), {**ROW_VALUE, "note": "n"})
    message = json.loads(decoder.json_text(old, "a", "value"))
    assert message["payload"]["note"] is None  # the newest schema's default
    assert [f["field"] for f in message["schema"]["fields"]][-1] == "note"
    assert A.Reading({"url": "x"}, "topic_record").subject("a", "db.t.Row", "key") == "a-db.t.Row"


def test_the_registry_settings(monkeypatch):
    with pytest.raises(ValueError, match="never the password itself"):
        SchemaRegistryConfig(url="https://sr:8081", basic_auth_user_info="me:secret")
    with pytest.raises(ValueError, match="is not an http"):
        SchemaRegistryConfig(url="sr:8081")
    config = SchemaRegistryConfig(
        url=["https://a:8081", "https://b:8081"],
        basic_auth_user_info="me:${SR_PASSWORD}",
        ssl_ca_location="/etc/ca.pem",
    )
    with pytest.raises(CatalogError, match="SR_PASSWORD is not set"):
        config.client_settings()
    monkeypatch.setenv("SR_PASSWORD", "pw")
    assert config.client_settings() == {
        "url": "https://a:8081,https://b:8081",
        "basic.auth.user.info": "me:pw",
        "ssl.ca.location": "/etc/ca.pem",
    }


def test_an_unreachable_registry_is_transient():
    decoder = _decoder("http://127.0.0.1:1")
    with pytest.raises(A.RegistryUnavailable) as raised:
        decoder.json_text(b"\x00\x00\x00\x00\x01\x00", "t", "value")
    # As a failed Spark job reports it: the worker's traceback quotes the raising line first.
    text = (
        f'raise RegistryUnavailable(f"{{UNAVAILABLE}}: ...")\nRegistryUnavailable: {raised.value}'
    )
    reason = transient_reason(RuntimeError(text))
    assert reason == f"the schema registry is unavailable: {str(raised.value).split(': ', 1)[1]}"
    assert "http://127.0.0.1:1" in reason


def _framed(schema_id: int, schema: dict, record: dict) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + body.getvalue()


def test_tls_with_a_client_certificate(tmp_path):
    """HTTPS with mutual TLS: the registry's CA, and a client certificate it signed; without
    them the handshake fails, which is a configuration error (no retry), not an outage."""
    tls = make_tls(tmp_path)
    small = {"type": "record", "name": "K", "fields": [{"name": "id", "type": "int"}]}
    with SchemaRegistryDouble(tls=tls) as registry:
        sid = registry.register("t-key", json.dumps(small))
        data = _framed(sid, small, {"id": 7})
        trusted = A.Decoder(A.Reading({
            "url": registry.url, "ssl.ca.location": str(tls.ca),
            "ssl.certificate.location": str(tls.client_cert),
            "ssl.key.location": str(tls.client_key),
        }))  # fmt: skip
        assert json.loads(trusted.json_text(data, "t", "key"))["payload"] == {"id": 7}
        for conf in (
            {"url": registry.url},  # the server's certificate is not trusted
            {"url": registry.url, "ssl.ca.location": str(tls.ca)},
        ):  # no client cert
            with pytest.raises(A.RegistryTlsError, match="TLS failed"):
                A.Decoder(A.Reading(conf)).json_text(data, "t", "key")
