"""Load a dbt_like_models folder: model files, their refs, sources and config, and YAML docs.

References are read from the Jinja syntax tree, not by rendering: every ``ref``/``source`` call
in a file is a dependency (whatever branch it sits in), its line is known, and a reference to a
name that does not exist is an error before anything runs. Their arguments must be literals.
"""

import dataclasses
import difflib
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml
from jinja2 import nodes

from cdc_platform import lake
from cdc_platform.catalog import Catalog

MATERIALIZATIONS = ("view", "table", "incremental")
# The layers ``source()`` can read: current tables (live rows) and change logs (every record).
SOURCE_LAYERS = (lake.CURRENT, lake.CHANGELOG)
TEST_KINDS = ("unique", "not_null", "accepted_values", "relationships")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONFIG_KEYS = {"materialized", "unique_key", "partition_by"}


class ModelError(Exception):
    """A model that cannot be used; the message is one line, ``file:line: problem``."""


def _fail(path: Path, line: int | None, message: str) -> ModelError:
    where = f"{display_path(path)}:{line}" if line else display_path(path)
    return ModelError(f"{where}: {message}")


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Relation:
    """Something a model reads: another model, or a lake table (``layer/source/table``)."""

    layer: str
    source: str | None
    table: str

    @property
    def is_model(self) -> bool:
        return self.layer == lake.MODELS

    @property
    def key_path(self) -> list[str]:
        """The asset key path, which is also the Delta path under the warehouse."""
        if self.is_model:
            return [lake.MODELS, self.table]
        return lake.TableRef(self.layer, self.source or "", self.table).key_path

    def view(self, changed_only: bool = False) -> str:
        """The Spark temp view compiled SQL reads it from; ``changed_only``: the rows changed
        since the last build of an incremental model."""
        return "__".join(self.key_path) + ("__changed" if changed_only else "")

    def name(self, changed_only: bool = False) -> str:
        """The view's name quoted for SQL."""
        return f"`{self.view(changed_only)}`"

    def __str__(self) -> str:
        return "/".join(self.key_path)


@dataclass(frozen=True)
class Reference:
    """One ``ref``/``source`` call of a model file."""

    relation: Relation
    line: int
    all_rows: bool  # an incremental build reads all rows, not only the changed ones


@dataclass(frozen=True)
class ModelTest:
    """One test of a model's YAML; it runs as a Dagster asset check named ``name``."""

    name: str
    column: str
    kind: str
    values: tuple = ()  # accepted_values
    to: Relation | None = None  # relationships
    field: str | None = None  # relationships
    severity: str = "error"


@dataclass
class Model:
    name: str
    path: Path
    template: str
    materialized: str = "view"
    unique_key: list[str] = field(default_factory=list)
    partition_by: list[str] = field(default_factory=list)
    refs: list[Reference] = field(default_factory=list)
    description: str | None = None
    columns: dict[str, str] = field(default_factory=dict)
    tests: list[ModelTest] = field(default_factory=list)

    @property
    def relation(self) -> Relation:
        return Relation(lake.MODELS, None, self.name)

    @property
    def inputs(self) -> list[Relation]:
        """What the model reads, in order of first use, without repeats."""
        return list(dict.fromkeys(r.relation for r in self.refs))

    @property
    def code_version(self) -> str:
        return hashlib.sha256(self.template.encode()).hexdigest()[:12]


@dataclass
class Project:
    root: Path
    models: dict[str, Model]
    tables: frozenset[tuple[str, str, str]]  # (layer, source, table) a source() may name


def environment() -> jinja2.Environment:
    # Undefined names fail loudly; no autoescape (this is SQL, not HTML).
    return jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def default_models_dir(base_dir: Path) -> Path:
    """``CDC_MODELS``, else ``dbt_like_models`` beside the sources file."""
    return Path(os.environ.get("CDC_MODELS") or base_dir / "dbt_like_models")


def load_project(root: Path, tables: set[tuple[str, str, str]]) -> Project:
    """Every ``*.sql`` under ``root`` (model name = file stem) with its YAML, refs resolved.

    ``tables``: the lake tables ``(layer, source, table)`` that exist or are declared."""
    files = sorted(root.rglob("*.sql")) if root.is_dir() else []
    models: dict[str, Model] = {}
    for path in files:
        if not _NAME.match(path.stem):
            raise _fail(path, None, "a model file name must be letters, digits and underscores")
        if path.stem in models:
            raise _fail(
                path, None, f"model {path.stem!r} is also {display_path(models[path.stem].path)}"
            )
        models[path.stem] = Model(path.stem, path, path.read_text())
    project = Project(root, models, frozenset(tables))
    env = environment()
    for model in models.values():
        _read_calls(env, project, model)
        _read_yaml(env, project, model)
    return project


