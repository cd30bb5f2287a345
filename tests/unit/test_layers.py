"""Layering: only the Dagster layer imports dagster, and Great Expectations loads only to validate.

Every module of the package is checked, so a new module cannot slip past: the walk finds it.
"""

import pkgutil
import subprocess
import sys

import cdc_platform

# The Dagster layer: the only modules that may import dagster.
DAGSTER_LAYER = ("cdc_platform.defs", "cdc_platform.definitions")

# Imports every module given on the command line, in order, and names the first one after whose
# import dagster is loaded (it, or something it imports, brought dagster in).
_IMPORT_ALL = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
    if "dagster" in sys.modules:
        sys.exit(f"{name} loads dagster")
"""


def _core_modules() -> list[str]:
    # walk_packages imports each package to look inside it: done here, not in the clean process.
    found = [m.name for m in pkgutil.walk_packages(cdc_platform.__path__, "cdc_platform.")]
    return [n for n in found if not any(n == p or n.startswith(p + ".") for p in DAGSTER_LAYER)]


def test_the_walk_sees_every_layer():
    modules = _core_modules()
    for expected in (
        "cdc_platform.__main__",
        "cdc_platform.freshness",
        "cdc_platform.formats.detect",
        "cdc_platform.spark.session",
        "cdc_platform.quality.validate",
        "cdc_platform.models.build",
    ):
        assert expected in modules
    assert not [m for m in modules if m.startswith("cdc_platform.defs")]


def test_no_module_outside_the_dagster_layer_imports_dagster():
    modules = _core_modules()
    run = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, *modules], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr


def test_quality_core_imports_neither_dagster_nor_great_expectations():
    code = (
        "import sys, cdc_platform.quality.commands, cdc_platform.steps.redrive; "
        "sys.exit(('dagster' in sys.modules) + 2 * ('great_expectations' in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
