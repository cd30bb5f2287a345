"""Debezium through Kafka Connect's AvroConverter: Avro keys and values in the Confluent wire
format, produced by confluent-kafka's own ``AvroSerializer`` through the real broker, their
schemas in a registry (the loopback test double, with basic auth), read by the platform into
the current table: Connect decimals, Debezium's named types, a delete and its tombstone, a
column added mid-stream (a new schema id), a JSON value beside Avro keys, and the messages that
cannot be read in quarantine with their reason. Once with ``format: debezium`` and once with
``auto``. A registry that cannot be reached fails the batch as a transient error."""

import copy
import datetime
import json
from decimal import Decimal

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from cdc_platform import lake
from cdc_platform.catalog import KafkaConfig, SchemaRegistryConfig, SourceConfig
from cdc_platform.defs.transient import transient_reason
from cdc_platform.ingest import kafka
from cdc_platform.steps.changelog import normalize_source
from cdc_platform.steps.current import current_rows, merge_current
from tests.kafka.schema_registry_double import SchemaRegistryDouble
from tests.kafka.test_kafka_ingest import _produce, _topic

pytestmark = pytest.mark.spark

DATE = "2026-03-01"
UTC = datetime.UTC
NS = "dbserver1.inventory.orders"
TABLE = "inventory__orders"  # routed by its qualified name


def _decimal(scale: int, precision: int) -> dict:
    """A Connect Decimal as the AvroConverter writes its schema."""
    parameters = {"scale": str(scale), "connect.decimal.precision": str(precision)}
    return {"type": "bytes", "scale": scale, "precision": precision, "connect.version": 1,
            "connect.parameters": parameters, "logicalType": "decimal",
            "connect.name": "org.apache.kafka.connect.data.Decimal"}  # fmt: skip


def _named(avro_type: str, name: str, **extra) -> dict:
    return {"type": avro_type, "connect.version": 1, "connect.name": name, **extra}


VARIABLE = {"type": "record", "name": "VariableScaleDecimal", "namespace": "io.debezium.data",
            "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
            "connect.version": 1,
            "connect.name": "io.debezium.data.VariableScaleDecimal"}  # fmt: skip
VALUE_V1 = {"type": "record", "name": "Value", "namespace": NS, "connect.name": f"{NS}.Value",
            "fields": [
    {"name": "id", "type": "int"},
    {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "amount", "type": ["null", _decimal(2, 10)], "default": None},
    {"name": "qty", "type": {"type": "int", "connect.type": "int16"}},
    {"name": "day", "type": ["null", _named("int", "io.debezium.time.Date")], "default": None},
    {"name": "created", "type": _named("long", "io.debezium.time.Timestamp")},
    {"name": "seen", "type": ["null", _named("long", "org.apache.kafka.connect.data.Timestamp",
                                             logicalType="timestamp-millis")], "default": None},
    {"name": "total", "type": ["null", VARIABLE], "default": None},
]}  # fmt: skip
# Version 2 adds a column: a new schema id mid-stream.
VALUE_V2 = copy.deepcopy(VALUE_V1)
VALUE_V2["fields"].append({"name": "note", "type": ["null", "string"], "default": None})
KEY = {"type": "record", "name": "Key", "namespace": NS, "connect.name": f"{NS}.Key",
       "fields": [{"name": "id", "type": "int"}]}  # fmt: skip
SOURCE = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.mysql",
          "connect.name": "io.debezium.connector.mysql.Source", "fields": [
    {"name": "version", "type": "string"}, {"name": "connector", "type": "string"},
    {"name": "name", "type": "string"}, {"name": "ts_ms", "type": "long"},
    {"name": "db", "type": "string"},
    {"name": "table", "type": ["null", "string"], "default": None},
    {"name": "file", "type": "string"}, {"name": "pos", "type": "long"},
    {"name": "row", "type": "int"},
]}  # fmt: skip


