"""Alibaba DTS Avro: one schemaless Avro ``Record`` per message value (``dts_avro.avsc``).

DTS writes each change as Avro binary with no container header, magic byte or schema id; the
writer schema is ``com.alibaba.dts.formats.avro.Record`` (``../shared/specs/dts-avro.md``), with or
without the trailing ``bornTimestamp`` field (writers before mid-2020 do not have it).

Avro binary cannot be read by Spark functions, so this is the one format that decodes in Python:
``DataFrame.mapInArrow`` hands whole Arrow batches to ``fastavro.schemaless_reader`` (no per-row
UDF) and returns the raw columns untouched plus the parsed-record columns. Everything else follows
the other formats: images are ``map<string,string>`` of wire text, typed per table later by
``column_specs`` (which reads the ``fields`` list kept as ``value_schema``).

Mapping:

- ``objectName`` ``db.table`` / ``db.schema.table`` (``\\u002E`` is a dot inside a name) ->
  database, schema, table; PolarDB-X 1.0 logical names (tags ``l_db_name``/``l_tb_name``) win.
- ``operation`` INSERT/UPDATE/DELETE -> c/u/d, INIT (full load) -> r; DDL -> kind ddl (the SQL is
  the ``afterImages`` string) except ``TRUNCATE [TABLE] t``, which is the truncate op ``t`` of t;
  HEARTBEAT, BEGIN/COMMIT/ROLLBACK/ABORT and the other bookkeeping ops -> control.
- values by union branch: Integer/Decimal as their decimal text, Float as the shortest round-trip
  text, Character decoded from its charset (``binary`` -> base64), binary objects and geometry as
  base64 (text-like object types such as JSON/TEXT as UTF-8), Timestamp and zone-less DATETIME as
  epoch microseconds (wall clock read as UTC, like Debezium), DATE as ``yyyy-MM-dd``, TIME and
  intervals as text. SQL NULL is a null value; ``EmptyObject`` ("not captured") leaves the column
  out, and an after image missing columns that way is partial (the rest keep their values).
- key: ``tags["pk_uk_info"]`` (``PRIMARY``, else the first unique key).
- order (``source_sequence``): MySQL/PolarDB-X binlog file index and offset from
  ``sourcePosition`` (``offset@file``), then the stream ``id``; other sources by ``id``.
- ``event_time``: ``sourceTimestamp`` (seconds), refined by ``bornTimestamp`` when it is in ms
  and within the same second; ``tx_id``: ``sourceTxid`` unless empty or ``0``, else tag ``GTID``.

Bytes that do not decode (truncated, corrupt, unknown enum index, trailing garbage) become kind
``error`` with reason ``invalid DTS Avro: ...``; nothing raises.
"""

import base64
import datetime as dt
import functools
import importlib.resources
import io
import json
import math
import re
from collections.abc import Iterator
from typing import Any
from zoneinfo import ZoneInfo

import fastavro
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc_platform.formats import canonical as C
from cdc_platform.formats.column_specs import ColumnSpec
from cdc_platform.formats.contract import Options

NAME = "dts-avro"
OPTIONS: Options = {}
IMAGE_PATHS = ()  # the parsed images keep the wire column order
TOKEN_PATHS = ()  # Avro, typed by its union branches
CLAIM_PATHS: dict[str, str] = {}  # the claim reads no JSON but its keys (none: binary)

SCHEMA_RESOURCE = "dts_avro.avsc"
_NS = "com.alibaba.dts.formats.avro."


# --- the writer schema ---------------------------------------------------------------------------


def schema_json() -> dict:
    """The DTS Avro writer schema (package data ``cdc_platform/formats/dts_avro.avsc``)."""
    resource = importlib.resources.files("cdc_platform.formats").joinpath(SCHEMA_RESOURCE)
    return json.loads(resource.read_text(encoding="utf-8"))


@functools.cache
def parsed_schema(with_born_timestamp: bool = True) -> dict:
    """The parsed writer schema; ``False``: the pre-2020 schema without ``bornTimestamp``."""
    schema = schema_json()
    if not with_born_timestamp:
        schema["fields"] = [f for f in schema["fields"] if f["name"] != "bornTimestamp"]
    return fastavro.parse_schema(schema)


