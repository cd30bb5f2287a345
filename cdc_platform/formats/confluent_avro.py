"""Avro in the Confluent wire format, read through a schema registry: Debezium with Kafka Connect's
``AvroConverter`` (the most common production setup), keys and values alike.

A framed message is a magic byte 0, the writer schema's id (4 bytes, big-endian), then Avro binary
with no header. ``decoded`` turns each framed key and value into the JSON text Kafka Connect's
``JsonConverter`` writes with ``schemas.enable`` (``{"schema": ..., "payload": ...}``), so every
format reads it as it reads JSON, with the types its Connect schema states: Avro logical types and
Debezium's named types (``connect.name``) map to the same Connect schema the JSON path sees, and
the values are written as the JsonConverter writes them (bytes and decimals as base64 of the
bytes, dates and times as their numbers). Unframed messages pass through untouched, so a topic
may mix Avro keys with JSON values.

No Spark function reads Avro binary: ``DataFrame.mapInArrow`` hands whole Arrow batches to
``fastavro.schemaless_reader`` (Python per record, as for DTS Avro). Each Python worker keeps one
``SchemaRegistryClient`` per registry and its schemas by id, so a schema is fetched once per
worker, not per message.

Outcomes: a message whose schema id the registry does not know, or whose bytes do not decode, is
an error record with the reason (``with_outcome``), and its raw bytes stay in the quarantine. A
registry that cannot be reached fails the batch with ``RegistryUnavailable`` in its message, which
the steps retry as transient. A framed message on a source without ``schema_registry`` is an error
record saying so.
"""

import base64
import io
import json
import re
import ssl
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_platform.formats import canonical as C
from cdc_platform.formats import json_records as J

ERROR = "_avro_error"  # why a framed key or value did not decode (null: it did, or not framed)
WIRE_VALUE = "_wire_value"  # the value as it arrived, restored after the parse
UNAVAILABLE = "RegistryUnavailable"  # in the message of a batch that could not reach the registry
HEADER_BYTES = 5


def framed(value: Column) -> Column:
    """True for a value in the Confluent wire format: magic byte 0 and a schema id."""
    b = value.cast("binary")
    return F.coalesce(
        (F.hex(F.substring(b, 1, 1)) == "00") & (F.octet_length(b) >= HEADER_BYTES), F.lit(False)
    )


def schema_id(value: Column) -> Column:
    """The schema id of a framed value."""
    return F.conv(F.hex(F.substring(value.cast("binary"), 2, 4)), 16, 10)


# --- Avro schema -> Kafka Connect schema (as the JsonConverter writes it) ------------------------

_PRIMITIVES = {
    "boolean": "boolean",
    "int": "int32",
    "long": "int64",
    "float": "float",
    "double": "double",
    "string": "string",
    "bytes": "bytes",
    "fixed": "bytes",
    "enum": "string",
}
# Avro logical types -> the Connect or Debezium type of the same wire value, for schemas whose
# writer did not name one in ``connect.name`` (the AvroConverter always does).
_LOGICAL_NAMES = {
    "decimal": "org.apache.kafka.connect.data.Decimal",
    "date": "org.apache.kafka.connect.data.Date",
    "time-millis": "org.apache.kafka.connect.data.Time",
    "timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
    "time-micros": "io.debezium.time.MicroTime",
    "timestamp-micros": "io.debezium.time.MicroTimestamp",
    "local-timestamp-millis": "io.debezium.time.Timestamp",
    "local-timestamp-micros": "io.debezium.time.MicroTimestamp",
    "uuid": "io.debezium.data.Uuid",
}


def _fullname(schema: dict, namespace: str | None) -> str:
    name = schema["name"]
    ns = schema.get("namespace", namespace)
    return name if "." in name or not ns else f"{ns}.{name}"