def _envelope(value: dict) -> dict:
    return {"type": "record", "name": "Envelope", "namespace": NS,
            "connect.name": f"{NS}.Envelope", "fields": [
        {"name": "before", "type": ["null", value], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": SOURCE},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ]}  # fmt: skip


T0 = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
MS = int(T0.timestamp() * 1000)


def _row(id_: int, name: str, amount: str, qty: int, total: tuple[int, int], **more) -> dict:
    return {"id": id_, "name": name, "amount": Decimal(amount), "qty": qty, "day": 20513,
            "created": MS + id_, "seen": T0, "total": {"scale": total[1],
            "value": total[0].to_bytes(16, "big", signed=True).lstrip(b"\x00") or b"\x00"},
            **more}  # fmt: skip


def _change(pos: int, op: str, before: dict | None, after: dict | None) -> dict:
    source = {"version": "2.7.0", "connector": "mysql", "name": "dbserver1", "ts_ms": MS + pos,
              "db": "inventory", "table": "orders", "file": "mysql-bin.000003", "pos": pos,
              "row": 0}  # fmt: skip
    return {"before": before, "after": after, "source": source, "op": op, "ts_ms": MS + pos}


def _json_value(pos: int, id_: int, name: str) -> bytes:
    """A JsonConverter message (schemas.enable) of the same table: a topic may mix them."""
    fields = [{"type": "int32", "optional": False, "field": "id"},
              {"type": "string", "optional": True, "field": "name"}]  # fmt: skip
    image = {"type": "struct", "fields": fields, "optional": True, "name": f"{NS}.Value"}
    schema = {"type": "struct", "name": f"{NS}.Envelope", "optional": False, "fields": [
        {**image, "field": "before"}, {**image, "field": "after"},
        {"type": "struct", "fields": [], "optional": False, "field": "source"},
        {"type": "string", "optional": False, "field": "op"}]}  # fmt: skip
    change = _change(pos, "c", None, {"id": id_, "name": name})
    return json.dumps({"schema": schema, "payload": change}).encode()


def _messages(registry: SchemaRegistryDouble, topic: str) -> list[dict]:
    client = SchemaRegistryClient({"url": registry.url, "basic.auth.user.info": "cdc:s3cret"})
    key_ser = AvroSerializer(client, json.dumps(KEY))
    v1 = AvroSerializer(client, json.dumps(_envelope(VALUE_V1)))
    v2 = AvroSerializer(client, json.dumps(_envelope(VALUE_V2)))

    def key(id_: int) -> bytes:
        return key_ser({"id": id_}, SerializationContext(topic, MessageField.KEY))

    def value(ser: AvroSerializer, change: dict) -> bytes:
        return ser(change, SerializationContext(topic, MessageField.VALUE))

    one = _row(1, "first", "12.34", 5, (1234567, 3))
    two = _row(2, "second", "-0.05", -7, (-5, 0))
    one_b = {**one, "amount": Decimal("99999999.99"), "qty": 32767}
    three = {**_row(3, "third", "0.01", 1, (15, 1)), "note": "added in v2"}
    one_c = {**one_b, "name": "first again", "note": "v2 update"}
    good = value(v1, _change(10, "c", None, one))
    return [
        {"key": key(1), "value": good},
        {"key": key(2), "value": value(v1, _change(20, "c", None, two))},
        {"key": key(1), "value": value(v1, _change(30, "u", one, one_b))},
        {"key": key(2), "value": value(v1, _change(40, "d", two, None))},
        {"key": key(2), "value": None},  # the delete's tombstone
        {"key": key(3), "value": value(v2, _change(50, "c", None, three))},
        {"key": key(1), "value": value(v2, _change(60, "u", {**one_b, "note": None}, one_c))},
        {"key": key(4), "value": _json_value(70, 4, "json value")},
        # Schema id 999 is not registered; a record cut short does not decode.
        {"key": key(5), "value": b"\x00\x00\x00\x03\xe7" + good[5:]},
        {"key": key(6), "value": good[:-4]},
    ]


DAY = datetime.date(2026, 3, 1)  # day 20513 of the epoch
NOON = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MILLI = datetime.timedelta(milliseconds=1)
EXPECTED = [
    {"id": 1, "name": "first again", "amount": Decimal("99999999.99"), "qty": 32767, "day": DAY,
     "created": NOON + MILLI, "seen": NOON, "total": Decimal("1234.567"), "note": "v2 update"},
    {"id": 3, "name": "third", "amount": Decimal("0.01"), "qty": 1, "day": DAY,
     "created": NOON + 3 * MILLI, "seen": NOON, "total": Decimal("1.5"), "note": "added in v2"},
    {"id": 4, "name": "json value", "amount": None, "qty": None, "day": None, "created": None,
     "seen": None, "total": None, "note": None},
]  # fmt: skip


def _source(bootstrap: str, topic: str, registry_url: str, fmt: str) -> SourceConfig:
    return SourceConfig(
        name="k",
        transport="kafka",
        format=fmt,
        kafka=KafkaConfig(bootstrap_servers=bootstrap, topics=[topic], idle_timeout_seconds=5),
        schema_registry=SchemaRegistryConfig(
            url=registry_url, basic_auth_user_info="cdc:${SR_PASSWORD}"
        ),
    )


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SR_PASSWORD", "s3cret")
    with SchemaRegistryDouble(user_info="cdc:s3cret") as double:
        yield double


@pytest.mark.parametrize("fmt", ["debezium", "auto"])
def test_debezium_avro_through_the_registry_gives_the_current_table(
    spark, tmp_path, kafka_bootstrap, registry, fmt
):
    topic = _topic(kafka_bootstrap, "avro")
    produced = _produce(kafka_bootstrap, topic, _messages(registry, topic))
    warehouse = tmp_path / "warehouse"
    source = _source(kafka_bootstrap, topic, registry.url, fmt)
    assert kafka.ingest_kafka(warehouse, source, date=DATE).records == len(produced)

    normalize_source(spark, warehouse, source, [DATE])
    merge_current(spark, warehouse, "k", TABLE)

    current = current_rows(spark, warehouse, "k", TABLE)
    columns = list(EXPECTED[0])
    rows = current.select(*columns).orderBy("id").toArrow().to_pylist()
    assert rows == EXPECTED
    types = dict(current.select(*columns).dtypes)
    assert types["amount"] == "decimal(10,2)" and types["total"] == "decimal(38,18)"
    assert types["qty"] == "smallint" and types["day"] == "date"

    quarantine = lake.read_arrow(lake.TableRef(lake.QUARANTINE, "k").uri(warehouse))
    reasons = sorted(quarantine.column("reason").to_pylist())
    assert len(reasons) == 2, reasons
    unknown, cut = sorted(reasons, key=lambda r: "999" not in r)
    assert unknown.startswith(
        "invalid Confluent Avro value: schema id 999 is not in the schema registry"
    )
    assert cut.startswith("invalid Confluent Avro value: schema id "), cut
    # The quarantine keeps the messages as they arrived, framing and all.
    assert all(v[:1] == b"\x00" for v in quarantine.column("value").to_pylist())
    # Each schema fetched once per Python worker, not per message.
    fetched = [r for r in registry.requests if r.startswith("GET /schemas/ids/")]
    assert len(fetched) <= 4 * len(set(fetched)), registry.requests


def test_a_registry_outage_fails_the_batch_as_transient_and_loses_nothing(
    spark, tmp_path, kafka_bootstrap, registry
):
    """While the registry is down, normalizing fails with a transient error (the step retries)
    and writes nothing; once it is back, the same batch gives the whole table and an empty
    quarantine."""
    topic = _topic(kafka_bootstrap, "avro-down")
    _produce(kafka_bootstrap, topic, _messages(registry, topic)[:8])  # the readable ones
    warehouse = tmp_path / "warehouse"
    source = _source(kafka_bootstrap, topic, registry.url, "debezium")
    kafka.ingest_kafka(warehouse, source, date=DATE)
    registry.stop()
    with pytest.raises(Exception) as failed:
        normalize_source(spark, warehouse, source, [DATE])
    reason = transient_reason(failed.value)
    assert reason is not None and reason.startswith("the schema registry is unavailable: "), reason
    assert registry.url in reason
    assert lake.read_arrow(lake.TableRef(lake.QUARANTINE, "k").uri(warehouse)) is None

    registry.start()
    normalize_source(spark, warehouse, source, [DATE])
    merge_current(spark, warehouse, "k", TABLE)
    rows = current_rows(spark, warehouse, "k", TABLE).select(*EXPECTED[0]).orderBy("id")
    assert rows.toArrow().to_pylist() == EXPECTED
    quarantine = lake.read_arrow(lake.TableRef(lake.QUARANTINE, "k").uri(warehouse))
    assert quarantine is None or quarantine.num_rows == 0


def test_avro_on_a_source_without_a_registry_says_to_set_one(
    spark, tmp_path, kafka_bootstrap, registry
):
    topic = _topic(kafka_bootstrap, "avro-unset")
    _produce(kafka_bootstrap, topic, _messages(registry, topic)[:2])
    warehouse = tmp_path / "warehouse"
    source = SourceConfig(
        name="k",
        transport="kafka",
        format="auto",
        kafka=KafkaConfig(
            bootstrap_servers=kafka_bootstrap, topics=[topic], idle_timeout_seconds=5
        ),
    )
    kafka.ingest_kafka(warehouse, source, date=DATE)
    normalize_source(spark, warehouse, source, [DATE])
    quarantine = lake.read_arrow(lake.TableRef(lake.QUARANTINE, "k").uri(warehouse))
    reasons = quarantine.column("reason").to_pylist()
    assert len(reasons) == 2
    assert all(r.startswith("Confluent Avro (magic byte 0, schema id ") for r in reasons), reasons
    assert all(r.endswith("): set schema_registry on the source to read it") for r in reasons)