class InvalidRecord(ValueError):
    """Bytes that are not one DTS Avro record."""


def _zigzag_long(data: bytes) -> tuple[int, int]:
    """One Avro long at the start of ``data`` -> (value, bytes used)."""
    acc = shift = 0
    for i, byte in enumerate(data[:10]):
        acc |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (acc >> 1) ^ -(acc & 1), i + 1
        shift += 7
    raise InvalidRecord("truncated bornTimestamp, or bytes after the record")


def decode(value: bytes) -> dict[str, Any]:
    """One message value -> the record (``bornTimestamp`` None when the writer predates it).

    Read with the legacy schema, then the optional trailing long: this accepts both writer
    generations. Any other trailing byte means the value is not one record. Raises on bad bytes.
    """
    buf = io.BytesIO(value)
    record = fastavro.schemaless_reader(buf, parsed_schema(False), return_named_type=True)
    rest = buf.read()
    record["bornTimestamp"] = None
    if rest:
        born, used = _zigzag_long(rest)
        if used != len(rest):
            raise InvalidRecord(f"{len(rest) - used} bytes after the end of the record")
        record["bornTimestamp"] = born
    return record


# --- column types: dataTypeNumber (per source type) -> spec kind -------------------------------

# Kinds: a fixed Spark type, or one that needs a hint from the message's values (see _hint):
# "decimal" (scale), "chars" (binary charset -> binary), "lob" (text-like object -> string).
_TIMESTAMP = "timestamp"  # epoch microseconds (decoder epoch_micros)
_TIME = "time"  # text: Spark has no TIME type
_MYSQL = {
    0: "decimal", 246: "decimal", 1: "tinyint", 2: "smallint", 3: "int", 9: "int", 8: "bigint",
    16: "bigint", 4: "float", 5: "double", 7: _TIMESTAMP, 17: _TIMESTAMP, 12: _TIMESTAMP,
    18: _TIMESTAMP, 10: "date", 14: "date", 11: _TIME, 19: _TIME, 13: "int", 15: "chars",
    253: "chars", 254: "chars", 6: "string", 245: "string", 247: "string", 248: "string",
    249: "lob", 250: "lob", 251: "lob", 252: "lob", 255: "binary",
}  # fmt: skip
_POSTGRES = {
    21: "smallint", 23: "int", 20: "bigint", 1700: "decimal", 700: "float", 701: "double",
    16: "boolean", 18: "chars", 1042: "chars", 1043: "chars", 25: "chars", 17: "lob",
    1082: "date", 1083: _TIME, 1266: _TIME, 1114: _TIMESTAMP, 1184: _TIMESTAMP, 3802: "lob",
    1186: "string", 114: "string", 2950: "string", 142: "string", 1560: "string", 1561: "string",
    790: "string", 869: "string", 650: "string", 829: "string", 600: "string", 601: "string",
    602: "string", 603: "string", 604: "string", 628: "string", 718: "string", 3220: "string",
    3614: "string", 3615: "string", 2970: "string",
}  # fmt: skip
_ORACLE = {
    2: "decimal", 100: "float", 101: "double", 1: "chars", 96: "chars", 8: "chars", 112: "chars",
    58: "chars", 12: _TIMESTAMP, 180: _TIMESTAMP, 181: _TIMESTAMP, 231: _TIMESTAMP,
    182: "string", 183: "string", 69: "string", 208: "string", 114: "string", 113: "lob",
    23: "lob", 24: "lob",
}  # fmt: skip
_CODES = {"MySQL": _MYSQL, "DRDS": _MYSQL, "PostgreSQL": _POSTGRES, "Oracle": _ORACLE}
# Unknown source type or code: the value's branch decides.
_BY_BRANCH = {
    "Integer": "bigint", "Decimal": "decimal", "Float": "double", "Timestamp": _TIMESTAMP,
    "TimestampWithTimeZone": _TIMESTAMP, "DateTime": "string", "Character": "chars",
    "BinaryObject": "lob", "BinaryGeometry": "binary", "TextObject": "string",
    "TextGeometry": "string",
}  # fmt: skip
_TEXT_OBJECTS = {"TEXT", "JSON", "XML", "ENUM", "SET", "UUID", "ROWID", "UROWID", "XTYPE"}


