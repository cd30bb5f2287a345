"""User errors on the command line: one line naming the problem, exit 2, nothing written, and no
Spark started (so these run in-process, in the fast tier)."""

import pytest

from cdc_platform import cli

BAD_YAML = "sources: [{name: s, format: nope}]\n"


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["replay", "{seed}", "--warehouse", "{wh}", "--no-such-option"], "--no-such-option"),
        (["replay", "{missing}", "--warehouse", "{wh}"], "input not found"),
        (["replay", "{seed}", "--warehouse", "{wh}", "--column-type", "id=notatype"], "notatype"),
        (["replay", "{seed}", "--warehouse", "{wh}", "--column-type", "id"], "--column-type"),
        (["replay", "{seed}", "--warehouse", "{wh}", "--format", "nope"], "nope"),
        (["replay", "{seed}", "--warehouse", "{seed}"], "warehouse is not a directory"),
        (["show", "t", "--warehouse", "{missing}"], "warehouse not found"),
        (["redrive", "--warehouse", "{lake}", "--sources", "{missing}"], "sources file not found"),
        (["quality-report", "--warehouse", "{lake}", "--out", "{wh}", "--sources", "{bad}"],
         "nope"),
        (["models", "run", "--sources", "{bad}", "--warehouse", "{lake}"], "nope"),
    ],
    ids=[
        "unknown-option", "missing-input", "unknown-type", "type-without-column",
        "unknown-format", "warehouse-is-a-file", "show-missing-warehouse",
        "missing-sources-file", "bad-sources-file", "models-bad-sources-file",
    ],
)  # fmt: skip
def test_a_user_error_is_one_line_naming_it_and_exit_2(tmp_path, capsys, args, names):
    seed = tmp_path / "insert.jsonl"
    seed.write_text('{"op": "c"}\n')
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_YAML)
    lake = tmp_path / "lake"  # a warehouse that exists
    lake.mkdir()
    paths = {"seed": seed, "wh": tmp_path / "wh", "missing": tmp_path / "missing", "bad": bad}
    paths["lake"] = lake

    assert cli.main([a.format(**{k: str(v) for k, v in paths.items()}) for a in args]) == 2

    out = capsys.readouterr()
    assert out.out == ""
    assert len(out.err.splitlines()) == 1, out.err
    assert out.err.startswith("cdc-platform: error:") and names in out.err, out.err
    assert not (tmp_path / "wh").exists() and not any(lake.iterdir())
