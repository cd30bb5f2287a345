"""Expectation suites as data: ``expectations/<layer>.json``, loaded and specialised per table.

A suite file is a Great Expectations 1.x suite (``name``, ``expectations``, ``meta``) with three
additions in ``meta``: ``rules`` (each rule's default severity and description: one Dagster check
per rule, so a failure names its rule), ``parameters`` (defaults of the suite parameters), and on
each expectation ``meta.rule`` (the rule it belongs to). ``"{key}"`` in an expectation's kwargs
stands for the table's key columns: ``column: "{key}"`` repeats the expectation per key column,
``"{key}"`` in a ``column_list`` is replaced by them. No Great Expectations import here: the
Dagster layer reads rules and severities when the code location loads.
"""

import copy
import json
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from cdc_platform.catalog import QualityConfig

CHANGELOG = "changelog"
CURRENT = "current"
CURRENT_ROWS = "current_rows"
RECONCILIATION = "reconciliation"
SUITES = (CHANGELOG, CURRENT, CURRENT_ROWS, RECONCILIATION)
ERROR = "ERROR"
WARN = "WARN"
KEY = "{key}"


def suites_dir() -> Path:
    """``CDC_EXPECTATIONS``, else ``expectations/`` at the root of the checkout."""
    return Path(
        os.environ.get("CDC_EXPECTATIONS") or Path(__file__).resolve().parents[2] / "expectations"
    )


@dataclass(frozen=True)
class Rule:
    name: str
    severity: str
    description: str


@dataclass(frozen=True)
class Suite:
    """One suite file: its rules, parameter defaults and expectation configurations."""

    name: str
    description: str
    rules: dict[str, Rule]
    parameters: dict[str, Any]
    expectations: list[dict[str, Any]] = field(hash=False)

    def specialise(self, key: list[str]) -> list[dict[str, Any]]:
        """The expectation configurations with ``{key}`` replaced by the key columns."""
        out = []
        for exp in self.expectations:
            kwargs = exp["kwargs"]
            if kwargs.get("column") == KEY:
                for k in key:
                    out.append({**copy.deepcopy(exp), "kwargs": {**kwargs, "column": k}})
                continue
            exp = copy.deepcopy(exp)
            if KEY in exp["kwargs"].get("column_list", []):
                i = exp["kwargs"]["column_list"].index(KEY)
                exp["kwargs"]["column_list"][i : i + 1] = key
            out.append(exp)
        return out


@cache
def load(layer: str, directory: Path | None = None) -> Suite:
    path = (directory or suites_dir()) / f"{layer}.json"
    data = json.loads(path.read_text())
    meta = data.get("meta", {})
    rules = {
        name: Rule(name, r["severity"], r.get("description", ""))
        for name, r in meta.get("rules", {}).items()
    }
    for exp in data["expectations"]:
        rule = exp.get("meta", {}).get("rule")
        if rule not in rules:
            raise ValueError(f"{path}: expectation {exp['type']} names no rule of meta.rules")
    for r in rules.values():
        if r.severity not in (ERROR, WARN):
            raise ValueError(f"{path}: rule {r.name}: severity must be ERROR or WARN")
    return Suite(
        data["name"], meta.get("description", ""), rules, meta.get("parameters", {}),
        data["expectations"],
    )  # fmt: skip


def severities(layer: str, quality: QualityConfig | None) -> dict[str, str]:
    """Each rule's severity: the suite's, overridden by ``quality.severity``."""
    suite = load(layer)
    overrides = (quality.severity if quality else None) or {}
    unknown = sorted(set(overrides) - set(_all_rules()))
    if unknown:
        raise ValueError(
            f"quality.severity: unknown rule {unknown[0]!r} (rules: {', '.join(_all_rules())})"
        )
    return {name: overrides.get(name, r.severity) for name, r in suite.rules.items()}


def _all_rules() -> list[str]:
    return [r for layer in SUITES for r in load(layer).rules]


def merged(*configs: QualityConfig | None) -> QualityConfig:
    """Later configs override earlier ones (source, then table), key by key."""
    out: dict[str, Any] = {}
    severity: dict[str, str] = {}
    for c in configs:
        if c is None:
            continue
        values = c.model_dump(exclude_unset=True)
        severity |= values.pop("severity", {})
        out |= values
    return QualityConfig(**out, severity=severity)