def _kind(source_type: str | None, code: int, hint: dict | None) -> str | None:
    kind = _CODES.get(source_type or "", {}).get(code)
    if kind is None:
        return _BY_BRANCH.get(hint["branch"]) if hint else None
    return kind


def field_spec(source_type: str | None, code: int, hint: dict | None) -> ColumnSpec | None:
    """A column's spec; None when this message cannot tell (e.g. a DECIMAL whose value is null)."""
    kind = _kind(source_type, code, hint)
    if kind is None:
        return None
    if kind == _TIMESTAMP:
        return ColumnSpec("timestamp", "epoch_micros")
    if kind == _TIME:
        return ColumnSpec("string")
    if kind == "binary":
        return ColumnSpec("binary", "base64")
    if kind in ("decimal", "chars", "lob"):
        if not hint:
            return None
        if kind == "decimal":
            if "scale" not in hint:  # an Integer branch in a NUMBER column
                return ColumnSpec("decimal(38,0)")
            return ColumnSpec(f"decimal(38,{min(max(hint['scale'], 0), 38)})")
        if hint.get("binary"):
            return ColumnSpec("binary", "base64")
        return ColumnSpec("string")
    return ColumnSpec(kind)


def column_specs(value_schema: str) -> dict[str, ColumnSpec]:
    """Column types from a ``value_schema`` written by ``parse``.

    ``{"source": "MySQL", "fields": [[name, dataTypeNumber, hint-or-null], ...]}``; the hint
    records what the message's value showed where the type code alone does not decide (decimal
    scale, a ``binary`` charset, a text-like object). Columns this message cannot type are left
    out, so they keep what another message decided (or default to string).
    """
    schema = json.loads(value_schema)
    specs = {}
    for name, code, hint in schema["fields"]:
        spec = field_spec(schema.get("source"), code, hint)
        if spec is not None:
            specs[name] = spec
    return specs


# --- values -> wire text -------------------------------------------------------------------------

_ABSENT = object()  # EmptyObject: the value was not captured; the column is left out
_CHARSETS = {
    "utf8": "utf-8", "utf8mb3": "utf-8", "utf8mb4": "utf-8", "latin1": "cp1252",
    "gb2312": "gb2312", "ujis": "euc_jp", "sjis": "shift_jis", "euckr": "euc_kr",
    "ucs2": "utf-16-be", "utf16": "utf-16-be", "utf16le": "utf-16-le", "utf32": "utf-32-be",
    "ascii": "ascii", "binary": None,
}  # fmt: skip
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_OFFSET = re.compile(r"^(?:GMT|UTC)?\s*([+-])(\d{1,2})(?::?(\d{2}))?$")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _text(data: bytes, charset: str) -> str:
    name = _CHARSETS.get(charset.lower(), charset)
    try:
        return data.decode(name or "utf-8", errors="replace")
    except LookupError:
        return data.decode("utf-8", errors="replace")


def _fraction(dtv: dict, nanos: bool) -> int:
    """DateTime ``millis`` in microseconds (it holds nanoseconds for Oracle)."""
    frac = dtv.get("millis") or 0
    return frac // 1000 if nanos else frac


def _zone(text: str) -> dt.tzinfo:
    t = text.strip()
    if t.upper() in ("Z", "UTC", "GMT"):
        return dt.UTC
    if m := _OFFSET.match(t):
        delta = dt.timedelta(hours=int(m.group(2)), minutes=int(m.group(3) or 0))
        return dt.timezone(-delta if m.group(1) == "-" else delta)
    return ZoneInfo(t)


def _epoch_micros(dtv: dict, nanos: bool, zone: dt.tzinfo = dt.UTC) -> str:
    wall = dt.datetime(
        dtv["year"], dtv["month"], dtv["day"],
        dtv.get("hour") or 0, dtv.get("minute") or 0, dtv.get("second") or 0, tzinfo=zone,
    )  # fmt: skip
    delta = wall - _EPOCH
    return str((delta.days * 86_400 + delta.seconds) * 1_000_000 + _fraction(dtv, nanos))


