"""Column types: what a column is (a Spark SQL type) and how its wire text becomes that type.

Every image value arrives as text (the JSON token, or the string itself). A ``ColumnSpec`` pairs the
target type with a decoder; ``decode`` turns both into one native Spark expression, so typing runs
inside the JVM with no Python per row. A value that does not decode becomes null and is reported
as a type mismatch by ``cdc_platform.normalize``.
"""

import re
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

DECODERS = (
    "cast",  # text -> type with try_cast
    "base64",  # base64 text -> binary
    "base64_utf8",  # base64 text -> UTF-8 string (HBase cells written with Bytes.toBytes(String))
    "base64_int",  # base64 big-endian two's complement -> integer (Bytes.toBytes(int/long))
    "epoch_days",  # days since 1970-01-01 -> date
    "epoch_millis",  # ms since epoch -> timestamp
    "epoch_micros",
    "epoch_nanos",
    "iso_timestamp",  # ISO-8601 text with zone -> timestamp
    # Kafka Connect Decimal: base64 big-endian unscaled value (the scale in the type), or a JSON
    # number with the JsonConverter's decimal.format=NUMERIC; the token's type tells which
    "decimal_bytes",
    "variable_scale_decimal",  # Debezium VariableScaleDecimal: {"scale": s, "value": base64}
    "base64_url",  # URL-safe base64 text -> binary (binary.handling.mode=base64-url-safe)
    "hex",  # hex text -> binary (binary.handling.mode=hex)
    # A time of day as a number since midnight -> "HH:MM:SS.ffffff" text (Spark and Delta have
    # no TIME type; the text sorts in time order and is the same whatever the wire's precision).
    "time_millis",
    "time_micros",
    "time_nanos",
)
# Decoders that need the value's JSON token as on the wire (``decode``'s ``token``), not only
# its text: digits-only text such as 1234 is a number, or valid base64 in a JSON string.
TOKEN_DECODERS = ("decimal_bytes",)
# Spark's own type for a decimal of unknown precision and scale (DecimalType.SYSTEM_DEFAULT).
VARIABLE_DECIMAL = "decimal(38,18)"


@dataclass(frozen=True)
class ColumnSpec:
    """A column's Spark SQL type and the decoder that produces it from wire text."""

    type: str
    decoder: str = "cast"


STRING = ColumnSpec("string")

_CONNECT_TYPES = {
    "int8": "tinyint",
    "int16": "smallint",
    "int32": "int",
    "int64": "bigint",
    "float32": "float",
    "float": "float",
    "float64": "double",
    "double": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "binary",
}
# Debezium and Kafka Connect logical types (the schema's `name`), keyed by name.
_LOGICAL = {
    "io.debezium.time.Date": ColumnSpec("date", "epoch_days"),
    "org.apache.kafka.connect.data.Date": ColumnSpec("date", "epoch_days"),
    "io.debezium.time.Timestamp": ColumnSpec("timestamp", "epoch_millis"),
    "org.apache.kafka.connect.data.Timestamp": ColumnSpec("timestamp", "epoch_millis"),
    "io.debezium.time.MicroTimestamp": ColumnSpec("timestamp", "epoch_micros"),
    "io.debezium.time.NanoTimestamp": ColumnSpec("timestamp", "epoch_nanos"),
    "io.debezium.time.ZonedTimestamp": ColumnSpec("timestamp", "iso_timestamp"),
    "io.debezium.time.IsoTimestamp": ColumnSpec("timestamp", "iso_timestamp"),
    "io.debezium.data.Bits": ColumnSpec("binary", "base64"),
    # Times of day, in every time.precision.mode: the same text.
    "io.debezium.time.Time": ColumnSpec("string", "time_millis"),
    "org.apache.kafka.connect.data.Time": ColumnSpec("string", "time_millis"),
    "io.debezium.time.MicroTime": ColumnSpec("string", "time_micros"),
    "io.debezium.time.NanoTime": ColumnSpec("string", "time_nanos"),
    # PostgreSQL NUMERIC without a precision: each value carries its own scale.
    "io.debezium.data.VariableScaleDecimal": ColumnSpec(VARIABLE_DECIMAL, "variable_scale_decimal"),
}


