"""Which failures of a step are transient, and retrying only those.

Retried (``retried_if_transient``, up to ``len(RETRY_SECONDS)`` times, waiting ``RETRY_SECONDS``):

- the Spark Connect server is unavailable (restarting after a crash, out of memory, kill -9): the
  run's session is stopped so the retry connects a new one;
- the Kafka broker is unreachable (no metadata, no watermarks);
- the schema registry is unreachable or failing (HTTP 5xx), raised in a Spark task reading Avro;
- a Delta commit lost a race to another writer (delta-rs ``CommitFailedError``);
- the object store holding the lake does not answer (down, stopped, overloaded).

Everything else fails the step at once, so a deterministic failure never loops: a blocking check
that failed, a bad configuration, a bug. A Spark failure then names its root cause first
(``fail_with_root_cause``): the JVM's deepest "Caused by:" line, which Spark prints under a
stack trace of hundreds of lines (a full disk is told only there). A message that cannot be
parsed never fails a step: it goes to quarantine. Every step is exactly-once on its own
(offsets and raw versions are stored with the commits), so running it again after any of these
is safe.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg
from deltalake.exceptions import CommitFailedError

from cdc_platform.formats import confluent_avro
from cdc_platform.ingest.kafka import KafkaUnavailable
from cdc_platform.lake import storage

RETRY_SECONDS = (5, 15, 30)
# What a Spark Connect client says when its server is gone or was restarted under it: its own
# errors, and PySparkRuntimeError's RESPONSE_ALREADY_RECEIVED, raised when the session or the
# operation of a query whose first results had arrived is gone (the fault suite met it).
_SPARK_ERRORS = ("SparkConnectGrpcException", "SparkConnectException", "PySparkRuntimeError")
_SPARK_GONE = (
    "StatusCode.UNAVAILABLE",
    "SESSION_NOT_FOUND",
    "SESSION_CHANGED",
    "NO_ACTIVE_SESSION",
    "NO_ACTIVE_OR_DEFAULT_SESSION",
    "INVALID_HANDLE.OPERATION_NOT_FOUND",
)


def transient_reason(error: BaseException) -> str | None:
    """One line saying why ``error`` is transient, None when it is not."""
    if isinstance(error, KafkaUnavailable):
        return f"the Kafka broker is unreachable: {error}"
    if registry := confluent_avro.unavailable_reason(str(error)):
        return f"the schema registry is unavailable: {registry}"
    if isinstance(error, CommitFailedError):
        return f"a Delta commit lost a race to another writer: {error}"
    if store := storage.unavailable_reason(str(error)):
        return store
    if _spark_unavailable(error):
        remote = os.environ.get("CDC_SPARK_REMOTE", "the Spark Connect server")
        log = os.environ.get("CDC_SPARK_SERVER_LOG")
        return f"the Spark Connect server {remote} is unavailable" + (
            f" (its log: {log})" if log else ""
        )
    return None


def root_cause(error: BaseException) -> str | None:
    """The last "Caused by:" line of ``error``'s text (a JVM stack trace's deepest cause), None
    when it has none."""
    prefix = "Caused by:"
    causes = [line.strip() for line in str(error).splitlines() if line.lstrip().startswith(prefix)]
    return causes[-1].removeprefix(prefix).strip() if causes else None


def fail_with_root_cause(error: Exception) -> None:
    """For a failure that is not transient: raise a ``dg.Failure`` whose first line is
    ``error``'s root cause (``root_cause``), from ``error`` (whole, below it); return when it
    has none (the caller raises ``error``)."""
    if cause := root_cause(error):
        raise dg.Failure(f"{cause} (the root cause of the {type(error).__name__} below)") from error


def _spark_unavailable(error: BaseException) -> bool:
    """A Spark Connect call that could not reach the server (gRPC UNAVAILABLE), or a session the
    server (restarted) or the client (after such a failure) no longer knows."""
    text = str(error)
    return type(error).__name__ in _SPARK_ERRORS and any(marker in text for marker in _SPARK_GONE)


def reset_if_spark_gone(error: BaseException, spark: object = None) -> None:
    """Drop the session of ``spark`` (the run's ``SparkResource``) when ``error`` says its
    server went away: the next use connects a new one."""
    if spark is not None and _spark_unavailable(error):
        spark.reset()  # type: ignore[attr-defined]


@contextmanager
def retried_if_transient(
    context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext, spark: object = None
) -> Iterator[None]:
    """Turn a transient failure of the block into a retry of the step (``dg.RetryRequested``),
    with one line naming the cause; other failures pass through. ``spark``: the run's
    ``SparkResource``, whose session is dropped when the server was the cause."""
    try:
        yield
    except Exception as error:
        reason = transient_reason(error)
        if reason is None:
            fail_with_root_cause(error)
            raise
        reset_if_spark_gone(error, spark)
        attempt = context.retry_number
        if attempt >= len(RETRY_SECONDS):
            raise dg.Failure(f"{reason} (still after {attempt} retries)") from error
        wait = RETRY_SECONDS[attempt]
        context.log.warning(f"transient: {reason}; retry {attempt + 1} of "
                            f"{len(RETRY_SECONDS)} in {wait} s")  # fmt: skip
        raise dg.RetryRequested(max_retries=len(RETRY_SECONDS), seconds_to_wait=wait) from error
