"""JSON plumbing shared by the JSON wire formats: reading a message, overlaying row images, and
what ``claims`` reads: a message's top-level keys (``key_test``) and the nested fields every
format's claim names, parsed once and kept as what the claims test of them (``probe``,
``tested``, ``probed``).

A message is read in one of two ways, each added to the raw rows in one ``select``:

- ``read_exact`` (Canal, Maxwell, OGG): the message as a variant, which keeps every JSON number's
  exact text (``from_json`` rounds numbers through a double). ``field`` reads the variant;
  ``is_object`` is false for anything but a JSON object (invalid JSON, an array, a scalar;
  duplicate keys make a message invalid). A variant object holds its keys sorted, so these
  formats name where their images sit (``IMAGE_PATHS``) and the planner reads a new table's
  column order from its first message with ``wire_keys``, on the driver.
- ``read_struct`` (Debezium, DataWorks, SharePlex): ``from_json`` into the format's own schema in
  PERMISSIVE mode with a corrupt-record field, so ``corrupt`` tells a message that does not fit it.
"""

import json
from collections.abc import Callable, Iterable, Mapping
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

NOT_AN_OBJECT = "invalid JSON: not a JSON object"
VARIANT = "_v"  # read_exact's column
# The first bytes a JSON object's text can have (hex): JSON's whitespace, "{", a UTF-8 BOM.
_OBJECT_START = ("20", "09", "0A", "0D", "7B", "EF")
CORRUPT = "_corrupt"  # read_struct's corrupt-record field
# What a claim tests of a field it reads from a probe (a format's ``CLAIM_PATHS``), richest last.
PRESENT, FIRST, TEXT = "present", "first character", "text"
CLAIM_TESTS = (PRESENT, FIRST, TEXT)
_PERMISSIVE = {"columnNameOfCorruptRecord": CORRUPT, "mode": "PERMISSIVE"}


def text() -> Column:
    """The message value as text."""
    return F.col("value").cast("string")


def read_exact(raw: DataFrame) -> DataFrame:
    """``raw`` plus the message as a variant (``VARIANT``)."""
    return raw.select("*", F.try_parse_json(text()).alias(VARIANT))


def field(path: str, type_: str = "string") -> Column:
    """A value of ``read_exact``'s variant (null when absent or not of that type)."""
    return F.try_variant_get(F.col(VARIANT), path, type_)


def is_object() -> Column:
    """True when ``read_exact`` read a JSON object."""
    return field("$", "map<string,variant>").isNotNull()


def wire_keys(message: bytes | str | None, paths: tuple[tuple[str | int, ...], ...]) -> list[str]:
    """The keys of the JSON objects at ``paths`` of ``message`` (each path a sequence of object
    keys and array indexes), in the order the message writes them, each once; [] for a message
    that is not JSON. Python's JSON reader keeps that order, which a variant does not."""
    try:
        doc = json.loads(message or b"")
    except ValueError:
        return []
    keys: list[str] = []
    for path in paths:
        node = doc
        for step in path:
            is_index = isinstance(step, int)
            if is_index and isinstance(node, list) and -len(node) <= step < len(node):
                node = node[step]
            elif not is_index and isinstance(node, dict):
                node = node.get(step)
            else:
                node = None
        if isinstance(node, dict):
            keys += [k for k in node if k not in keys]
    return keys


def read_struct(schema: T.StructType) -> Column:
    """The message parsed into ``schema`` plus a ``CORRUPT`` field: the text when it is not a JSON
    object or a field does not fit its type (then every other field is null)."""
    with_corrupt = T.StructType([*schema.fields, T.StructField(CORRUPT, T.StringType())])
    return F.from_json(text(), with_corrupt, _PERMISSIVE)


def corrupt(top: Column) -> Column:
    """True when ``read_struct`` could not read the message (also for a null value)."""
    return top.isNull() | top[CORRUPT].isNotNull()