def _datetime_text(dtv: dict, nanos: bool) -> str:
    """A wall-clock value as text: date, time of day, interval or year, whichever parts exist."""
    y, mo, d = dtv.get("year"), dtv.get("month"), dtv.get("day")
    h, mi, s = dtv.get("hour"), dtv.get("minute"), dtv.get("second")
    parts = []
    if y is not None and mo is not None and d is not None:
        parts.append(f"{y:04d}-{mo:02d}-{d:02d}")
    elif y is not None and mo is not None:  # interval year to month
        parts.append(f"{y}-{abs(mo)}")
    elif y is not None:
        parts.append(str(y))
    elif d is not None:  # interval day to second
        parts.append(str(d))
    if h is not None or mi is not None or s is not None:
        clock = [h or 0, mi or 0, s or 0]
        sign = "-" if any(v < 0 for v in clock) else ""
        text = f"{sign}{abs(clock[0]):02d}:{abs(clock[1]):02d}:{abs(clock[2]):02d}"
        if dtv.get("millis"):
            text += f".{abs(dtv['millis']):09d}" if nanos else f".{abs(dtv['millis']):06d}"
        parts.append(text)
    return " ".join(parts)


def _as_is(payload: dict, target: str, nanos: bool) -> str:
    return payload["value"]


def _float(payload: dict, target: str, nanos: bool) -> str:
    v = payload["value"]
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return repr(v)


def _character(payload: dict, target: str, nanos: bool) -> str:
    if target == "binary" or payload["charset"].lower() == "binary":
        return _b64(payload["value"])
    return _text(payload["value"], payload["charset"])


def _binary(payload: dict, target: str, nanos: bool) -> str:
    if target == "binary":
        return _b64(payload["value"])
    return payload["value"].decode("utf-8", errors="replace")


def _timestamp(payload: dict, target: str, nanos: bool) -> str:
    """Epoch seconds + microseconds (a UTC instant)."""
    micros = payload["timestamp"] * 1_000_000 + payload["millis"]
    if target == "timestamp":
        return str(micros)
    return (_EPOCH + dt.timedelta(microseconds=micros)).isoformat()


def _wall_clock(dtv: dict, zone_text: str | None, target: str, nanos: bool) -> str:
    try:
        if target == "timestamp":
            zone = _zone(zone_text) if zone_text else dt.UTC
            return _epoch_micros(dtv, nanos, zone)
        if target == "date":
            return f"{dtv['year']:04d}-{dtv['month']:02d}-{dtv['day']:02d}"
        if target in ("int", "smallint", "bigint"):  # YEAR
            return str(dtv["year"])
    except (TypeError, ValueError, KeyError, OverflowError, LookupError):
        pass  # zero dates, missing parts, unknown zones: the text (quarantined as mismatch)
    text = _datetime_text(dtv, nanos)
    if zone_text:
        text += zone_text if zone_text[:1] in "+-" else f" {zone_text}"
    return text


def _datetime(payload: dict, target: str, nanos: bool) -> str:
    return _wall_clock(payload, None, target, nanos)


def _datetime_zone(payload: dict, target: str, nanos: bool) -> str:
    return _wall_clock(payload["value"], payload["timezone"], target, nanos)


def _absent(payload: Any, target: str, nanos: bool) -> Any:
    return _ABSENT


# A value's union branch (its full Avro name) -> (payload, column type, nanos) -> wire text.
_RENDER = {
    _NS + "Integer": _as_is, _NS + "Decimal": _as_is, _NS + "TextObject": _as_is,
    _NS + "TextGeometry": _as_is, _NS + "Float": _float, _NS + "Character": _character,
    _NS + "BinaryObject": _binary, _NS + "BinaryGeometry": _binary,
    _NS + "Timestamp": _timestamp, _NS + "DateTime": _datetime,
    _NS + "TimestampWithTimeZone": _datetime_zone, _NS + "EmptyObject": _absent,
}  # fmt: skip