def connect_field_spec(field: dict[str, Any]) -> ColumnSpec:
    """Spec for one Kafka Connect schema field (``{"type", "name", "parameters", ...}``)."""
    name = field.get("name") or ""
    if name in _LOGICAL:
        return _LOGICAL[name]
    if name == "org.apache.kafka.connect.data.Decimal":
        params = field.get("parameters") or {}
        scale = int(params.get("scale", 0))
        precision = min(int(params.get("connect.decimal.precision", 38)), 38)
        return ColumnSpec(f"decimal({max(precision, scale)},{scale})", "decimal_bytes")
    if field.get("type") == "bytes":
        return ColumnSpec("binary", "base64")
    # struct, array, map and unknown types keep their JSON text.
    return ColumnSpec(_CONNECT_TYPES.get(field.get("type", ""), "string"))


_SQL_TYPE = re.compile(
    r"^(string|boolean|tinyint|smallint|int|bigint|float|double|date|timestamp|binary"
    r"|decimal\(\s*\d+\s*,\s*\d+\s*\))$"
)
_ALIASES = {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint",
            "bool": "boolean", "text": "string", "varchar": "string", "real": "float",
            "bytes": "binary"}  # fmt: skip
# What a configured ``<type> from <encoding>`` says the wire holds, for values a message does not
# type (a schemaless JsonConverter, Debezium's string binary modes): type -> encoding -> spec.
ENCODINGS: dict[str, dict[str, ColumnSpec]] = {
    "date": {"epoch_days": ColumnSpec("date", "epoch_days")},
    "timestamp": {
        "epoch_millis": ColumnSpec("timestamp", "epoch_millis"),
        "epoch_micros": ColumnSpec("timestamp", "epoch_micros"),
        "epoch_nanos": ColumnSpec("timestamp", "epoch_nanos"),
    },
    "time": {
        "millis": ColumnSpec("string", "time_millis"),
        "micros": ColumnSpec("string", "time_micros"),
        "nanos": ColumnSpec("string", "time_nanos"),
    },
    "binary": {
        "base64": ColumnSpec("binary", "base64"),
        "base64_url": ColumnSpec("binary", "base64_url"),
        "hex": ColumnSpec("binary", "hex"),
    },
    "decimal": {"base64": ColumnSpec("decimal", "decimal_bytes")},  # a Connect Decimal's bytes
}
_TYPES_HELP = (
    "use string, boolean, tinyint, smallint, int, bigint, float, double, decimal(p,s), date, "
    "timestamp or binary; or '<type> from <encoding>': "
    + "; ".join(
        f"{'decimal(p,s)' if t == 'decimal' else t} from {'|'.join(e)}"
        for t, e in ENCODINGS.items()
    )
)


def parse_type(text: str) -> str:
    """Normalise a user-written column type to a Spark SQL type name, or ``<type> from
    <encoding>`` (``ENCODINGS``); ValueError if unknown."""
    t, _, encoding = text.strip().lower().partition(" from ")
    t = _ALIASES.get(t.strip(), t.strip())
    if not _SQL_TYPE.match(t) and t != "time":
        raise ValueError(f"unknown column type {text!r} ({_TYPES_HELP})")
    t = re.sub(r"\s+", "", t)
    if not encoding:
        if t == "time":
            raise ValueError(f"column type {text!r}: say how the time arrives ({_TYPES_HELP})")
        return t
    base, encoding = t.split("(")[0], encoding.strip()
    if encoding not in ENCODINGS.get(base, {}):
        raise ValueError(f"unknown encoding in column type {text!r} ({_TYPES_HELP})")
    return f"{t} from {encoding}"


def configured_spec(text: str) -> tuple[ColumnSpec, bool]:
    """A ``parse_type`` result as a spec, and whether it names its encoding."""
    t, _, encoding = text.partition(" from ")
    if not encoding:
        return ColumnSpec(t), False
    spec = ENCODINGS[t.split("(")[0]][encoding]
    return ColumnSpec(t if spec.type == "decimal" else spec.type, spec.decoder), True


