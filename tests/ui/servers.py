"""Servers the browser tests drive, started as processes on 127.0.0.1 and stopped after, and
the headless chromium they use."""

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from cdc_platform.broker import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Headless in a closed network: no sandbox as root, no background connections to Google.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def chromium() -> str:
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is missing: `make test` installs it (make browser)")
    return CHROMIUM


@contextmanager
def serve(args: list[str], port: int, ready: str, log: Path, env: dict[str, str]) -> Iterator[str]:
    """Run ``args`` (listening on ``port``) until ``ready`` answers; yields the base URL."""
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env={**os.environ, **env}, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
        try:
            deadline = time.monotonic() + 180
            while True:
                try:
                    urllib.request.urlopen(url + ready, timeout=2)
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        pytest.fail(f"{args[0]} did not start: see {log}")
                    time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def dagster_webserver(tmp: Path, env: dict[str, str]) -> AbstractContextManager[str]:
    """The webserver over workspace.yaml, ``env`` giving DAGSTER_HOME and the CDC_* paths."""
    port = free_port()
    args = [str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1",
            "-p", str(port)]  # fmt: skip
    return serve(args, port, "/server_info", tmp / "webserver.log", env)


def reports_server(site: Path, tmp: Path) -> AbstractContextManager[str]:
    """The Data Docs site served as `make demo` serves it."""
    port = free_port()
    args = [str(BIN / "python"), "-m", "http.server", "--bind", "127.0.0.1", "--directory",
            str(site), str(port)]  # fmt: skip
    return serve(args, port, "/", tmp / "reports-server.log", {})