def render(branch: str, payload: Any, target: str, nanos: bool) -> Any:
    """One image value -> its wire text (None: SQL NULL; ``_ABSENT``: not captured).

    ``target``: the column's Spark type (``string`` when this message cannot tell)."""
    fn = _RENDER.get(branch)
    if fn is None:
        raise InvalidRecord(f"unknown value branch {(branch or '').removeprefix(_NS)}")
    return fn(payload, target, nanos)


# What a value tells about its column's type beyond the type code, as a hashable key:
# (branch,), or (branch, detail) for a decimal's scale and whether chars/objects are binary.
_PLAIN_HINTS = {
    _NS + b: (b,)
    for b in ("Integer", "Float", "Timestamp", "DateTime", "TimestampWithTimeZone",
              "BinaryGeometry", "TextObject", "TextGeometry")
}  # fmt: skip


def _hint(value: tuple | None) -> tuple | None:
    """A value's hint key; None for SQL NULL and not captured (EmptyObject)."""
    if value is None:
        return None
    branch, payload = value
    if branch == _NS + "Decimal":
        return ("Decimal", payload["scale"])
    if branch == _NS + "Character":
        return ("Character", payload["charset"].lower() == "binary")
    if branch == _NS + "BinaryObject":
        return ("BinaryObject", payload["type"].upper() not in _TEXT_OBJECTS)
    return _PLAIN_HINTS.get(branch)


def _hint_json(hint: tuple | None) -> dict | None:
    """A hint key as ``value_schema`` writes it (what ``field_spec`` reads)."""
    if hint is None:
        return None
    if len(hint) == 1:
        return {"branch": hint[0]}
    return {"branch": hint[0], "scale" if hint[0] == "Decimal" else "binary": hint[1]}


# Both are asked once per column of every message, with few distinct arguments: cached (bounded,
# as codes and names come from the data).
@functools.lru_cache(maxsize=4096)
def _target(source_type: str, code: int, hint: tuple | None) -> str:
    """The Spark type a column's values render for (``string`` when undecided)."""
    spec = field_spec(source_type, code, _hint_json(hint))
    return spec.type if spec else "string"


@functools.lru_cache(maxsize=1024)
def _value_schema(source_type: str, columns: tuple) -> str:
    """``value_schema`` of a message: its source type and (name, code, hint key) per field."""
    fields = [[name, code, _hint_json(hint)] for name, code, hint in columns]
    return json.dumps({"source": source_type, "fields": fields}, separators=(",", ":"))


# --- record -> parsed-record columns -------------------------------------------------------------

_ROW_OPS = {"INSERT": C.INSERT, "UPDATE": C.UPDATE, "DELETE": C.DELETE, "INIT": C.READ}
_TRANSACTION_OPS = {"BEGIN", "COMMIT", "ROLLBACK", "ABORT"}
_NAME_PART = r'(?:`[^`]+`|"[^"]+"|[\w$]+)'
_TRUNCATE = re.compile(
    rf"^\s*truncate\s+(?:table\s+)?({_NAME_PART}(?:\s*\.\s*{_NAME_PART}){{0,2}})\s*;?\s*$",
    re.IGNORECASE,
)
_MYSQL_POSITION = re.compile(r"^(\d+)@(\d+)$")

OUTPUT_FIELDS = C.PARSED_SCHEMA.fields
_ARROW_TYPES = {
    "key_columns": pa.list_(pa.string()),
    "before_image": pa.map_(pa.string(), pa.string()),
    "after_image": pa.map_(pa.string(), pa.string()),
    "after_partial": pa.bool_(),
    "event_time": pa.timestamp("us", tz="UTC"),
}


def _object_name(name: str | None) -> list[str]:
    if not name:
        return []
    return [p.replace("\\u002E", ".") for p in name.split(".")]


def _identity(parts: list[str]) -> tuple[str | None, str | None, str | None]:
    """objectName parts -> (database, schema, table)."""
    if len(parts) == 1:
        return parts[0], None, None
    if len(parts) == 2:
        return parts[0], None, parts[1]
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    return None, None, None


def _key_columns(tags: dict[str, str]) -> list[str] | None:
    cols = _key_of(tags.get("pk_uk_info") or "{}")
    return None if cols is None else list(cols)