def hbase_spec(sql_type: str | None) -> ColumnSpec:
    """HBase cells are raw bytes: strings by default, integers big-endian, binary as is."""
    if sql_type in (None, "string"):
        return ColumnSpec("string", "base64_utf8")
    if sql_type == "binary":
        return ColumnSpec("binary", "base64")
    if sql_type in ("tinyint", "smallint", "int", "bigint"):
        return ColumnSpec(sql_type, "base64_int")
    raise ValueError(f"HBase columns can be string, binary or integers, not {sql_type}")


def _signed_big_endian(b: Column) -> Column:
    """Two's complement big-endian bytes -> decimal(38,0), with Spark higher-order functions;
    null when the value has more than 38 digits. A negative value is read from its complement
    (-(~b + 1)), so no step outgrows the value itself, and every step is a try_ (an overflow is
    null: a type mismatch, not a failed job, under ANSI mode)."""
    hexed = F.hex(b)
    n = F.octet_length(b)
    negative = F.conv(F.substring(hexed, 1, 2), 16, 10).cast("int") >= 128

    def digit(i: Column) -> Column:
        byte = F.conv(F.substring(hexed, i * 2 + 1, 2), 16, 10).cast("int")
        return F.when(negative, 255 - byte).otherwise(byte)

    magnitude = F.aggregate(
        F.sequence(F.lit(0), n - 1),
        F.lit(0).cast("decimal(38,0)"),
        lambda acc, i: F.try_add(F.try_multiply(acc, F.lit(256)), digit(i)).cast("decimal(38,0)"),
    )
    return (
        F.when(n == 0, F.lit(None))
        # x -1, not negate: Spark's unary minus rounds a 38-digit decimal to 34 digits first.
        .when(negative, F.try_multiply(F.try_add(magnitude, F.lit(1)), F.lit(-1)))
        .otherwise(magnitude)
    )


def might_be_number(wire: Column) -> Column:
    """True when wire text may have been a JSON number (the only values whose token matters)."""
    return wire.rlike(r"^-?[0-9][0-9.eE+-]*$")


def connect_tokens(value: Column, columns: list[str]) -> Column:
    """The JSON tokens of ``columns`` in a JsonConverter message's images, as variants:
    ``{before: {column: token}, after: ...}`` (a Connect Decimal's type comes from a JsonConverter
    schema, so its values sit under ``payload``). Only these columns are built; a variant keeps a
    number's every digit, where ``from_json``'s text of a number went through a double."""
    image = T.StructType([T.StructField(c, T.VariantType()) for c in columns])
    images = T.StructType([T.StructField("before", image), T.StructField("after", image)])
    schema = T.StructType([T.StructField("payload", images)])
    return F.from_json(value.cast("string"), schema).payload


def _shifted(unscaled: Column, scale: Column | int, sql_type: str) -> Column:
    """unscaled x 10^-scale as ``sql_type``, shifting the point in text: exact, where decimal
    division would round."""
    return F.concat(unscaled.cast("string"), F.lit("E-"), F.lit(scale).cast("string")).try_cast(
        sql_type
    )


def _variable_scale_decimal(wire: Column) -> Column:
    """``{"scale": s, "value": base64}`` -> VARIABLE_DECIMAL; null (a type mismatch) when the
    value has more fractional digits than the type keeps, rather than rounded."""
    struct = F.from_json(wire, "scale int, value string")
    unscaled = _signed_big_endian(F.try_to_binary(struct.value, F.lit("base64")))
    kept = int(VARIABLE_DECIMAL.split(",")[1].rstrip(")"))
    dropped = struct.scale - kept
    exact = (dropped <= 0) | unscaled.cast("string").endswith(F.repeat(F.lit("0"), dropped))
    return F.when(exact, _shifted(unscaled, struct.scale, VARIABLE_DECIMAL))


_TIME_UNITS = {"time_millis": 1000, "time_micros": 1, "time_nanos": 1}


