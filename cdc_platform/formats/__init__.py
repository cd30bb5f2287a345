"""Wire formats. Each module turns raw messages into canonical parsed records with Spark functions.

A format module exposes:
- ``NAME`` and ``OPTIONS`` (option name -> allowed values, or None for any value);
- ``parse(raw, options) -> DataFrame``: the raw columns plus ``canonical.PARSED_SCHEMA``'s (one
  row per row change: a message holding several rows yields several records);
- ``column_specs(value_schema) -> dict[str, ColumnSpec]``: column types from the format's own
  schema text, read on the driver for the few distinct values of a batch;
- ``claims(keys, value) -> Column``: true when a message looks like this format (``keys``: the
  top-level JSON keys, null when the value is not a JSON object), for ``format: auto``.
"""

import importlib
from types import ModuleType

# name -> module; modules are imported on first use.
FORMATS: dict[str, str] = {
    "auto": "cdc_platform.formats.detect",  # recognise each message by its structure
    "debezium": "cdc_platform.formats.debezium",
    # Lindorm change subscription is Debezium Format V2.0: the same parser, under its own name.
    "lindorm": "cdc_platform.formats.debezium",
    "dataworks": "cdc_platform.formats.dataworks",  # DataWorks Kafka JSON and DataHub Blob
    "datahub-tuple": "cdc_platform.formats.datahub_tuple",
    "dts-avro": "cdc_platform.formats.dts_avro",
    "shareplex": "cdc_platform.formats.shareplex",
    "canal": "cdc_platform.formats.canal",
    "maxwell": "cdc_platform.formats.maxwell",
    "ogg": "cdc_platform.formats.ogg",
}


def format_names() -> list[str]:
    return sorted(FORMATS)


def parser_for(name: str) -> ModuleType:
    """The format module for ``name``; ValueError naming the known formats otherwise."""
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r} (known: {', '.join(format_names())})")
    return importlib.import_module(FORMATS[name])


def validate_options(name: str, options: dict[str, str]) -> None:
    """ValueError naming the first option the format does not know or a value it does not take."""
    allowed = parser_for(name).OPTIONS
    for key, value in options.items():
        if key not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise ValueError(f"unknown format option {key!r} for {name} (known: {known})")
        if allowed[key] is not None and str(value) not in allowed[key]:
            raise ValueError(
                f"format option {key}={value!r} must be one of {', '.join(allowed[key])}"
            )
