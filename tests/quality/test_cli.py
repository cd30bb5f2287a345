"""``cdc-platform quality-report`` and ``cdc-platform redrive`` on the command line."""

import json

import pytest

from cdc_platform import lake
from cdc_platform.cli import main
from tests.quality.builders import change, write, write_changelog
from tests.quality.builders import coordinates as coords
from tests.quality.test_suites import CLEAN

pytestmark = pytest.mark.spark


def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert main(["quality-report", "--warehouse", str(missing), "--out", str(tmp_path)]) == 2
    assert main(["redrive", "--warehouse", str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"cdc-platform: error: warehouse not found: {missing}"] * 2
    (tmp_path / "empty").mkdir()
    assert main(["quality-report", "--warehouse", str(tmp_path / "empty"), "--out", "x"]) == 2
    assert "nothing to validate" in capsys.readouterr().err


def test_quality_report_builds_the_site_and_fails_on_error_rules(spark, tmp_path, capsys):
    warehouse, out = tmp_path / "warehouse", tmp_path / "reports"
    write_changelog(spark, warehouse, "s", "t", CLEAN)
    write(spark, warehouse, lake.RAW, "s", None, coords([r["line"] for r in CLEAN]))
    args = ["quality-report", "--warehouse", str(warehouse), "--out", str(out)]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report == {"report": str(out / "data_docs" / "index.html"), "suites": 2,
                      "failed_rules": 0}  # fmt: skip
    assert (out / "data_docs" / "index.html").is_file()

    # raw lacks line 27 too
    write_changelog(spark, warehouse, "s", "t", [*CLEAN, change("x", 9, 27)])
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "changelog.s.t [all] op_in_domain (ERROR): 1 unexpected" in err


def test_redrive_with_an_empty_quarantine_says_zero(spark, tmp_path, capsys):
    warehouse = tmp_path / "warehouse"
    write(spark, warehouse, lake.RAW, "s", None, coords([1]))
    assert main(["redrive", "--warehouse", str(warehouse), "--reason", "invalid"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {
        "s": {"redriven": 0, "remaining": 0}
    }
