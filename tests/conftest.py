"""Shared fixtures: one local SparkSession for the whole run, a fresh warehouse per test, a Kafka
broker when a test asks for one.

One test that uses ``spark`` in each module of ``CONNECT_TESTS`` (the one marked ``connect``,
else the first) runs twice: ``[local]`` and ``[connect]``, the second against one Spark Connect
server for the whole run; ``CDC_CONNECT_ALL=1`` runs every test of those modules twice.
``-m spark_connect`` runs only the Connect pass, ``-m "not spark_connect"`` skips it. The tests
without a JVM run first, while the JVMs the others need start and warm up
(``_start_jvms_early``)."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from pyspark.sql import SparkSession

from cdc_platform import broker
from cdc_platform.processes import stop_group
from cdc_platform.spark import connect_server
from cdc_platform.spark.session import get_spark

# Started in the background (nohup, `&`, a CI runner), this process ignores SIGINT, and Dagster
# maps SIGTERM to SIGINT's handler (``dagster._utils.interrupts``): SIGTERM would be ignored too,
# and every server a test starts would inherit that, so no SIGTERM could stop it. Python's own
# SIGINT handler instead: a child starts with both signals at their defaults.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Property and fuzz tests draw the same examples on every run ("ci", the default): a red run means
# the code changed, not the dice. `make fuzz` selects "fuzz": new random examples each run, many
# more of them (CDC_PROPERTY_EXAMPLES, QUALITY_FUZZ_EXAMPLES); pin what it finds as @example.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("fuzz", derandomize=False, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The team's reference material sits beside the clone (../shared), in CI too.
SHARED = Path(os.environ.get("CDC_SHARED", Path(__file__).resolve().parents[2] / "shared"))
CORPUS = SHARED / "corpus"
SEEDS = SHARED / "seeds"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


# local[2] with few shuffle partitions: the suite's frames are tiny, scheduling dominates.
SPARK_CONF = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}

# Every path of the platform must also work on Spark Connect: one test of each of these modules
# runs on both sessions, the rest on the local one (CDC_CONNECT_ALL=1: every test of them on
# both): the module's test marked ``@pytest.mark.connect`` (one that drives its path, not just
# builds an expression), else its first. One module per path: the end-to-end replay, each
# format's parse (Avro through mapInArrow), format detection, the merge, history, models, the
# Dagster pipeline, redrive and the quality suites. (Not the property test: its many examples
# would cost minutes more, and the paths it drives are all covered here.)
_TESTS = Path(__file__).resolve().parent
CONNECT_TESTS = [
    _TESTS / name
    for name in (
        "spark/test_corpus_debezium.py", "spark/test_merge_semantics.py", "spark/test_history.py",
        "spark/test_detection.py", "spark/test_format_canal.py",
        "spark/test_format_datahub_tuple.py", "spark/test_format_dataworks.py",
        "spark/test_format_dts_avro.py", "spark/test_format_maxwell.py",
        "spark/test_format_ogg.py", "spark/test_format_shareplex.py", "models",
        "defs/test_pipeline_in_dagster.py", "quality/test_redrive.py", "quality/test_suites.py",
        "quality/test_cli.py",
    )
]  # fmt: skip


# The tests that run the platform's processes end to end, each a minute or more of waiting on
# them: the demo stack and its stop, Dagster runs launched by sensors and daemons, continuous
# runs, a production instance, the browser, a standalone cluster. Marked ``live``: `make
# test-live` runs them (CI too), `make test` the rest.
LIVE_TESTS = [
    _TESTS / name
    for name in (
        "ops/test_stack_stop.py", "ops/test_production.py", "ui",
        "kafka/test_kafka_in_dagster.py", "kafka/test_continuous.py",
        "defs/test_run_launcher.py", "spark/test_standalone_cluster.py",
    )
]  # fmt: skip


def _under(path: Path, tests: list[Path]) -> bool:
    path = path.resolve()
    return any(path == t or t in path.parents for t in tests)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "spark" in metafunc.fixturenames and _under(metafunc.definition.path, CONNECT_TESTS):
        metafunc.parametrize("spark", ["local", "connect"], indirect=True, scope="session")


def _on_connect(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("spark") == "connect"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    every = os.environ.get("CDC_CONNECT_ALL") == "1"
    chosen: dict[Path, pytest.Item] = {}  # each module's one [connect] test
    for item in filter(_on_connect, items):
        first = chosen.setdefault(item.path, item)
        if item.get_closest_marker("connect") and not first.get_closest_marker("connect"):
            chosen[item.path] = item
    kept, dropped = [], []
    for item in items:
        if "spark" in item.fixturenames:  # the rest of a module may run without a JVM
            item.add_marker("spark")
        if _under(item.path, LIVE_TESTS):
            item.add_marker("live")
        if _on_connect(item):
            item.add_marker("spark_connect")
            if not every and chosen[item.path] is not item:
                dropped.append(item)
                continue
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    # The tests without a JVM first: the JVMs start meanwhile (``_start_jvms_early``).
    items.sort(key=_needs_jvm)


def _needs_jvm(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) for m in ("spark", "jvm", "browser"))


# pyspark picks Classic or Connect for pyspark.sql.functions, Window, ... by one process-wide
# variable; this process holds both sessions, so each test sets it (and CDC_SPARK_REMOTE, for
# the CLI and Dagster resources it runs) before its fixtures are built. A path that would start
# a local session in a [connect] test fails there (SESSION_ALREADY_EXIST), never runs locally.
_ENV_BEFORE = {k: os.environ.get(k) for k in ("SPARK_CONNECT_MODE_ENABLED", "CDC_SPARK_REMOTE")}
_connect_url: str | None = None


def _set_mode(connect: bool) -> None:
    wanted = {"SPARK_CONNECT_MODE_ENABLED": "1", "CDC_SPARK_REMOTE": _connect_url}
    for key, before in _ENV_BEFORE.items():
        value = wanted[key] if connect else before
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _needs_jvm(item) and _local_warm_up is not None:
        _local_warm_up.join()  # it builds local-mode columns: done before a test picks a mode
    _set_mode(_on_connect(item))


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-2000:]
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"no Spark Connect server after {timeout} s: {log.read_text()[-2000:]}")


# Started by ``_start_jvms_early``, before the first test that needs them.
_local_warm_up: threading.Thread | None = None
_connect_server: tuple[subprocess.Popen, int, Path] | None = None


@pytest.fixture(scope="session", autouse=True)
def _start_jvms_early(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """While the tests without a JVM run (first: ``pytest_collection_modifyitems``) on one
    core, the JVMs the later tests need start on the other: the Spark Connect server, and the
    local session, which then replays a batch of the demo's traffic (``connect_server.warm``)
    so that the first Spark test does not pay the JIT's warm-up alone."""
    global _local_warm_up, _connect_server
    items = request.session.items
    if any(_on_connect(i) or "spark_connect_url" in i.fixturenames for i in items):
        _connect_server = _start_connect_server(tmp_path_factory.mktemp("spark-connect"))
    if any("spark" in i.fixturenames and not _on_connect(i) for i in items):
        _local_warm_up = threading.Thread(
            target=lambda: connect_server.warm(get_spark("local[2]", SPARK_CONF), rounds=1),
            name="local Spark warm-up",
            daemon=True,
        )
        _local_warm_up.start()
    try:
        yield
    finally:
        if _local_warm_up is not None:
            _local_warm_up.join()
        if _connect_server is not None:
            stop_group(_connect_server[0], grace=60)


