"""Transient failures retry the step, with a back-off; deterministic ones fail it at once
(cdc_platform/defs/transient.py). Real exceptions: a Delta commit that lost a race (delta-rs),
a Spark Connect client whose server is gone, a broker that does not answer."""

import socket

import dagster as dg
import pytest
from deltalake.exceptions import CommitFailedError

from cdc_platform import lake
from cdc_platform.catalog import KafkaConfig, SourceConfig
from cdc_platform.defs import transient
from cdc_platform.ingest import kafka
from cdc_platform.ingest.landing import RAW_SCHEMA


def _lost_race(tmp_path) -> CommitFailedError:
    """Two Kafka batches committed from the same table version: the second loses the race."""
    uri = lake.TableRef(lake.RAW, "k").uri(tmp_path)
    read_version, _ = lake.kafka_offsets(uri, RAW_SCHEMA, [("t", 0)])
    lake.append_kafka_batch(uri, RAW_SCHEMA.empty_table(), read_version, {("t", 0): 1}, {})
    with pytest.raises(CommitFailedError) as lost:
        lake.append_kafka_batch(uri, RAW_SCHEMA.empty_table(), read_version, {("t", 0): 2}, {})
    return lost.value


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_lost_delta_race_and_an_unreachable_broker_are_transient(tmp_path):
    assert "lost a race" in transient.transient_reason(_lost_race(tmp_path))
    source = SourceConfig(
        name="k",
        transport="kafka",
        kafka=KafkaConfig(
            bootstrap_servers=f"127.0.0.1:{_closed_port()}",
            topics=["t"],
            consumer={"socket.connection.setup.timeout.ms": "1000"},
        ),
    )
    kafka._METADATA_TIMEOUT, saved = 2.0, kafka._METADATA_TIMEOUT  # the broker is not there
    try:
        with pytest.raises(kafka.KafkaUnavailable) as down:
            kafka.ingest_kafka(tmp_path, source)
    finally:
        kafka._METADATA_TIMEOUT = saved
    assert transient.transient_reason(down.value).startswith("the Kafka broker is unreachable")
    assert transient.transient_reason(ValueError("a bad configuration")) is None
    assert transient.transient_reason(kafka.KafkaIngestError("offset gone")) is None


def test_a_spark_connect_server_that_is_gone_is_transient(monkeypatch):
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    monkeypatch.setenv("CDC_SPARK_REMOTE", "sc://127.0.0.1:15002")
    monkeypatch.setenv("CDC_SPARK_SERVER_LOG", "var/spark-server.out")
    session = ConnectSession.builder.remote(f"sc://127.0.0.1:{_closed_port()}").create()
    session.client.set_retry_policies([DefaultPolicy(max_retries=1)])
    try:
        with pytest.raises(Exception) as gone:
            session.range(1).count()
    finally:
        session.release_session_on_close = False
        session.stop()
    assert transient.transient_reason(gone.value) == (
        "the Spark Connect server sc://127.0.0.1:15002 is unavailable "
        "(its log: var/spark-server.out)"
    )
    # A query whose first results had arrived when the server restarted (its reattach finds
    # neither session nor operation): the client's own error, as reattach.py raises it.
    for lost in ("INVALID_HANDLE.SESSION_NOT_FOUND", "INVALID_HANDLE.OPERATION_NOT_FOUND"):
        error = PySparkRuntimeError(
            errorClass="RESPONSE_ALREADY_RECEIVED", messageParameters={"error_type": lost}
        )
        assert transient.transient_reason(error).startswith("the Spark Connect server")
    # A session registered by a build the restarting server broke off: after the resource's
    # reset (which forgets it) a retry builds a new one.
    orphan = PySparkRuntimeError(errorClass="NO_ACTIVE_OR_DEFAULT_SESSION", messageParameters={})
    assert transient.transient_reason(orphan).startswith("the Spark Connect server")
    other = PySparkRuntimeError(errorClass="SESSION_NOT_SAME", messageParameters={})
    assert transient.transient_reason(other) is None


