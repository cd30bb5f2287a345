"""The reference of ``sources.yaml``, generated from the catalog's pydantic models and their
field descriptions, so it cannot go stale: ``make docs`` writes it to
docs/configuration-reference.md, and a test fails when that file differs from what this
prints."""

import datetime as dt
import sys
import types
import typing

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from cdc_platform.catalog import (
    Catalog,
    ContinuousConfig,
    KafkaConfig,
    MaintenanceConfig,
    ModelsConfig,
    QualityConfig,
    SchemaRegistryConfig,
    SourceConfig,
    SparkConfig,
    TableConfig,
)

# Each block of the file, in the order it is nested, with where it sits.
BLOCKS: list[tuple[type[BaseModel], str]] = [
    (Catalog, "the file"),
    (SparkConfig, "`spark`"),
    (ModelsConfig, "`models`"),
    (MaintenanceConfig, "`maintenance`"),
    (SourceConfig, "`sources[]`"),
    (KafkaConfig, "`sources[].kafka`"),
    (SchemaRegistryConfig, "`sources[].schema_registry`"),
    (ContinuousConfig, "`sources[].continuous`"),
    (TableConfig, "`sources[].tables[]`"),
    (QualityConfig, "`sources[].quality`, `sources[].tables[].quality`"),
]
_ANCHORS = {model: model.__name__.lower() for model, _ in BLOCKS}
_SCALARS = {str: "text", int: "integer", float: "number", bool: "true/false",
            dt.date: "date", dt.datetime: "timestamp"}  # fmt: skip


def type_name(annotation: object) -> str:
    """A field's type as a reader of the YAML file would say it."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args if a is not type(None))
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"map of {type_name(args[0])} to {type_name(args[1])}"
    if annotation in _ANCHORS:
        return f"[{annotation.__name__}](#{_ANCHORS[annotation]})"
    return _SCALARS.get(annotation, getattr(annotation, "__name__", str(annotation)))


def default_text(field: typing.Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        return "" if isinstance(value, BaseModel) else f"`{value}`"
    if field.default is PydanticUndefined:
        return "required"
    return "" if field.default is None else f"`{field.default}`"


def _escaped(text: str) -> str:
    """Text for a Markdown table cell: ``<source>`` is not an HTML tag, ``|`` not a column."""
    return text.replace("|", "\\|").replace("<", "\\<")


def render() -> str:
    lines = [
        "# `sources.yaml` reference",
        "",
        "Generated from the pydantic models in `cdc_platform/catalog.py` by `make docs`; edit",
        "the field descriptions there, not this file. The guide is [configuration.md]"
        "(configuration.md).",
    ]
    for model, where in BLOCKS:
        doc = " ".join((model.__doc__ or "").split("\n\n")[0].split()).replace("``", "`")
        lines += ["", f"## {model.__name__}", "", f"{where}: {doc}", ""]
        lines += ["| key | type | default | what it is |", "| --- | --- | --- | --- |"]
        for name, field in model.model_fields.items():
            if field.exclude:
                continue
            row = [f"`{name}`", type_name(field.annotation), default_text(field),
                   _escaped(field.description or "")]  # fmt: skip
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
