"""The quality core stays below the Dagster layer, and Great Expectations loads only to validate."""

import subprocess
import sys


def test_quality_core_imports_neither_dagster_nor_great_expectations():
    code = (
        "import sys, cdc_platform.quality.commands, cdc_platform.quality.redrive; "
        "sys.exit(('dagster' in sys.modules) + 2 * ('great_expectations' in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