def _literal(path: Path, node: nodes.Node, what: str) -> Any:
    try:
        return node.as_const()
    except nodes.Impossible:
        raise _fail(path, node.lineno, f"{what} must be literals") from None


def _read_calls(env: jinja2.Environment, project: Project, model: Model) -> None:
    try:
        tree = env.parse(model.template)
    except jinja2.TemplateSyntaxError as e:
        raise _fail(model.path, e.lineno, f"template syntax: {e.message}") from None
    configs = 0
    for call in tree.find_all(nodes.Call):
        callee = call.node.name if isinstance(call.node, nodes.Name) else None
        if callee in ("ref", "source"):
            model.refs.append(_reference(project, model.path, call, callee))
        elif callee == "config":
            configs += 1
            if configs > 1:
                raise _fail(model.path, call.lineno, "config() is given twice")
            _config(model, call)


def _call_args(path: Path, call: nodes.Call, callee: str) -> tuple[list[Any], dict[str, Any]]:
    args = [_literal(path, a, f"{callee}() arguments") for a in call.args]
    kwargs = {k.key: _literal(path, k.value, f"{callee}() arguments") for k in call.kwargs}
    if call.dyn_args or call.dyn_kwargs:
        raise _fail(path, call.lineno, f"{callee}() arguments must be literals")
    return args, kwargs


def _reference(project: Project, path: Path, call: nodes.Call, callee: str) -> Reference:
    args, kwargs = _call_args(path, call, callee)
    line = call.lineno
    all_rows = bool(kwargs.pop("all_rows", False))
    if callee == "ref":
        if len(args) != 1 or kwargs or not isinstance(args[0], str):
            raise _fail(path, line, "use ref('name') (a model, or a current table)")
        return Reference(resolve_ref(project, path, line, args[0]), line, all_rows)
    layer = kwargs.pop("layer", lake.CURRENT)
    if len(args) != 2 or kwargs or not all(isinstance(a, str) for a in args):
        raise _fail(path, line, "use source('<source>', '<table>'[, layer='changelog'])")
    if layer not in SOURCE_LAYERS:
        raise _fail(path, line, f"source() layer must be one of {', '.join(SOURCE_LAYERS)}")
    if (layer, args[0], args[1]) not in project.tables:
        known = sorted(f"{s}.{t}" for ly, s, t in project.tables if ly == layer)
        hint = difflib.get_close_matches(f"{args[0]}.{args[1]}", known, 1)
        raise _fail(
            path,
            line,
            f"unknown source {args[0]}.{args[1]} ({layer})"
            + (f"; did you mean {hint[0]}?" if hint else f"; known: {', '.join(known)}"),
        )
    return Reference(Relation(layer, args[0], args[1]), line, all_rows)


def resolve_ref(project: Project, path: Path, line: int, name: str) -> Relation:
    """A model of that name, else the current table of that name (in any one source)."""
    if name in project.models:
        return project.models[name].relation
    found = sorted((s, t) for layer, s, t in project.tables if layer == lake.CURRENT and t == name)
    if len(found) == 1:
        return Relation(lake.CURRENT, *found[0])
    if len(found) > 1:
        options = " or ".join(f"source('{s}', '{t}')" for s, t in found)
        raise _fail(path, line, f"ref('{name}') is ambiguous: use {options}")
    known = sorted({*project.models, *(t for ly, _, t in project.tables if ly == lake.CURRENT)})
    hint = difflib.get_close_matches(name, known, 1)
    raise _fail(
        path,
        line,
        f"unknown ref '{name}': no model or current table of that name"
        + (f"; did you mean '{hint[0]}'?" if hint else ""),
    )


def _names(value: Any, path: Path, line: int, what: str) -> list[str]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise _fail(path, line, f"{what} must be a column name or a list of them")
    return list(names)