def connect_schema(
    avro: Any, names: dict[str, Any] | None = None, namespace: str | None = None
) -> dict:
    """The Kafka Connect schema (JsonConverter JSON) of an Avro schema; named types resolved."""
    names = {} if names is None else names
    if isinstance(avro, list):  # a union: [null, X] is an optional X; any other stays JSON text
        branches = [b for b in avro if b != "null"]
        if len(branches) == 1:
            return {**connect_schema(branches[0], names, namespace), "optional": True}
        return {"type": "string", "optional": "null" in avro}
    if isinstance(avro, str):
        if avro in _PRIMITIVES:
            return {"type": _PRIMITIVES[avro], "optional": False}
        named = names.get(avro) or names.get(f"{namespace}.{avro}")
        if named is None:
            raise ValueError(f"Avro schema names an unknown type {avro!r}")
        return named
    kind = avro["type"]
    if isinstance(kind, (dict, list)):  # {"type": {...}}: the inner schema
        return connect_schema(kind, names, namespace)
    if kind == "record":
        fullname = _fullname(avro, namespace)
        ns = fullname.rpartition(".")[0] or None
        struct: dict = {"type": "struct", "optional": False,
                        "name": avro.get("connect.name", fullname), "fields": []}  # fmt: skip
        names[fullname] = names[avro["name"]] = struct  # before the fields: they may refer to it
        for f in avro["fields"]:
            struct["fields"].append({**connect_schema(f["type"], names, ns), "field": f["name"]})
        return struct
    if kind == "array":
        return {"type": "array", "optional": False,
                "items": connect_schema(avro["items"], names, namespace)}  # fmt: skip
    if kind == "map":
        return {"type": "map", "optional": False, "keys": {"type": "string", "optional": False},
                "values": connect_schema(avro["values"], names, namespace)}  # fmt: skip
    out: dict = {
        "type": avro.get("connect.type", _PRIMITIVES.get(kind, "string")),
        "optional": False,
    }
    logical = avro.get("logicalType")
    name = avro.get("connect.name") or _LOGICAL_NAMES.get(logical)
    if name:
        out["name"] = name
    params = dict(avro.get("connect.parameters") or {})
    if logical == "decimal":
        params.setdefault("scale", str(avro.get("scale", 0)))
        params.setdefault("connect.decimal.precision", str(avro.get("precision", 38)))
    if params:
        out["parameters"] = params
    if kind in ("enum", "fixed"):
        names[_fullname(avro, namespace)] = names[avro["name"]] = out
    return out


def wire_schema(avro: Any) -> Any:
    """``avro`` without its logical types, so that fastavro reads the values as they are on the
    wire (a decimal's bytes, a date's days), which is how the JsonConverter writes them."""
    if isinstance(avro, dict):
        return {k: wire_schema(v) for k, v in avro.items() if k != "logicalType"}
    if isinstance(avro, list):
        return [wire_schema(v) for v in avro]
    return avro