def _start_connect_server(scratch: Path) -> tuple[subprocess.Popen, int, Path]:
    """A Spark Connect server started as users start it (``cdc-platform spark-server``: this
    interpreter for Python workers) on a free port: (process, port, log)."""
    port = broker.free_port()
    log = scratch / "server.log"
    (scratch / "sources.yaml").write_text("spark: {master: 'local[2]'}\nsources: []\n")
    # 2 GB: the server shares this 2-core CI machine with the local session's JVM.
    conf = {**SPARK_CONF, "spark.driver.memory": "2g"}
    argv = [str(Path(sys.executable).parent / "cdc-platform"), "spark-server", "--no-warm-up"]
    argv += ["--sources", str(scratch / "sources.yaml"), "--port", str(port)]
    argv += [arg for kv in conf.items() for arg in ("--spark-conf", "=".join(kv))]
    # Not a client: a [connect] test may have set the variables that would make it one.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CDC_", "SPARK_"))}
    with log.open("wb") as out:
        server = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return server, port, log


@pytest.fixture(scope="session")
def spark_connect_url() -> Iterator[str]:
    """sc:// address of the session's Spark Connect server (``_start_jvms_early``), once it
    answers; stopped at the end of the run."""
    global _connect_url
    assert _connect_server is not None, "no test collected needs the Spark Connect server"
    server, port, log = _connect_server
    wait_for_port(port, server, log, timeout=180)
    _connect_url = f"sc://127.0.0.1:{port}"
    if os.environ.get("SPARK_CONNECT_MODE_ENABLED") == "1":
        _set_mode(True)  # a [connect] test started it: it runs on it (now with its URL)
    try:
        yield _connect_url
    finally:
        _connect_url = None


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    """The local session, or (param "connect") a Spark Connect client of ``spark_connect_url``.

    The client is a new session (``create``: the classic builder's ``getOrCreate`` refuses a
    remote one while a local one exists); it becomes Connect's default, which later
    ``get_spark(remote=...)`` calls (CLI, Dagster resources) return."""
    if getattr(request, "param", "local") != "connect":
        yield get_spark("local[2]", SPARK_CONF)
        return
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(request.getfixturevalue("spark_connect_url")).create()
    yield session
    session.stop()


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    return tmp_path / "warehouse"