@functools.lru_cache(maxsize=1024)  # one pk_uk_info text per table: parsed once
def _key_of(pk_uk_info: str) -> tuple[str, ...] | None:
    try:
        info = json.loads(pk_uk_info)
    except ValueError:
        return None
    if not isinstance(info, dict):
        return None
    for cols in [info.get("PRIMARY"), *(v for k, v in info.items() if k != "PRIMARY")]:
        if isinstance(cols, list) and cols and all(isinstance(c, str) for c in cols):
            return tuple(cols)
    return None


def _sequence(record: dict) -> str:
    rid = f"{record['id']:020d}"
    position = _MYSQL_POSITION.match(record.get("sourcePosition") or "")
    if record["source"]["sourceType"] in ("MySQL", "DRDS") and position:
        offset, file_index = position.groups()
        return f"binlog:{int(file_index):010d}.{int(offset):020d}.{rid}"
    return f"id:{rid}"


def _event_micros(record: dict) -> int | None:
    seconds = record["sourceTimestamp"]
    born = record.get("bornTimestamp")
    if born and born >= 10**11 and born // 1000 == seconds:  # ms of the same second
        return born * 1000
    micros = seconds * 1_000_000
    return micros if abs(micros) < 2**63 else None  # beyond an Arrow timestamp: unknown


class _Reject(Exception):
    """A decodable record that cannot be used; the message is the quarantine reason."""


def _value_list(record: dict, side: str, n: int) -> list | None:
    values = record.get(side)
    if values is None:
        return None
    if not isinstance(values, list):
        raise _Reject(f"DTS Avro {side} is not a value list")
    if len(values) != n:
        raise _Reject(f"DTS Avro {side} has {len(values)} values for {n} fields")
    return values


def _images(record: dict, source_type: str) -> dict[str, Any]:
    """``fields`` + image arrays -> images, partial flag and value_schema."""
    fields = record.get("fields")
    if not isinstance(fields, list):
        raise _Reject("DTS Avro row change without a field list")
    before = _value_list(record, "beforeImages", len(fields))
    after = _value_list(record, "afterImages", len(fields))
    nanos = source_type == "Oracle"
    before_image = None if before is None else {}
    after_image = None if after is None else {}
    partial = False
    columns = []
    for i, field in enumerate(fields):
        name, code = field["name"], field["dataTypeNumber"]
        # the after image's value tells the type, else the before image's
        hint = (_hint(after[i]) if after is not None else None) or (
            _hint(before[i]) if before is not None else None
        )
        columns.append((name, code, hint))
        target = _target(source_type, code, hint)
        if before is not None:
            value = before[i]
            text = None if value is None else render(value[0], value[1], target, nanos)
            if text is not _ABSENT:
                before_image[name] = text
        if after is not None:
            value = after[i]
            text = None if value is None else render(value[0], value[1], target, nanos)
            if text is _ABSENT:
                partial = True
            else:
                after_image[name] = text
    return {
        "before_image": before_image,
        "after_image": after_image,
        "after_partial": partial,
        "value_schema": _value_schema(source_type, tuple(columns)),
    }


