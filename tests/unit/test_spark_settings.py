"""Where Spark runs: the sources file's ``spark`` block, then CDC_SPARK_*, then --spark-conf
(``cdc_platform.catalog.spark_settings``), the same for the CLI and a Dagster run."""

from pathlib import Path

import pytest

from cdc_platform import cli
from cdc_platform.catalog import CatalogError, SparkConfig, load_catalog, spark_settings
from cdc_platform.defs.resources import build_resources

SPARK_ENV = ("CDC_SPARK_MASTER", "CDC_SPARK_REMOTE", "CDC_SPARK_CONF", "CDC_SOURCES")
FILE = """
spark:
  master: local[2]
  conf: {spark.sql.shuffle.partitions: 8, spark.driver.memory: 2g}
sources: [{name: s}]
"""


@pytest.fixture(autouse=True)
def _no_spark_env(monkeypatch):
    for var in SPARK_ENV:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def catalog(tmp_path):
    path = tmp_path / "sources.yaml"
    path.write_text(FILE)
    return load_catalog(path)


def test_without_a_file_spark_is_local():
    assert spark_settings() == SparkConfig(master="local[*]", remote=None, conf={})


def test_the_file_gives_master_and_conf(catalog):
    assert spark_settings(catalog) == SparkConfig(
        master="local[2]",
        conf={"spark.sql.shuffle.partitions": "8", "spark.driver.memory": "2g"},
    )


def test_the_environment_overrides_the_file(catalog, monkeypatch):
    monkeypatch.setenv("CDC_SPARK_MASTER", "spark://h:7077")
    monkeypatch.setenv("CDC_SPARK_CONF", "spark.driver.memory=1g, spark.executor.memory=1g")
    assert spark_settings(catalog) == SparkConfig(
        master="spark://h:7077",
        conf={
            "spark.sql.shuffle.partitions": "8",
            "spark.driver.memory": "1g",
            "spark.executor.memory": "1g",
        },
    )


def test_a_remote_wins_over_a_master_of_the_same_level(catalog, monkeypatch):
    monkeypatch.setenv("CDC_SPARK_MASTER", "spark://h:7077")
    monkeypatch.setenv("CDC_SPARK_REMOTE", "sc://h:15002")
    got = spark_settings(catalog)
    assert (got.master, got.remote) == ("spark://h:7077", "sc://h:15002")


def test_the_command_line_overrides_everything(catalog, monkeypatch):
    monkeypatch.setenv("CDC_SPARK_REMOTE", "sc://h:15002")
    monkeypatch.setenv("CDC_SPARK_CONF", "spark.driver.memory=1g")
    got = spark_settings(
        catalog, {"spark.master": "spark://127.0.0.1:7077", "spark.driver.memory": "512m"}
    )
    # A later level's master replaces an earlier level's remote.
    assert got == SparkConfig(
        master="spark://127.0.0.1:7077",
        conf={"spark.sql.shuffle.partitions": "8", "spark.driver.memory": "512m"},
    )
    assert spark_settings(catalog, {"spark.remote": "sc://other:1"}).remote == "sc://other:1"


def test_master_and_remote_keys_in_the_file_conf_choose_too(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("spark: {remote: sc://h:1, conf: {spark.master: 'local[3]'}}\nsources: []\n")
    assert spark_settings(load_catalog(path)) == SparkConfig(master="local[3]")


def test_a_malformed_environment_setting_is_one_line(monkeypatch):
    monkeypatch.setenv("CDC_SPARK_CONF", "spark.a=1,oops")
    message = r"^CDC_SPARK_CONF must look like KEY=VALUE, got 'oops'$"
    with pytest.raises(CatalogError, match=message):
        spark_settings()


def test_a_dagster_run_resolves_as_the_cli(catalog, monkeypatch):
    monkeypatch.setenv("CDC_SPARK_MASTER", "spark://h:7077")
    config = build_resources(catalog)["spark"].spark_config
    assert (config["spark.master"], config["spark.driver.memory"]) == ("spark://h:7077", "2g")
    assert "spark.remote" not in config


def _cli_settings(argv: list[str]) -> SparkConfig:
    return cli._spark_settings(cli._parser().parse_args(argv))


def test_every_spark_command_takes_spark_conf(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./sources.yaml
    wh = str(tmp_path / "wh")
    conf = ["--spark-conf", "spark.master=spark://h:7077", "--spark-conf", "spark.x=a=b"]
    for argv in (
        ["replay", "in.jsonl", "--warehouse", wh],
        ["show", "t", "--warehouse", wh],
        ["redrive", "--warehouse", wh],
        ["quality-report", "--warehouse", wh, "--out", wh],
        ["spark-server"],
        ["models", "run"],
    ):
        assert _cli_settings([*argv, *conf]) == SparkConfig(
            master="spark://h:7077", conf={"spark.x": "a=b"}
        ), argv


def test_the_cli_reads_the_sources_file_when_there_is_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    replay = ["replay", "in.jsonl", "--warehouse", "wh"]
    assert _cli_settings(replay).master == "local[*]"
    Path("sources.yaml").write_text(FILE)
    assert _cli_settings(replay).master == "local[2]"
    Path("other.yaml").write_text(FILE.replace("local[2]", "local[1]"))
    assert _cli_settings([*replay, "--sources", "other.yaml"]).master == "local[1]"
    monkeypatch.setenv("CDC_SOURCES", "other.yaml")
    assert _cli_settings(replay).master == "local[1]"
    with pytest.raises(CatalogError, match="sources file not found: missing.yaml"):
        _cli_settings([*replay, "--sources", "missing.yaml"])


def test_a_malformed_spark_conf_is_one_line_and_exit_2(tmp_path, capsys):
    landing = tmp_path / "in.jsonl"
    landing.write_text("{}\n")
    argv = ["replay", str(landing), "--warehouse", str(tmp_path / "wh"), "--spark-conf", "nope"]

    assert cli.main(argv) == 2

    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == "cdc-platform: error: --spark-conf must look like KEY=VALUE, got 'nope'\n"
