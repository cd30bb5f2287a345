"""Wire formats. Each module turns raw messages into canonical parsed records with Spark functions.

``FORMATS`` maps each format name to its module, which satisfies ``contract.Format``: ``NAME``,
``OPTIONS``, ``parse(raw, options)``, ``column_specs(value_schema)``, ``claims(keys, value,
probe)`` and the paths ``claims`` reads.
The exception is ``auto`` (``detect``), which recognises each message's format and hands it to
that module: only a ``contract.Parser``. ``parser_for(name)`` looks up any format name,
``format_for(name)`` a wire format.
"""

import importlib
from typing import cast

from cdc_platform.formats.contract import Format, Parser

AUTO_MODULE = "cdc_platform.formats.detect"  # recognise each message by its structure
# name -> module; modules are imported on first use.
FORMATS: dict[str, str] = {
    "auto": AUTO_MODULE,
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


def parser_for(name: str) -> Parser:
    """The format module for ``name`` (``auto`` too); ValueError naming the known formats
    otherwise."""
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r} (known: {', '.join(format_names())})")
    return cast(Parser, importlib.import_module(FORMATS[name]))


def format_for(name: str) -> Format:
    """The wire format module for ``name``: as ``parser_for``, but not ``auto``, which is no
    format of its own (ValueError)."""
    if FORMATS.get(name) == AUTO_MODULE:
        raise ValueError(f"{name!r} recognises formats, it is not one")
    return cast(Format, parser_for(name))


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
