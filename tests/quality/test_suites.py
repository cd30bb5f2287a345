"""Suite by suite: each rule fails on a table built to violate it and passes on a clean one."""

import datetime as dt
import threading

import pyarrow as pa
import pytest

from cdc_platform import lake
from cdc_platform.catalog import QualityConfig, SourceConfig, TableConfig
from cdc_platform.defs import quality
from cdc_platform.defs.keys import asset_key
from cdc_platform.quality import frames, suites, validations
from cdc_platform.quality.validate import validate
from tests.quality.builders import DATE, change, coordinates, write, write_changelog

pytestmark = pytest.mark.spark
SOURCE = SourceConfig(name="s", tables=[TableConfig(name="t", source_table="app.t")])

# rule -> the rows that violate it (ids 100+ are the culprits, so samples can be checked)
VIOLATIONS = {
    "op_in_domain": [change("x", 101, 1)],
    "insert_images": [change("c", 102, 2, before={"id": 102, "name": "old"})],
    "update_after_image": [change("u", 103, 3, after=None)],
    "update_before_image": [change("u", 104, 4, before=None, source_format="dataworks")],
    "delete_images": [change("d", 105, 5, after={"id": 105, "name": "x"})],
    "key_not_null": [change("c", None, 6, key={"id": None})],
    "sequence_not_null": [change("c", 107, 7, sequence=None)],
    "key_sequence_unique": [change("c", 108, 8), change("u", 108, 9, sequence="00000008|f#8")],
    "event_time_bounds": [change("c", 110, 10, event_time=dt.datetime(2100, 1, 1, tzinfo=dt.UTC))],
}
CLEAN = [
    change("r", 1, 20), change("c", 2, 21), change("u", 2, 22),
    change("u", 3, 23, before=None),  # debezium without REPLICA IDENTITY FULL: allowed
    change("u", 4, 24, source_format="dataworks"), change("d", 1, 25), change("t", None, 26),
]  # fmt: skip


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    return tmp_path_factory.mktemp("quality") / "warehouse"


def test_every_changelog_rule_has_a_violation_here():
    assert set(VIOLATIONS) == set(suites.load(suites.CHANGELOG).rules)


def test_changelog_suite_passes_a_clean_change_log(spark, warehouse):
    write_changelog(spark, warehouse, "s", "t", CLEAN)
    run = validations.validate_changelog(spark, warehouse, SOURCE, "t", [DATE])
    assert run.engine == "pandas" and run.rows == len(CLEAN)
    assert [r.rule for r in run.rules if not r.success] == []
    # GX's fingerprint of the rows (a hash of the whole frame) is not computed
    assert "pandas_data_fingerprint" not in run.result.meta["batch_markers"]


def test_each_changelog_rule_fails_on_its_violation(spark, warehouse):
    rows = [*CLEAN, *[r for bad in VIOLATIONS.values() for r in bad]]
    write_changelog(spark, warehouse, "s", "t", rows)
    run = validations.validate_changelog(spark, warehouse, SOURCE, "t", [DATE])
    failed = {r.rule: r for r in run.rules if not r.success}
    assert set(failed) == set(VIOLATIONS)
    for rule, bad in VIOLATIONS.items():
        sample = failed[rule].sample
        # the sample names the failing rows by key and raw coordinates
        assert {s["line"] for s in sample} >= {r["line"] for r in bad[:1]}, (rule, sample)
        assert all("key__id" in s and "file" in s for s in sample), (rule, sample)
    assert failed["op_in_domain"].severity == "ERROR"
    assert failed["event_time_bounds"].severity == "WARN"


def test_spark_engine_agrees_with_pandas(spark, warehouse):
    """Big frames stay in Spark: the same suite gives the same verdicts there."""
    rows = [*CLEAN, *[r for bad in VIOLATIONS.values() for r in bad]]
    write_changelog(spark, warehouse, "s", "t", rows)
    frame, key = frames.changelog_frame(spark, warehouse, "s", "t", [DATE], ["dataworks"])
    args = (suites.load(suites.CHANGELOG), "changelog.s.t", key, {})
    params = validations.changelog_parameters(QualityConfig())
    kw = {"batch": DATE, "index_columns": [*key, "line"], "parameters": params}
    on_spark = validate(frame, *args, engine="spark", **kw)
    on_pandas = validate(frame, *args, engine="pandas", **kw)
    assert on_spark.engine == "spark"
    verdict = {r.rule: (r.success, r.unexpected) for r in on_pandas.rules}
    assert {r.rule: (r.success, r.unexpected) for r in on_spark.rules} == verdict


def test_overrides_from_sources_yaml_change_bounds_formats_and_severity(spark, warehouse):
    write_changelog(spark, warehouse, "s", "t", CLEAN)
    strict = QualityConfig(
        min_event_time=dt.datetime(2027, 1, 1, tzinfo=dt.UTC),
        update_before_image=True,
        severity={"event_time_bounds": "ERROR"},
    )
    loud = QualityConfig(severity={"update_before_image": "ERROR"})
    source = SourceConfig(name="s", quality=loud, tables=[TableConfig(name="t", quality=strict)])
    run = validations.validate_changelog(spark, warehouse, source, "t", [DATE])
    failed = {r.rule: r.severity for r in run.rules if not r.success}
    assert failed == {"event_time_bounds": "ERROR", "update_before_image": "ERROR"}