def test_a_reset_forgets_a_half_built_connect_session():
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from cdc_platform.defs.resources import SparkResource

    orphan = ConnectSession.builder.remote(f"sc://127.0.0.1:{_closed_port()}").create()
    try:
        assert ConnectSession.getActiveSession() is orphan
        SparkResource(spark_config={}).reset()
        assert ConnectSession.getActiveSession() is None
        assert ConnectSession._get_default_session() is None  # noqa: SLF001
    finally:
        orphan.release_session_on_close = False
        orphan.stop()


def test_dagster_retries_a_transient_failure_and_not_a_deterministic_one(tmp_path, monkeypatch):
    monkeypatch.setattr(transient, "RETRY_SECONDS", (0, 0))
    race = _lost_race(tmp_path)
    attempts: list[int] = []

    @dg.asset
    def flaky(context: dg.AssetExecutionContext) -> int:
        with transient.retried_if_transient(context):
            attempts.append(context.retry_number)
            if len(attempts) == 1:
                raise race
            return 1

    @dg.asset
    def broken(context: dg.AssetExecutionContext) -> int:
        with transient.retried_if_transient(context):
            attempts.append(context.retry_number)
            raise ValueError("a blocking check failed")

    assert dg.materialize([flaky]).success
    assert attempts == [0, 1]

    attempts.clear()
    assert not dg.materialize([broken], raise_on_error=False).success
    assert attempts == [0]  # not retried

    @dg.asset
    def always_racing(context: dg.AssetExecutionContext) -> int:
        with transient.retried_if_transient(context):
            attempts.append(context.retry_number)
            raise race

    attempts.clear()
    result = dg.materialize([always_racing], raise_on_error=False)
    assert not result.success and attempts == [0, 1, 2]  # two retries, then it fails
    failure = result.get_step_failure_events()[0].step_failure_data.error
    assert "lost a race" in failure.message and "still after 2 retries" in failure.message


def test_an_asset_check_retries_a_transient_failure(tmp_path, monkeypatch):
    """The SQL models' tests are asset checks (defs/models.py): a Spark server restarted under
    them is retried as under a source's steps."""
    monkeypatch.setattr(transient, "RETRY_SECONDS", (0, 0))
    race = _lost_race(tmp_path)
    attempts: list[int] = []

    @dg.asset
    def model() -> int:
        return 1

    @dg.asset_check(asset=model)
    def model_test(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        with transient.retried_if_transient(context):
            attempts.append(context.retry_number)
            if len(attempts) == 1:
                raise race
            return dg.AssetCheckResult(passed=True)

    result = dg.materialize([model, model_test])
    assert result.success and attempts == [0, 1]
    assert [e.passed for e in result.get_asset_check_evaluations()] == [True]


def test_a_spark_failure_names_its_root_cause_first(tmp_path, spark):
    """A Spark job's error ends in hundreds of lines of JVM stack trace, with what went wrong
    only in a "Caused by:" line (a full disk too): the failure's first line is that cause, and
    Spark's whole error stays its cause."""
    (tmp_path / "part-0.parquet").write_text("not Parquet: a data file cut short")

    @dg.asset
    def reads_a_broken_file(context: dg.AssetExecutionContext) -> int:
        with transient.retried_if_transient(context):
            return spark.read.parquet(str(tmp_path)).count()

    result = dg.materialize([reads_a_broken_file], raise_on_error=False)
    assert not result.success
    error = result.get_step_failure_events()[0].step_failure_data.error
    first = error.message.splitlines()[0]
    assert "part-0.parquet is not a Parquet file" in first, first
    assert "Failure: java.lang.RuntimeException" in first, first
    assert error.cause is not None and "Caused by:" in error.cause.message
    assert transient.root_cause(ValueError("no JVM trace")) is None