def parse_record(record: dict) -> dict[str, Any]:
    """One decoded record -> the parsed-record columns (``canonical.PARSED_SCHEMA``)."""
    source_type = record["source"]["sourceType"]
    operation = record["operation"]
    tags = record.get("tags") or {}
    parts = _object_name(record.get("objectName"))
    database, schema, table = _identity(parts)
    if tags.get("l_db_name") and tags.get("l_tb_name"):  # PolarDB-X 1.0 logical names
        database, schema, table = tags["l_db_name"], None, tags["l_tb_name"]
    txid = record.get("sourceTxid")
    out: dict[str, Any] = {
        "database": database,
        "schema": schema,
        "table": table,
        "source_sequence": _sequence(record),
        "event_time": _event_micros(record),
        "tx_id": txid if txid not in (None, "", "0") else tags.get("GTID"),
    }
    if operation == "DDL":
        ddl = record.get("afterImages")
        ddl = ddl if isinstance(ddl, str) else None
        out["ddl"] = ddl
        m = _TRUNCATE.match(ddl or "")
        if not m:
            return {**out, "kind": C.KIND_DDL}
        names = [p.strip().strip('`"') for p in m.group(1).split(".")]
        if len(names) == 1:
            names = [database, names[0]]
        database, schema, table = _identity(names)
        return {**out, "kind": C.KIND_CHANGE, "op": C.TRUNCATE, "database": database,
                "schema": schema, "table": table}  # fmt: skip
    if operation not in _ROW_OPS:
        if operation in _TRANSACTION_OPS:
            reason = f"transaction {operation}"
        elif operation == "NOOP":
            reason = "NOOP filler"
        else:
            reason = operation.lower()
        return {**out, "kind": C.KIND_CONTROL, "reason": reason}
    op = _ROW_OPS[operation]
    out["op"] = op
    try:
        if len(parts) > 3:
            raise _Reject(f"invalid objectName {record.get('objectName')!r}: more than 3 parts")
        if not table:
            raise _Reject("DTS Avro row change without a table in objectName")
        out.update(_images(record, source_type))
        if op in (C.INSERT, C.READ, C.UPDATE) and out["after_image"] is None:
            raise _Reject(f"op '{op}' without an after image")
        if op == C.DELETE and out["before_image"] is None:
            raise _Reject("delete without before image: the row cannot be identified")
    except _Reject as e:
        return {**out, "kind": C.KIND_ERROR, "reason": str(e)}
    return {**out, "kind": C.KIND_CHANGE, "key_columns": _key_columns(tags)}


def parse_value(value: bytes | None) -> dict[str, Any]:
    """One message value -> parsed-record columns; never raises."""
    if value is None:
        return {"kind": C.KIND_CONTROL, "reason": "kafka tombstone"}
    try:
        record = decode(value)
    except Exception as e:  # any decoding failure is this message's problem
        detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if isinstance(e, EOFError):
            detail = f"truncated record ({detail})"
        elif isinstance(e, IndexError):  # e.g. a SourceType/Operation symbol this schema lacks
            detail = f"enum or union index out of range ({detail})"
        return {"kind": C.KIND_ERROR, "reason": f"invalid DTS Avro: {detail}"[:500]}
    try:
        return parse_record(record)
    except Exception as e:  # a record shape no branch above foresaw
        return {"kind": C.KIND_ERROR, "reason": f"invalid DTS Avro record: {type(e).__name__}: {e}"}


_IMAGE_COLUMNS = ("before_image", "after_image")
_CONSTANT_COLUMNS = {"image_encoding": "json", "source_format": NAME}


class _Columns:
    """The parsed-record columns of one batch, filled a row at a time.

    Each row is spread into one list per column as soon as it is parsed, and each image into flat
    lists of keys and values: no row dict outlives its message, so the cyclic GC has no growing
    heap of rows to rescan, and a map column is built from three flat arrays instead of a list
    of pairs per row (both were a tenth or more of the CPU)."""

    def __init__(self) -> None:
        self.rows = 0
        skip = {*_IMAGE_COLUMNS, *_CONSTANT_COLUMNS}
        self.values: dict[str, list] = {f.name: [] for f in OUTPUT_FIELDS if f.name not in skip}
        # per image column: offsets, keys, values, null flags
        self.images = {name: ([0], [], [], []) for name in _IMAGE_COLUMNS}

    def add(self, row: dict[str, Any]) -> None:
        self.rows += 1
        for name, column in self.values.items():
            column.append(row.get(name))
        for name, (offsets, keys, values, nulls) in self.images.items():
            image = row.get(name)
            if image is not None:
                keys.extend(image)
                values.extend(image.values())
            offsets.append(len(keys))
            nulls.append(image is None)

    def arrays(self) -> list[pa.Array]:
        """The columns in ``OUTPUT_FIELDS`` order."""
        out = []
        for f in OUTPUT_FIELDS:
            if f.name in _CONSTANT_COLUMNS:
                out.append(pa.array([_CONSTANT_COLUMNS[f.name]] * self.rows, pa.string()))
            elif f.name in self.images:
                offsets, keys, values, nulls = self.images[f.name]
                out.append(
                    pa.MapArray.from_arrays(
                        pa.array(offsets, pa.int32()),
                        pa.array(keys, pa.string()),
                        pa.array(values, pa.string()),
                        type=_ARROW_TYPES[f.name],
                        mask=pa.array(nulls, pa.bool_()),
                    )
                )
            elif f.name == "after_partial":
                out.append(pa.array([bool(v) for v in self.values[f.name]], pa.bool_()))
            else:
                out.append(pa.array(self.values[f.name], _ARROW_TYPES.get(f.name, pa.string())))
        return out