def _config(model: Model, call: nodes.Call) -> None:
    args, kwargs = _call_args(model.path, call, "config")
    line = call.lineno
    unknown = sorted(set(kwargs) - _CONFIG_KEYS)
    if args or unknown:
        raise _fail(
            model.path, line, f"config() takes {', '.join(sorted(_CONFIG_KEYS))} by keyword"
        )
    model.materialized = kwargs.get("materialized", "view")
    if model.materialized not in MATERIALIZATIONS:
        raise _fail(model.path, line, f"materialized must be one of {', '.join(MATERIALIZATIONS)}")
    if "unique_key" in kwargs:
        model.unique_key = _names(kwargs["unique_key"], model.path, line, "unique_key")
    if "partition_by" in kwargs:
        model.partition_by = _names(kwargs["partition_by"], model.path, line, "partition_by")
    if model.materialized == "incremental" and not model.unique_key:
        raise _fail(model.path, line, "an incremental model needs unique_key")
    if model.materialized == "view" and model.partition_by:
        raise _fail(model.path, line, "a view has no partitions (partition_by)")


def _yaml_path(model: Model) -> Path | None:
    for suffix in (".yml", ".yaml"):
        if (p := model.path.with_suffix(suffix)).is_file():
            return p
    return None


def _read_yaml(env: jinja2.Environment, project: Project, model: Model) -> None:
    path = _yaml_path(model)
    if path is None:
        return
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        line = e.problem_mark.line + 1 if getattr(e, "problem_mark", None) else None
        raise _fail(path, line, f"not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(doc, dict) or set(doc) - {"description", "columns"}:
        raise _fail(path, None, "expected a mapping with description and columns")
    model.description = doc.get("description")
    taken: set[str] = set()
    for col in doc.get("columns") or []:
        if not isinstance(col, dict) or not isinstance(col.get("name"), str):
            raise _fail(path, None, "each column needs a name")
        name = col["name"]
        if col.get("description"):
            model.columns[name] = str(col["description"])
        for spec in col.get("tests") or col.get("data_tests") or []:
            test = _test(env, project, path, name, spec)
            check = re.sub(r"[^A-Za-z0-9_]", "_", f"{name}__{test.kind}")
            n = 2
            while check in taken:  # two tests of one kind on one column
                check, n = f"{re.sub(r'_[0-9]+$', '', check)}_{n}", n + 1
            taken.add(check)
            model.tests.append(dataclasses.replace(test, name=check))


def _test(env: jinja2.Environment, project: Project, path: Path, column: str, spec: Any):
    kind, args = (spec, {}) if isinstance(spec, str) else next(iter(spec.items()), (None, None))
    if kind not in TEST_KINDS or (isinstance(spec, dict) and len(spec) != 1):
        raise _fail(
            path, None, f"column {column}: unknown test {spec!r} (use {', '.join(TEST_KINDS)})"
        )
    args = dict(args or {})
    severity = str(args.pop("severity", "error")).lower()
    if severity not in ("error", "warn"):
        raise _fail(path, None, f"column {column}: severity must be error or warn")
    test = ModelTest("", column, kind, severity=severity)
    if kind == "accepted_values":
        values = args.pop("values", None)
        if not isinstance(values, list) or not values:
            raise _fail(path, None, f"column {column}: accepted_values needs values: [...]")
        test = ModelTest("", column, kind, values=tuple(values), severity=severity)
    elif kind == "relationships":
        to, to_field = args.pop("to", None), args.pop("field", None)
        if not isinstance(to, str) or not isinstance(to_field, str):
            raise _fail(
                path, None, f"column {column}: relationships needs to: ref('...') and field"
            )
        try:
            calls = list(env.parse("{{ " + to + " }}").find_all(nodes.Call))
        except jinja2.TemplateSyntaxError:
            calls = []
        names = [c.node.name for c in calls if isinstance(c.node, nodes.Name)]
        if len(calls) != 1 or names[0] not in ("ref", "source"):
            raise _fail(path, None, f"column {column}: relationships to must be ref() or source()")
        relation = _reference(project, path, calls[0], names[0]).relation
        test = ModelTest("", column, kind, to=relation, field=to_field, severity=severity)
    if args:
        raise _fail(path, None, f"column {column}: {kind} does not take {', '.join(args)}")
    return test


def catalog_tables(catalog: Catalog, warehouse: str | None = None) -> set[tuple[str, str, str]]:
    """The lake tables of a catalog that ``ref``/``source`` may name: every declared table, and
    those routed into the warehouse without a declaration, as current and change-log tables."""
    found = set()
    for source in catalog.sources:
        routed = lake.changelog_tables(warehouse or catalog.warehouse_uri, source.name)
        for table in source.with_found(routed):
            found |= {(layer, source.name, table.name) for layer in SOURCE_LAYERS}
    return found