@pytest.fixture(scope="session")
def expected() -> dict:
    return json.loads((CORPUS / "EXPECTED.json").read_text())


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a real Kafka-protocol broker (the embedded Tansu, cdc_platform.broker) on a
    free loopback port, stopped at the end; every test uses its own topics."""
    scratch = tmp_path_factory.mktemp("tansu")
    proc, bootstrap = broker.start(scratch / "tansu.log", scratch=scratch)
    try:
        yield bootstrap
    finally:
        broker.stop(proc)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator:  # of tests.postgres_server.PostgresServer
    """A PostgreSQL server of the run's own (tests/postgres_server.py): a fresh cluster on a free
    loopback port with a password-authenticated user and database; ``.env()`` gives the
    ``DAGSTER_PG_*`` variables. Stopped and deleted at the end of the run."""
    from tests.postgres_server import PostgresServer

    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator:  # of S3Server
    """A real S3 server of the run's own (SeaweedFS, tests/s3_server.py) on loopback, a random
    key per run; ``.env()`` gives the ``AWS_*`` variables, ``.requests()`` the requests served.
    Stopped at the end of the run."""
    from tests.s3_server import S3Server

    with S3Server(tmp_path_factory.mktemp("seaweedfs"), metrics=True) as server:
        yield server


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator:  # of AzureServer
    """A real Azure Blob Storage server of the run's own (Azurite, tests/azure_server.py) on
    loopback, one account with a random key; ``.env()`` gives the ``AZURE_*`` variables."""
    from tests.azure_server import AzureServer

    with AzureServer(tmp_path_factory.mktemp("azurite")) as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server) -> str:
    """A new bucket on ``s3_server`` for this test alone: it starts empty."""
    import uuid

    name = f"test-{uuid.uuid4().hex[:16]}"
    s3_server.create_bucket(name)
    return name