def parse_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: raw batches -> the same columns plus the parsed-record columns."""
    names = [f.name for f in OUTPUT_FIELDS]
    for batch in batches:
        columns = _Columns()
        for value in batch.column("value").to_pylist():
            columns.add(parse_value(value))
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, *columns.arrays()], names=[*batch.schema.names, *names]
        )


def parse(raw: DataFrame, options: dict[str, str]) -> DataFrame:
    """Raw messages -> parsed records (``canonical.PARSED_SCHEMA``); never raises on bad input."""
    out = T.StructType(list(raw.schema.fields) + list(OUTPUT_FIELDS))
    return raw.mapInArrow(parse_batches, out)


# --- detection -----------------------------------------------------------------------------------

# Claims: the first bytes must be the Record's header: version, id and sourceTimestamp (Avro
# longs), sourcePosition, safeSourcePosition and sourceTxid (strings, each at most _MAX_STR bytes),
# source.sourceType (an enum index 0-12), source.version (a string), operation (0-16) and the
# objectName union branch (0 null, 1 string), all within the first _PREFIX bytes. JSON text
# (``keys`` not null, or text starting with ``{ [ "``) is never claimed.
#
# The header is matched by one regular expression over those bytes read as ISO-8859-1 (one
# character a byte): a plain Spark function, compiled code, no per-byte fold. A long is up to ten
# bytes; a string length, an enum index or the union branch is read in at most two bytes (zigzag:
# even values only, as a negative one is refused), and each string length is spelled out with
# its exact count of bytes, every length from 0 to _MAX_STR being one alternative.
_PREFIX = 256
_MAX_STR = 200


def _small(value: int) -> list[str]:
    """The byte sequences, as regex escapes, that encode ``value`` (>= 0) as an Avro int of at
    most two bytes: one byte below 64, and the two-byte form (continuation bit, then the rest)."""
    zigzag = 2 * value
    forms = [f"\\x{zigzag:02x}"] if zigzag < 0x80 else []
    return [*forms, f"\\x{0x80 | zigzag & 0x7F:02x}\\x{zigzag >> 7:02x}"]


def _one_of(alternatives: list[str]) -> str:
    return "(?:" + "|".join(alternatives) + ")"


_LONG = "[\\x80-\\xff]{0,9}[\\x00-\\x7f]"
_STRING = _one_of(
    [form + (f".{{{n}}}" if n else "") for n in range(_MAX_STR + 1) for form in _small(n)]
)
_HEADER = (
    "(?s)^"
    + _LONG * 3  # version, id, sourceTimestamp
    + _STRING * 3  # sourcePosition, safeSourcePosition, sourceTxid
    + _one_of([f for n in range(13) for f in _small(n)])  # source.sourceType
    + _STRING  # source.version
    + _one_of([f for n in range(17) for f in _small(n)])  # operation
    + _one_of([_one_of(_small(1)) + _STRING, *_small(0)])  # objectName: a string, or null
)


def header_ok(value: Column) -> Column:
    """True when ``value`` (binary) starts with a plausible DTS Avro Record header."""
    prefix = F.decode(F.substring(value.cast("binary"), 1, _PREFIX), "ISO-8859-1")
    return F.coalesce(prefix.rlike(_HEADER), F.lit(False))


def claims(keys: Column, value: Column, probe: Column) -> Column:
    """A binary value (not a JSON object nor JSON-looking text) with a DTS Avro Record header."""
    text = F.substring(value.cast("binary"), 1, 1)
    json_start = F.hex(text).isin("7B", "5B", "22")  # { [ "
    return keys.isNull() & ~F.coalesce(json_start, F.lit(False)) & header_ok(value)