def unreadable_reason(corrupt: Column, wrong_shape: str) -> Column:
    """Why a message ``read_struct`` could not read is unusable (null if it was read): not a JSON
    object, or an object of the wrong shape (``wrong_shape``)."""
    # json_object_keys parses the text again, but only for the corrupt messages.
    return F.when(corrupt & F.json_object_keys(text()).isNull(), F.lit(NOT_AN_OBJECT)).when(
        corrupt, F.lit(wrong_shape)
    )


def object_keys() -> Column:
    """The message's top-level keys; null when it is not a JSON object (or null). A value whose
    first byte cannot start one (a DTS Avro record) is not handed to the JSON parser, whose
    failure costs an exception a message."""
    first = F.hex(F.substring(F.col("value").cast("binary"), 1, 1))
    return F.when(first.isin(*_OBJECT_START), F.json_object_keys(text()))


def key_test(keys: Column) -> Callable[[str], Column]:
    """For ``claims``: ``has(k)``, true when the message's top-level ``keys`` include ``k``, false
    otherwise, also when it is not a JSON object (``keys`` null), so ``probe`` never parses other
    bytes (such as a DTS Avro record)."""
    return lambda k: F.coalesce(F.array_contains(keys, k), F.lit(False))


def _tree(paths: Iterable[str]) -> dict:
    tree: dict = {}
    for path in paths:
        node = tree
        for name in path.removeprefix("$.").split("."):
            node = node.setdefault(name, {})
    return tree


def probe(keys: Column, paths: Iterable[str]) -> Column:
    """The fields at ``paths`` (``$.payload.op``) of a message, parsed out of it in one pass, as
    text (an object's or array's as its JSON; null when absent or JSON null), for ``claims``
    (``tested``, then ``probed``). Null for a message with none of their top-level keys
    (``keys``), which is then not parsed."""
    tree = _tree(paths)
    if not tree:
        return F.lit(None)

    def struct(node: dict) -> T.StructType:
        fields = [(n, struct(sub) if sub else T.StringType()) for n, sub in sorted(node.items())]
        return T.StructType([T.StructField(n, t) for n, t in fields])

    has = key_test(keys)
    return F.when(
        reduce(Column.__or__, [has(k) for k in sorted(tree)]), F.from_json(text(), struct(tree))
    )


def tested(probe: Column, paths: Mapping[str, str]) -> Column:
    """``probe`` (a column of it: each field is read several times) with each field kept as
    what a claim tests of it (its value in ``paths``): ``TEXT`` its text, ``FIRST`` its first
    character, ``PRESENT`` "" (null stays null). So messages differing only in what no claim
    tests (a sequence number, a DDL's text) give the same probe, and detection evaluates the
    claims once for them."""
    tree = _tree(paths)
    if not tree:
        return probe

    def kept(node: dict, value: Column, path: str) -> Column:
        if not node:
            test = paths[path]
            if test == PRESENT:
                return F.when(value.isNotNull(), F.lit(""))
            return F.substring(value, 1, 1) if test == FIRST else value
        fields = sorted(node.items())
        return F.struct(
            *[kept(sub, value.getField(n), f"{path}.{n}").alias(n) for n, sub in fields]
        )

    return F.when(probe.isNotNull(), kept(tree, probe, "$"))


def probed(probe: Column, path: str) -> Column:
    """The text at ``path`` (one of the paths the probe was made for) of a ``probe``."""
    for name in path.removeprefix("$.").split("."):
        probe = probe.getField(name)
    return probe


def overlay(base: Column, changes: Column) -> Column:
    """``base`` with the entries of ``changes`` replacing (or adding) values, in ``base``'s column
    order, new columns last; either image alone when the other is null. An entry of ``changes``
    wins even when its value is null (Canal's ``old``: the previous value was NULL)."""
    # map_zip_with keeps that order (base's keys, then the new ones) and passes null for a side
    # without the key, so only a null from changes needs the key check.
    merged = F.map_zip_with(
        base,
        changes,
        lambda k, b, c: F.when(
            c.isNotNull() | F.array_contains(F.map_keys(changes), k), c
        ).otherwise(b),
    )
    return F.when(changes.isNull(), base).when(base.isNull(), changes).otherwise(merged)
