"""The source catalog: ``sources.yaml`` validated with pydantic; the only list factories loop over.

Relative paths in the file are relative to the file itself. Environment variables override the
storage and Spark settings (``CDC_WAREHOUSE``, ``CDC_LANDING``, ``CDC_SPARK_MASTER``), so the same
file serves the demo, the tests and a deployment.
"""

import os
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cdc_platform import formats
from cdc_platform.formats.column_specs import parse_type

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_name(v: str) -> str:
    if not _NAME.match(v):
        raise ValueError("must be letters, digits and underscores, not starting with a digit")
    return v


class CatalogError(Exception):
    """A sources file that cannot be used; the message is one line naming the problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TableConfig(_Strict):
    """One source table: how to find its messages, its key and column types."""

    name: str
    source_table: str | None = Field(
        None, description="qualified name in the messages (db[.schema].table); default: name"
    )
    primary_key: list[str] | None = None
    column_types: dict[str, str] = Field(default_factory=dict)
    column_list: list[str] | None = Field(None, description="keep only these columns (+ key)")
    except_column_list: list[str] | None = Field(None, description="drop these columns")
    ignore_null_updates: bool = Field(
        False, description="a null in an update keeps the column's previous value"
    )
    tombstone_retention_days: float | None = Field(
        None, gt=0, description="purge tombstones of deleted keys after this; default: keep"
    )
    history: bool = Field(False, description="keep an SCD type 2 history/<source>/<table>")
    track_history_column_list: list[str] | None = None
    track_history_except_column_list: list[str] | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        return _check_name(v)

    @field_validator("column_types")
    @classmethod
    def _valid_types(cls, v: dict[str, str]) -> dict[str, str]:
        return {col: parse_type(t) for col, t in v.items()}

    @field_validator("primary_key", mode="before")
    @classmethod
    def _split_key(cls, v: object) -> object:
        return [c.strip() for c in v.split(",")] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _consistent_lists(self) -> "TableConfig":
        if self.column_list is not None and self.except_column_list is not None:
            raise ValueError("set column_list or except_column_list, not both")
        tracked = (self.track_history_column_list, self.track_history_except_column_list)
        if all(t is not None for t in tracked):
            raise ValueError(
                "set track_history_column_list or track_history_except_column_list, not both"
            )
        if any(t is not None for t in tracked) and not self.history:
            raise ValueError("track_history_* needs history: true")
        return self

    @property
    def match(self) -> str:
        return self.source_table or self.name

    def keeps(self, column: str, key: list[str]) -> bool:
        """Whether ``column`` is selected by column_list / except_column_list (keys always are)."""
        if column in key:
            return True
        if self.column_list is not None:
            return column in self.column_list
        return column not in (self.except_column_list or [])

    def tracked_columns(self, columns: list[str]) -> list[str]:
        """The columns whose changes open a new history version (all, unless configured)."""
        if self.track_history_column_list is not None:
            return [c for c in columns if c in self.track_history_column_list]
        return [c for c in columns if c not in (self.track_history_except_column_list or [])]


class SourceConfig(_Strict):
    """One topic (or landing folder) and the tables it carries."""

    name: str
    transport: Literal["files"] = "files"
    location: str | None = Field(None, description="landing folder; default <landing>/<name>")
    format: str = "auto"
    format_options: dict[str, str] = Field(default_factory=dict)
    tables: list[TableConfig] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        return _check_name(v)

    @field_validator("format_options", mode="before")
    @classmethod
    def _stringify(cls, v: object) -> object:
        if isinstance(v, dict):
            return {k: str(x).lower() if isinstance(x, bool) else str(x) for k, x in v.items()}
        return v

    def table_config(self, name: str) -> TableConfig:
        """The declared table of that name, else defaults (a routed table)."""
        return next((t for t in self.tables if t.name == name), TableConfig(name=name))

    @model_validator(mode="after")
    def _known_format(self) -> "SourceConfig":
        formats.parser_for(self.format)
        formats.validate_options(self.format, self.format_options)
        names = [t.name for t in self.tables]
        if len(names) != len(set(names)):
            raise ValueError(f"table names repeat in source {self.name}")
        return self


class SparkConfig(_Strict):
    master: str = "local[*]"
    remote: str | None = Field(None, description="Spark Connect URL; overrides master")
    conf: dict[str, str] = Field(default_factory=dict)


class Catalog(_Strict):
    """The whole sources file."""

    warehouse: str = "var/warehouse"
    landing: str = "var/landing"
    spark: SparkConfig = Field(default_factory=SparkConfig)
    sources: list[SourceConfig]
    base_dir: Path = Field(Path("."), exclude=True)

    @model_validator(mode="after")
    def _unique_sources(self) -> "Catalog":
        names = [s.name for s in self.sources]
        if len(names) != len(set(names)):
            raise ValueError("source names repeat")
        return self

    def _resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self.base_dir / p).resolve()

    @property
    def warehouse_path(self) -> Path:
        return self._resolve(os.environ.get("CDC_WAREHOUSE") or self.warehouse)

    @property
    def landing_path(self) -> Path:
        return self._resolve(os.environ.get("CDC_LANDING") or self.landing)

    def landing_for(self, source: SourceConfig) -> Path:
        return (
            self._resolve(source.location) if source.location else self.landing_path / source.name
        )

    def spark_settings(self) -> SparkConfig:
        master = os.environ.get("CDC_SPARK_MASTER")
        remote = os.environ.get("CDC_SPARK_REMOTE")
        if not (master or remote):
            return self.spark
        return self.spark.model_copy(
            update={"master": master or self.spark.master, "remote": remote or self.spark.remote}
        )

    def source(self, name: str) -> SourceConfig:
        for s in self.sources:
            if s.name == name:
                return s
        raise CatalogError(f"no source named {name!r} in the catalog")


def _where(error: dict) -> str:
    return ".".join(str(p) for p in error["loc"]) or "(top level)"


def load_catalog(path: str | os.PathLike) -> Catalog:
    """Read and validate a sources file; CatalogError with one line naming the bad key."""
    p = Path(path)
    if not p.is_file():
        raise CatalogError(f"sources file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise CatalogError(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{p}: expected a mapping with a 'sources' list")
    try:
        return Catalog(**data, base_dir=p.resolve().parent)
    except ValidationError as e:
        err = e.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        raise CatalogError(f"{p}: {_where(err)}: {msg}") from None
    except TypeError as e:
        raise CatalogError(f"{p}: {e}") from None


def default_catalog_path() -> Path:
    """``CDC_SOURCES``, else ``sources.yaml`` in the working directory."""
    return Path(os.environ.get("CDC_SOURCES", "sources.yaml"))