def _json_ready(value: Any) -> Any:
    """A fastavro value as the JsonConverter writes it: bytes as base64."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_ready(v) for v in value]
    return value


# --- decoding on the Python workers ---------------------------------------------------------------


class RegistryUnavailable(RuntimeError):
    """The schema registry could not be reached (transient: the step retries)."""


def unavailable_reason(error_text: str) -> str | None:
    """What ``RegistryUnavailable`` said, from the text of the error a failed Spark job raised
    (a Python worker's traceback: its last line holding the marker is the message)."""
    said = re.findall(UNAVAILABLE + r": (schema registry [^\n]*)", error_text)
    return said[-1][:300] if said else None


class RegistryTlsError(RuntimeError):
    """The TLS handshake with the registry failed (a configuration error: not retried)."""


def _tls_failure(error: BaseException) -> bool:
    """Whether ``error`` or what caused it is a TLS failure (certificate, handshake)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLError) or "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class MessageError(ValueError):
    """This message cannot be decoded (its reason goes to the quarantine)."""


@dataclass(frozen=True)
class Reading:
    """How to read: the ``SchemaRegistryClient`` settings (secrets resolved), and under which
    subjects key and value schemas are registered (``topic``, ``record``, ``topic_record``), which
    matters when ``use_latest_version`` reads every message with its subject's newest schema."""

    client: dict[str, str]
    key_subject_name_strategy: str = "topic"
    value_subject_name_strategy: str = "topic"
    use_latest_version: bool = False

    def subject(self, topic: str, record: str, part: str) -> str:
        strategy = getattr(self, f"{part}_subject_name_strategy")
        return {"topic": f"{topic}-{part}", "record": record,
                "topic_record": f"{topic}-{record}"}[strategy]  # fmt: skip


@dataclass(frozen=True)
class _Schema:
    parsed: Any  # fastavro's parsed wire schema
    connect: str  # the Connect schema, as the JsonConverter's JSON text
    record: str  # the top record's full name (the record subject strategies' subject)


class Decoder:
    """One registry's client and the schemas it served, by id (and the newest per subject, for
    ``use_latest_version``, for the client's ``cache.latest.ttl.sec``)."""

    def __init__(self, reading: Reading):
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.reading = reading
        self.url = reading.client["url"]
        self.client = SchemaRegistryClient.new_client(
            {"cache.latest.ttl.sec": 60, **reading.client}
        )
        self.schemas: dict[int, _Schema | MessageError] = {}

    def _registry_call(self, call, what: str):
        """``call()``; RegistryUnavailable when the registry is unreachable or failing,
        MessageError when it does not know ``what``."""
        from confluent_kafka.schema_registry.common._httpx_compat import httpx
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return call()
        except httpx.TransportError as e:
            if _tls_failure(e):  # a certificate or key the registry refuses: no retry mends it
                raise RegistryTlsError(f"schema registry {self.url}: TLS failed: {e}") from e
            raise RegistryUnavailable(f"{UNAVAILABLE}: schema registry {self.url}: {e}") from e
        except SchemaRegistryError as e:
            if e.http_status_code == 404:
                raise MessageError(f"{what} is not in the schema registry ({e})") from e
            if e.http_status_code >= 500:
                raise RegistryUnavailable(f"{UNAVAILABLE}: schema registry {self.url}: {e}") from e
            raise  # 401, 403: the configuration is wrong, which no retry mends

    def schema(self, sid: int) -> _Schema:
        """Schema ``sid``, fetched once."""
        if sid not in self.schemas:
            try:
                self.schemas[sid] = self._fetch(sid)
            except MessageError as e:
                self.schemas[sid] = e
        found = self.schemas[sid]
        if isinstance(found, MessageError):
            raise found
        return found

    def _fetch(self, sid: int) -> _Schema:
        import fastavro

        registered = self._registry_call(lambda: self.client.get_schema(sid), f"schema id {sid}")
        if (registered.schema_type or "AVRO") != "AVRO":
            raise MessageError(f"schema id {sid} is {registered.schema_type}, not Avro")
        try:
            avro = json.loads(registered.schema_str)
            parsed = fastavro.parse_schema(wire_schema(avro))
            connect = json.dumps(connect_schema(avro), separators=(",", ":"))
            record = _fullname(avro, None) if isinstance(avro, dict) and "name" in avro else ""
        except Exception as e:  # a schema this reader cannot take is every such message's problem
            raise MessageError(f"schema id {sid}: {type(e).__name__}: {e}") from e
        return _Schema(parsed, connect, record)

    def _latest(self, topic: str, writer: _Schema, part: str) -> _Schema:
        subject = self.reading.subject(topic, writer.record, part)
        latest = self._registry_call(
            lambda: self.client.get_latest_version(subject), f"subject {subject!r}"
        )
        return self.schema(latest.schema_id)

    def json_text(self, data: bytes, topic: str | None, part: str) -> bytes:
        """A framed message -> the JsonConverter's text of it (``{"schema", "payload"}``)."""
        import fastavro

        sid = int.from_bytes(data[1:HEADER_BYTES], "big")
        writer = reader = self.schema(sid)
        if self.reading.use_latest_version:
            reader = self._latest(topic or "", writer, part)
        body = io.BytesIO(data)
        body.seek(HEADER_BYTES)
        try:
            record = fastavro.schemaless_reader(body, writer.parsed, reader.parsed)
        except Exception as e:
            raise MessageError(f"schema id {sid}: {type(e).__name__}: {e}") from e
        if body.tell() != len(data):
            raise MessageError(f"schema id {sid}: {len(data) - body.tell()} bytes after the record")
        payload = json.dumps(_json_ready(record), separators=(",", ":"))
        return ('{"schema":' + reader.connect + ',"payload":' + payload + "}").encode()


_DECODERS: dict[str, Decoder] = {}
_LOCK = threading.Lock()


def decoder_for(reading: Reading) -> Decoder:
    """This worker's decoder for a registry (kept for the worker's life)."""
    key = json.dumps(asdict(reading), sort_keys=True)
    with _LOCK:
        if key not in _DECODERS:
            _DECODERS[key] = Decoder(reading)
        return _DECODERS[key]


def _decode_column(values: list, topics: list, decoder: Decoder, part: str, errors: list) -> list:
    out = []
    for i, v in enumerate(values):
        if v is not None and len(v) >= HEADER_BYTES and v[0] == 0:
            try:
                v = decoder.json_text(v, topics[i], part)
            except MessageError as e:
                errors[i] = errors[i] or f"invalid Confluent Avro {part}: {e}"[:500]
        out.append(v)
    return out


def _decode_batches(reading: Reading):
    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        decoder = decoder_for(reading)
        for batch in batches:
            errors: list[str | None] = [None] * batch.num_rows
            value = batch.column("value")
            topics = batch.column("topic").to_pylist()
            columns = {
                part: _decode_column(batch.column(part).to_pylist(), topics, decoder, part, errors)
                for part in ("key", "value")
            }
            arrays = [
                pa.array(columns[n], pa.binary()) if n in columns else batch.column(n)
                for n in batch.schema.names
            ]
            names = [*batch.schema.names, ERROR, WIRE_VALUE]
            yield pa.RecordBatch.from_arrays(
                [*arrays, pa.array(errors, pa.string()), value], names=names
            )

    return decode


def decoded(raw: DataFrame, registry: Reading | None) -> DataFrame:
    """``raw`` with framed keys and values as the JsonConverter's JSON text, the reason a framed
    one did not decode (``ERROR``) and the value as it arrived (``WIRE_VALUE``). Without a
    registry (None), ``raw`` as it is."""
    if registry is None:
        return raw
    fields = [*raw.schema.fields, T.StructField(ERROR, T.StringType()),
              T.StructField(WIRE_VALUE, T.BinaryType())]  # fmt: skip
    return raw.mapInArrow(_decode_batches(registry), T.StructType(fields))


def with_outcome(parsed: DataFrame, registry: Reading | None) -> DataFrame:
    """Parsed records of ``decoded`` messages: an undecodable one is an error record with its
    reason, and every record keeps the value as it arrived."""
    if registry is None:
        no_registry = F.concat(
            F.lit("Confluent Avro (magic byte 0, schema id "), schema_id(F.col("value")),
            F.lit("): set schema_registry on the source to read it"),
        )  # fmt: skip
        # Only where no format could read the message as JSON, not a binary format's own error.
        unreadable = F.col("reason").isin(J.NOT_AN_OBJECT, C.UNRECOGNISED)
        unread = (F.col("kind") == C.KIND_ERROR) & unreadable & framed(F.col("value"))
        return parsed.withColumn("reason", F.when(unread, no_registry).otherwise(F.col("reason")))
    failed = F.col(ERROR).isNotNull()
    return parsed.withColumns(
        {
            "kind": F.when(failed, F.lit(C.KIND_ERROR)).otherwise(F.col("kind")),
            "reason": F.when(failed, F.col(ERROR)).otherwise(F.col("reason")),
            "value": F.col(WIRE_VALUE),
        }
    ).drop(ERROR, WIRE_VALUE)