def test_current_suite(spark, warehouse):
    write_changelog(spark, warehouse, "s", "t", CLEAN)  # the key comes from the change log's state
    uri = lake.TableRef(lake.CURRENT, "s", "t").uri(warehouse)

    def current(rows):
        cols = {"id": pa.int32(), "name": pa.string(), "__sequence": pa.string(),
                "__op": pa.string(), "__event_time": pa.timestamp("us", tz="UTC"),
                "__deleted": pa.bool_()}  # fmt: skip
        data = [{"name": "x", "__sequence": f"{i:04d}", "__op": "c", "__event_time": None,
                 "__deleted": False, **r} for i, r in enumerate(rows)]  # fmt: skip
        lake.replace(
            spark.createDataFrame(pa.Table.from_pylist(data, pa.schema(cols))),
            uri,
            lake.TableState(),
        )

    current([{"id": 1}, {"id": 2}, {"id": 3, "__deleted": True}])
    balance = {"live_before": 1, "truncated_live": 0, "made_live": 2, "made_dead": 1,
               "live_after": 2}  # fmt: skip
    runs = validations.validate_current(spark, warehouse, SOURCE, "t", balance)
    assert [r.rule for run in runs for r in run.rules if not r.success] == []

    # a key twice (live and tombstone: the tombstone is then exposed), a null key, bad balance
    current([{"id": 1}, {"id": 1, "__deleted": True}, {"id": None}])
    balance = {"live_before": 3, "truncated_live": 1, "made_live": 2, "made_dead": 0,
               "live_after": 3}  # fmt: skip
    runs = validations.validate_current(spark, warehouse, SOURCE, "t", balance)
    failed = {r.rule: r for run in runs for r in run.rules if not r.success}
    assert set(failed) == {"pk_not_null", "pk_unique", "no_exposed_tombstones", "row_count_balance"}
    assert failed["pk_unique"].unexpected == 2
    assert failed["no_exposed_tombstones"].sample[0]["id"] == 1

    # As after a merge: the rows of the files it wrote whose keys the change-log files it
    # merged hold (1 is one). The same verdicts; the null key stays, for pk_not_null.
    log = lake.TableRef(lake.CHANGELOG, "s", "t").uri(warehouse)
    runs = validations.validate_current(
        spark, warehouse, SOURCE, "t", balance, lake.files(uri), lake.files(log)
    )
    narrowed = {r.rule: r for run in runs for r in run.rules if not r.success}
    assert set(narrowed) == set(failed) and narrowed["pk_unique"].unexpected == 2
    assert runs[0].rows == 3


def test_reconciliation_finds_a_raw_message_in_no_output(spark, warehouse):
    source = SourceConfig(name="r")
    write(spark, warehouse, lake.RAW, "r", None, coordinates([1, 2, 3, 4, 5]))
    write(spark, warehouse, lake.CHANGELOG, "r", "a", coordinates([1, 1, 2]))  # a multi-row message
    write(spark, warehouse, lake.DDL, "r", "a", coordinates([3]))
    write(spark, warehouse, lake.QUARANTINE, "r", None, coordinates([4], reason=["invalid JSON"]))
    run = validations.validate_reconciliation(spark, warehouse, source, [DATE])
    rule = run.rule("raw_messages_accounted")
    assert not rule.success and rule.unexpected == 1 and rule.sample[0]["line"] == 5
    # e.g. a consumed UPDATE_BEFOR
    write(spark, warehouse, lake.CONTROL, "r", None, coordinates([5]))
    run = validations.validate_reconciliation(spark, warehouse, source, [DATE])
    assert run.success and run.rule("raw_messages_accounted").checked == 5


def test_the_reconciliation_runs_in_a_thread_beside_a_block_even_one_that_fails(spark, warehouse):
    source = SourceConfig(name="beside")
    write(spark, warehouse, lake.RAW, "beside", None, coordinates([1, 2]))
    write(spark, warehouse, lake.CHANGELOG, "beside", "a", coordinates([1]))
    validated: list[quality.Validated] = []
    with quality.reconciling(spark, warehouse, source, [DATE], None, validated):
        assert any(t.name.startswith("reconciliation") for t in threading.enumerate())
    [done] = validated
    assert done.key == asset_key(lake.QUARANTINE, "beside") and done.layer == suites.RECONCILIATION
    assert done.run.rule("raw_messages_accounted").unexpected == 1  # message 2
    # A block that fails raises its own error, and the reconciliation is still reported.
    validated.clear()
    with (
        pytest.raises(RuntimeError, match="the merge failed"),
        quality.reconciling(spark, warehouse, source, [DATE], None, validated),
    ):
        raise RuntimeError("the merge failed")
    assert [v.run.rule("raw_messages_accounted").unexpected for v in validated] == [1]
