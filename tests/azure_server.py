"""A real Azure Blob Storage server on loopback for the object-storage tests: Azurite (Microsoft's
emulator, ``make azurite`` installs it from npm), one account with a random key.

A real server, not a mock: it checks Shared Key signatures (a wrong key gets 403), refuses a
create-only put on an existing blob (delta-rs's and our commits rely on it), and serves the
Blob API that delta-rs, obstore and pyarrow's Azure client speak."""

import base64
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from types import TracebackType

from pyarrow import fs as pafs

ROOT = Path(__file__).resolve().parents[1]
AZURITE = ROOT / ".venv" / "node" / "node_modules" / ".bin" / "azurite-blob"
START_TIMEOUT = 30.0


def azurite() -> str | None:
    """The ``azurite-blob`` command: ``make azurite``'s, else one on PATH."""
    return str(AZURITE) if AZURITE.exists() else shutil.which("azurite-blob")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AzureServer:
    """``azurite-blob`` in its own process group, its blobs and log under ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.account = "lake" + secrets.token_hex(4)
        self.key = base64.b64encode(secrets.token_bytes(64)).decode()
        self.log = self.data_dir / "azurite.log"
        self.port = 0
        self._proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.account}"

    def env(self, key: str | None = None) -> dict[str, str]:
        """The variables delta-rs / object_store read (``key``: to sign with another key)."""
        return {
            "AZURE_STORAGE_ACCOUNT_NAME": self.account,
            "AZURE_STORAGE_ACCOUNT_KEY": key or self.key,
            "AZURE_STORAGE_ENDPOINT": self.endpoint,
            "AZURE_ALLOW_HTTP": "true",
        }

    def filesystem(self) -> pafs.AzureFileSystem:
        authority = f"127.0.0.1:{self.port}"
        return pafs.AzureFileSystem(
            self.account, account_key=self.key,
            blob_storage_authority=authority, blob_storage_scheme="http",
            dfs_storage_authority=authority, dfs_storage_scheme="http",
        )  # fmt: skip

    def create_container(self) -> str:
        """A new, empty container of this account; its name."""
        name = f"test-{uuid.uuid4().hex[:16]}"
        self.filesystem().create_dir(name)
        return name

    def start(self) -> "AzureServer":
        command = azurite()
        if command is None:
            raise RuntimeError("azurite-blob is not installed: run `make azurite`")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        argv = [
            command, "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
            "--location", str(self.data_dir), "--debug", str(self.log),
            "--skipApiVersionCheck",  # pyarrow's and object_store's clients send newer versions
            "--disableTelemetry",
        ]  # fmt: skip
        env = {**os.environ, "AZURITE_ACCOUNTS": f"{self.account}:{self.key}"}
        self._proc = subprocess.Popen(
            argv, cwd=self.data_dir, env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"azurite exited {self._proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                self.filesystem().get_file_info("ready-probe")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no Azurite after {START_TIMEOUT} s") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self._proc is None:
            return
        try:
            os.killpg(self._proc.pid, signal.SIGTERM)
            self._proc.wait(5)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._proc = None

    def __enter__(self) -> "AzureServer":
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
