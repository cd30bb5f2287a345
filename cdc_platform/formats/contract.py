"""The format module contract. A module satisfies it by its top-level names (no base class);
``tests/unit/test_format_contract.py`` checks every registered module against it.

``Parser`` is what every name in ``formats.FORMATS`` resolves to (``formats.parser_for``),
``auto`` included. ``Format`` is a wire format: a ``Parser`` that also types columns from its own
schema text and recognises its messages. ``format: auto`` (``detect``) calls ``claims`` of every
other registered module, so a module without it breaks ``auto``. ``detect`` itself is only a
``Parser``: it has no schema text of its own (each record it parses names its real format in
``source_format``, whose ``column_specs`` types it) and claims nothing (it asks the others).
"""

from typing import Protocol, runtime_checkable

from pyspark.sql import Column, DataFrame

from cdc_platform.formats.column_specs import ColumnSpec

# Option name -> the values it takes (None: any value).
Options = dict[str, tuple[str, ...] | None]


@runtime_checkable
class Parser(Protocol):
    NAME: str  # the format's name in FORMATS and in its records' ``source_format``
    OPTIONS: Options

    def parse(self, raw: DataFrame, options: dict[str, str]) -> DataFrame:
        """The raw columns plus ``canonical.PARSED_SCHEMA``'s: one record per row change (a
        message holding several rows yields several), control, DDL and error records marked by
        ``kind`` and ``reason``. ``options`` are the source's options this format knows."""
        ...


@runtime_checkable
class Format(Parser, Protocol):
    # Where a message holds its row images (paths of object keys and array indexes), for formats
    # whose parsed images do not keep the wire column order (read from a variant, which sorts its
    # keys): the planner orders a new table's columns as its first message writes them
    # (``json_records.wire_keys``). (): the parsed images keep that order themselves.
    IMAGE_PATHS: tuple[tuple[str | int, ...], ...]
    # JSON paths (``$.after``) of the row images in a message whose values keep their JSON
    # token types, newest image first, for ``infer_types`` on messages without a schema.
    # (): the format writes values as text (Canal) or has no JSON images.
    TOKEN_PATHS: tuple[str, ...]
    # JSON paths (``$.payload.op``) of the nested fields ``claims`` reads from ``probe``, each with
    # what it tests of the field (``json_records.PRESENT``, ``FIRST`` or ``TEXT``), which is all
    # the probe keeps of it: detection parses every format's out of a message in one pass. {}:
    # the claim reads top-level keys only.
    CLAIM_PATHS: dict[str, str]

    def column_specs(self, value_schema: str) -> dict[str, ColumnSpec]:
        """Column types from the format's own schema text (a record's ``value_schema``), read on
        the driver for the few distinct values of a batch; {} when the format has none."""
        ...

    def claims(self, keys: Column, value: Column, probe: Column) -> Column:
        """True when a message looks like this format, and false for every other registered
        format's messages (two claimants quarantine it as ambiguous). ``keys``: the message's
        top-level JSON keys, null when it is not a JSON object; ``value``: its text; ``probe``:
        the fields at every format's ``CLAIM_PATHS`` (``json_records.probe``), read with
        ``json_records.probed``. A JSON object is claimed by its keys and probe alone: detection
        evaluates the claims once for each distinct pair of a batch, with ``value`` null."""
        ...
