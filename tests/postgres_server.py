"""A PostgreSQL server of the test's own: a fresh cluster in a temporary folder, on a free
loopback port, with a password-authenticated user and database for Dagster's storage.

The server binaries are PostgreSQL's own (``initdb``, ``pg_ctl``, ``postgres``): on ``PATH``, or
where Debian's ``postgresql`` package puts them, ``/usr/lib/postgresql/<version>/bin`` (not on
``PATH``; ``apt-get install -y postgresql`` gives them). PostgreSQL refuses to run as root, so as
root (CI) the cluster belongs to an unprivileged user, ``postgres`` (which Debian's package
creates) or else ``nobody``: its folder is handed to that user, and ``initdb``, ``pg_ctl`` and
the server run with that user's uid and gid (``subprocess``'s ``user``/``group``, no ``su``,
``runuser`` or PAM session involved). The folder is under the system's temporary folder, which
that user can reach (pytest's ``tmp_path`` under ``/tmp/pytest-of-root`` is root's alone)."""

import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

SUPERUSER = "postgres"  # the cluster's bootstrap role; Dagster gets a role of its own
INSTALL_HINT = "apt-get install -y postgresql (as root) gives them"


class PostgresError(RuntimeError):
    """The server could not be set up: what failed, and the server's log where there is one."""


def find_bindir() -> Path:
    """The folder of ``initdb`` and ``pg_ctl``: ``PATH``'s, else the newest
    ``/usr/lib/postgresql/*/bin`` holding both."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        folder = Path(on_path).resolve().parent
        if (folder / "pg_ctl").exists() and (folder / "postgres").exists():
            return folder
    found = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")]
    found = [p for p in found if all((p / b).exists() for b in ("initdb", "pg_ctl", "postgres"))]
    if not found:
        raise PostgresError(
            "PostgreSQL's server binaries (initdb, pg_ctl) are neither on PATH nor under "
            f"/usr/lib/postgresql/*/bin: {INSTALL_HINT}"
        )
    return max(found, key=lambda p: _version(p.parent.name))


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_user() -> pwd.struct_passwd | None:
    """Who runs the cluster: None (this process's user) unless we are root, which PostgreSQL
    refuses; then ``postgres`` if it exists, else ``nobody``."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise PostgresError("running as root, and neither a 'postgres' nor a 'nobody' user exists")


def _reachable_by_others(folder: Path) -> bool:
    """Whether every folder from / down to ``folder`` lets any user pass (o+x)."""
    for part in [folder, *folder.parents]:
        if not os.stat(part).st_mode & stat.S_IXOTH:
            return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead (the postmaster is not our child, but be safe)
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return False


class PostgresServer:
    """``with PostgresServer() as pg:`` a running server; ``pg.env()`` the ``DAGSTER_PG_*``
    variables of its database. Stopped (``pg_ctl stop -m fast``, then SIGKILL to the postmaster
    if it is still there) and its folder deleted on exit."""

    def __init__(self, user: str = "dagster", db: str = "dagster") -> None:
        self.user = user
        self.db = db
        self.password = secrets.token_urlsafe(16)
        self.host = "127.0.0.1"
        self.port = 0
        self.pid: int | None = None
        self.root: Path | None = None
        self._superuser_password = secrets.token_urlsafe(16)
        self._run_as = _server_user()
        self._bindir: Path | None = None

    # -- paths ----------------------------------------------------------------------------
    @property
    def data(self) -> Path:
        return self._root / "data"

    @property
    def log(self) -> Path:
        return self._root / "postgres.log"

    @property
    def _root(self) -> Path:
        if self.root is None:
            raise PostgresError("the server is not started")
        return self.root

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        self._bindir = find_bindir()
        base = Path(tempfile.gettempdir())
        if self._run_as is not None and not _reachable_by_others(base):
            base = Path("/tmp")  # TMPDIR is root's alone: the server's user could not reach it
        self.root = Path(tempfile.mkdtemp(prefix="cdc-postgres-", dir=base))
        sockets = self._root / "sockets"
        sockets.mkdir()
        pwfile = self._root / "superuser.pw"
        pwfile.write_text(self._superuser_password + "\n")
        if self._run_as is not None:
            for path in (self._root, sockets, pwfile):
                os.chown(path, self._run_as.pw_uid, self._run_as.pw_gid)
        self._run(
            "initdb", "-D", str(self.data), "-U", SUPERUSER, f"--pwfile={pwfile}",
            "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip
        pwfile.unlink()
        # A test's server: no durability needed (fsync off), loopback only, its socket here.
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{sockets}'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                "max_connections = 100\n"
            )
        for attempt in range(3):  # a free port may be taken between the look and the bind
            self.port = free_port()
            started = self._run(
                "pg_ctl", "start", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                "-o", f"-p {self.port}", check=False,
            )  # fmt: skip
            if started.returncode == 0:
                break
            if attempt == 2 or "could not bind" not in self._log_text():
                raise PostgresError(
                    f"pg_ctl start failed ({started.returncode}): {started.stdout}\n"
                    f"{self._log_text()[-3000:]}"
                )
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        self._create_role_and_database()

    def _create_role_and_database(self) -> None:
        import psycopg2
        from psycopg2 import sql

        conn = psycopg2.connect(
            host=self.host, port=self.port, user=SUPERUSER,
            password=self._superuser_password, dbname="postgres", connect_timeout=10,
        )  # fmt: skip
        try:
            conn.autocommit = True  # CREATE DATABASE runs outside a transaction
            with conn.cursor() as cur:
                cur.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD %s").format(sql.Identifier(self.user)),
                    [self.password],
                )
                cur.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(self.db), sql.Identifier(self.user)
                    )
                )
        finally:
            conn.close()

    def stop(self) -> None:
        """``pg_ctl stop -m fast``; SIGKILL to the postmaster if it is still running after it;
        then the folder goes. Safe to call twice, or after a failed start."""
        if self.root is None:
            return
        try:
            if self.data.joinpath("postmaster.pid").exists() or self.pid is not None:
                self._run(
                    "pg_ctl", "stop", "-D", str(self.data), "-m", "fast", "-w", "-t", "30",
                    check=False, timeout=60,
                )  # fmt: skip
            if self.pid is not None and _alive(self.pid):
                os.kill(self.pid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while _alive(self.pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
            self.pid = None

    # -- what a test uses -----------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The connection as deploy/dagster-production.yaml reads it."""
        return {
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USER": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
            "DAGSTER_PG_DB": self.db,
        }

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.db}"

    # -- helpers --------------------------------------------------------------------------
    def _log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def _run(
        self, binary: str, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        """A server binary, as the server's user; stdout and stderr together in ``stdout``.
        Its output goes to a file, not a pipe: the postmaster ``pg_ctl start`` leaves behind
        must not hold a pipe we wait on."""
        assert self._bindir is not None
        user: dict[str, Any] = {}
        if self._run_as is not None:
            user = {"user": self._run_as.pw_uid, "group": self._run_as.pw_gid, "extra_groups": []}
        env = {"PATH": f"{self._bindir}:/usr/bin:/bin", "LC_ALL": "C", "TZ": "UTC"}
        with tempfile.TemporaryFile() as out:
            done = subprocess.run(
                [str(self._bindir / binary), *args], stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, cwd=self._root, env=env, timeout=timeout, **user,
            )  # fmt: skip
            out.seek(0)
            text = out.read().decode(errors="replace")
        result = subprocess.CompletedProcess(done.args, done.returncode, text)
        if check and done.returncode:
            raise PostgresError(f"{binary} failed ({done.returncode}): {text[-3000:]}")
        return result