def _time_of_day(micros: Column) -> Column:
    """Microseconds since midnight -> "HH:MM:SS.ffffff" (MySQL's TIME may pass 24 hours or be
    negative: "-838:59:59.000000")."""
    a = F.abs(micros)

    def part(unit: int, modulo: int | None = None) -> Column:
        whole = F.floor(a / F.lit(unit))
        return whole if modulo is None else whole % modulo

    sign = F.when(micros < 0, F.lit("-")).otherwise(F.lit(""))
    return F.when(micros.isNotNull(), F.format_string(
        "%s%02d:%02d:%02d.%06d", sign, part(3_600_000_000), part(60_000_000, 60),
        part(1_000_000, 60), a % 1_000_000,
    ))  # fmt: skip


def decode(wire: Column, spec: ColumnSpec, token: Column | None = None) -> Column:
    """Wire text -> typed value (null when it does not decode). ``token``: for
    ``TOKEN_DECODERS``, the value's JSON token as on the wire (null: not read)."""
    d = spec.decoder
    if d == "cast":
        if spec.type == "string":
            return wire
        return wire.try_cast(spec.type)
    if d == "base64":
        return F.try_to_binary(wire, F.lit("base64"))
    if d == "base64_utf8":
        return F.try_to_binary(wire, F.lit("base64")).cast("string")
    if d == "base64_int":
        return _signed_big_endian(F.try_to_binary(wire, F.lit("base64"))).try_cast(spec.type)
    if d == "epoch_days":
        return F.date_add(F.lit("1970-01-01").cast("date"), wire.try_cast("int"))
    if d == "epoch_millis":
        return F.timestamp_millis(wire.try_cast("bigint"))
    if d == "epoch_micros":
        return F.timestamp_micros(wire.try_cast("bigint"))
    if d == "epoch_nanos":
        return F.timestamp_micros(F.floor(wire.try_cast("bigint") / 1000))
    if d == "iso_timestamp":
        return F.try_to_timestamp(wire)
    if d == "decimal_bytes":
        scale = int(spec.type.split(",")[1].rstrip(")"))
        unscaled = _signed_big_endian(F.try_to_binary(wire, F.lit("base64")))
        from_bytes = _shifted(unscaled, scale, spec.type)
        if token is None:
            return from_bytes
        # decimal.format=NUMERIC: the number's own text is the value; a JSON string is base64.
        number = token.isNotNull() & ~token.startswith('"')
        return F.when(number, token.try_cast(spec.type)).otherwise(from_bytes)
    if d == "variable_scale_decimal":
        return _variable_scale_decimal(wire)
    if d == "base64_url":
        return F.try_to_binary(F.translate(wire, "-_", "+/"), F.lit("base64"))
    if d == "hex":
        return F.try_to_binary(wire, F.lit("hex"))
    if d in _TIME_UNITS:
        micros = wire.try_cast("bigint") * _TIME_UNITS[d]
        if d == "time_nanos":
            micros = F.floor(wire.try_cast("bigint") / 1000)
        return _time_of_day(micros)
    raise ValueError(f"unknown decoder {d!r}")


# Widening: a column may move up these chains (and to a decimal holding its digits) without
# rewriting any value; anything else is an incompatible type change.
_INT_DIGITS = {"tinyint": 3, "smallint": 5, "int": 10, "bigint": 20}
_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")
_WIDER = {
    "tinyint": ("smallint", "int", "bigint", "double"),
    "smallint": ("int", "bigint", "double"),
    "int": ("bigint", "double"),
    "float": ("double",),
    "date": ("timestamp",),
}


def _digits(sql_type: str) -> tuple[int, int] | None:
    """(integer digits, scale) of an integer or decimal type."""
    if sql_type in _INT_DIGITS:
        return _INT_DIGITS[sql_type], 0
    m = _DECIMAL.match(sql_type)
    return (int(m[1]) - int(m[2]), int(m[2])) if m else None


def common_type(old: str, new: str) -> str | None:
    """The type that holds every value of both types without loss (None: incompatible)."""
    if old == new:
        return old
    if new in _WIDER.get(old, ()):
        return new
    if old in _WIDER.get(new, ()):
        return old
    a, b = _digits(old), _digits(new)
    if a and b and (old.startswith("decimal") or new.startswith("decimal")):
        whole, scale = max(a[0], b[0]), max(a[1], b[1])
        return f"decimal({whole + scale},{scale})" if whole + scale <= 38 else None
    return None
