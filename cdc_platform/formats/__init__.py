"""Wire formats. Each module turns raw messages into canonical parsed records with Spark functions.

A format module exposes ``NAME``, ``OPTIONS`` (option name -> allowed values), ``parse(raw,
options) -> DataFrame`` (``canonical.PARSED_SCHEMA`` columns added to the raw columns) and
``column_specs(value_schema) -> dict[str, ColumnSpec]`` (types from the format's own schema text).
"""

from types import ModuleType

from cdc_platform.formats import debezium

# "lindorm" is Debezium Format V2.0: the same parser, named for users who look for it.
FORMATS: dict[str, ModuleType] = {"debezium": debezium, "lindorm": debezium}


def format_names() -> list[str]:
    return sorted(FORMATS)


def parser_for(name: str) -> ModuleType:
    """The format module for ``name``; ValueError naming the known formats otherwise."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r} (known: {', '.join(format_names())})") from None


def validate_options(name: str, options: dict[str, str]) -> None:
    """ValueError naming the first option the format does not know or a value it does not take."""
    allowed = parser_for(name).OPTIONS
    for key, value in options.items():
        if key not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise ValueError(f"unknown format option {key!r} for {name} (known: {known})")
        if str(value) not in allowed[key]:
            raise ValueError(
                f"format option {key}={value!r} must be one of {', '.join(allowed[key])}"
            )
