"""The embedded default backend: a private PostgreSQL cluster in a directory.

The cluster is created with the machine's own PostgreSQL binaries (``initdb``/``pg_ctl``), listens
on 127.0.0.1 only, on a free port, with ``wal_level=logical``, and is reused while it runs. When
this process runs as root the binaries run as the ``postgres`` OS user (PostgreSQL refuses to run
as root), so the cluster directory is handed to that user.

Authentication is ``trust`` for loopback connections: the cluster is a private development and
test default, reachable only from this machine. Production deployments pass ``--backend``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from cache.private_files import DIRECTORY_MODE, SERVER_USER, make_private, make_private_dirs
from sql_ext.errors import EmbeddedBackendError

DEFAULT_DATABASE = "mtcache"
SUPERUSER = "postgres"
SEARCH_DIRS = ("/usr/lib/postgresql",)

INSTALL_HINT = (
    "install the PostgreSQL server binaries (Debian/Ubuntu: `apt-get install postgresql`) "
    "or point mtcache at an existing server with --backend / MTCACHE_BACKEND"
)


def find_pg_bin(search_dirs: Sequence[str] = SEARCH_DIRS) -> Path:
    """The directory holding initdb, pg_ctl and postgres: ``pg_ctl`` on PATH, else the newest
    ``<dir>/<version>/bin`` (Debian's layout)."""
    candidates: list[Path] = []
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for base in search_dirs:
        versions = sorted(
            (p for p in Path(base).glob("*/bin") if p.parent.name.split(".")[0].isdigit()),
            key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)],
            reverse=True,
        )
        candidates.extend(versions)
    for directory in candidates:
        if all((directory / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return directory
    raise EmbeddedBackendError(
        "no PostgreSQL server binaries found (looked for pg_ctl on PATH and under "
        f"{', '.join(d + '/*/bin' for d in search_dirs)}): {INSTALL_HINT}"
    )


def free_port(preferred: int | None = None) -> int:
    """A TCP port free on 127.0.0.1 (``preferred`` if it is)."""
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # PostgreSQL listens with SO_REUSEADDR, so a port whose old connections linger in
            # TIME_WAIT is free for it; probe the same way.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise EmbeddedBackendError("no free TCP port on 127.0.0.1 for the embedded PostgreSQL")


@dataclass(frozen=True)
class ServerSettings:
    """postgresql.conf lines written at initdb time. ``durable=False`` trades crash safety for
    speed (fsync off): right for throw-away test clusters, never for the demo default."""

    durable: bool = True
    max_connections: int = 100
    # pg_stat_statements loaded when the installation has it: `mtcache advise` then also lists
    # what reaches the backend without the cache planning it (its view needs CREATE EXTENSION
    # pg_stat_statements in the database)
    statements: bool = True

    def lines(self, libdir: Path | None = None) -> list[str]:
        lines = [
            "listen_addresses = '127.0.0.1'",
            "unix_socket_directories = ''",
            "wal_level = logical",
            "max_wal_senders = 10",
            "max_replication_slots = 10",
            f"max_connections = {self.max_connections}",
            "timezone = 'UTC'",
            "log_timezone = 'UTC'",
        ]
        if not self.durable:
            lines += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
        if self.statements and libdir is not None and (libdir / "pg_stat_statements.so").exists():
            lines.append("shared_preload_libraries = 'pg_stat_statements'")
        return lines


class EmbeddedPostgres:
    """A private cluster under ``root``: ``root/data`` (PGDATA), ``root/server.log``,
    ``root/port`` (the last port used, preferred on restart)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        bin_dir: str | os.PathLike[str] | None = None,
        settings: ServerSettings | None = None,
        database: str = DEFAULT_DATABASE,
    ) -> None:
        self.root = Path(root).absolute()
        self.data_dir = self.root / "data"
        self.log_file = self.root / "server.log"
        self.port_file = self.root / "port"
        self._bin_dir = Path(bin_dir) if bin_dir is not None else None
        self.settings = settings or ServerSettings()
        self.database = database
        self._as_postgres = os.geteuid() == 0

    # -- public ------------------------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = find_pg_bin()
        for tool in ("initdb", "pg_ctl", "postgres"):
            if not (self._bin_dir / tool).is_file():
                raise EmbeddedBackendError(
                    f"{self._bin_dir} has no `{tool}` binary: {INSTALL_HINT}"
                )
        return self._bin_dir

    def ensure_running(self) -> str:
        """Create the cluster if needed, start it unless it runs, and return the DSN of its
        default database (created on first start)."""
        with self._lock():
            if not (self.data_dir / "PG_VERSION").is_file():
                self._initdb()
            port = self.running_port()
            if port is None:
                port = self._start()
            self._ensure_database(port, self.database)
            return self.dsn(self.database, port)

    def running_port(self) -> int | None:
        """The port of the running server, or None when it is not running."""
        if not (self.data_dir / "postmaster.pid").is_file():
            return None
        status = self._run(["pg_ctl", "status", "-D", str(self.data_dir)], check=False)
        if status.returncode != 0:
            return None
        lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        return int(lines[3]) if len(lines) > 3 and lines[3].strip().isdigit() else None

    def stop(self) -> bool:
        """Stop the server; False when it was not running."""
        with self._lock():
            if self.running_port() is None:
                return False
            self._run(["pg_ctl", "stop", "-D", str(self.data_dir), "-m", "fast", "-w"])
            return True

    def dsn(self, database: str | None = None, port: int | None = None) -> str:
        port = port if port is not None else self.running_port()
        if port is None:
            raise EmbeddedBackendError(
                f"the embedded PostgreSQL under {self.root} is not running: run `mtcache demo` "
                "or any command that needs the backend to start it"
            )
        return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{database or self.database}"

    def create_database(self, name: str) -> str:
        """(Re)create an empty database and return its DSN."""
        port = self.running_port()
        if port is None:
            raise EmbeddedBackendError(f"the embedded PostgreSQL under {self.root} is not running")
        with psycopg.connect(self.dsn("postgres", port), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn(name, port)

    def ensure_database(self, name: str) -> str:
        """The DSN of database ``name``, created (empty) if it is missing, kept if not."""
        port = self.running_port()
        if port is None:
            raise EmbeddedBackendError(f"the embedded PostgreSQL under {self.root} is not running")
        with psycopg.connect(self.dsn("postgres", port), autocommit=True) as conn:
            if (
                conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
                is None
            ):
                with contextlib.suppress(psycopg.errors.DuplicateDatabase):  # made meanwhile
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn(name, port)

    def destroy(self) -> None:
        """Stop the server and delete the whole cluster directory."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- internals ---------------------------------------------------------------------------

    @contextmanager
    def _lock(self) -> Iterator[None]:
        # Two processes starting the same cluster at once would race on initdb / pg_ctl start.
        try:
            make_private_dirs(self.root)
            handle = open(self.root / ".lock", "a+")  # noqa: SIM115 - closed by the with below
            make_private(self.root / ".lock")
        except OSError as exc:
            raise EmbeddedBackendError(
                f"cannot create the embedded PostgreSQL's directory {self.root}: "
                f"{exc.strerror or exc} (choose a writable --cache location, or pass --backend)"
            ) from None
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _command(self, argv: list[str]) -> list[str]:
        argv = [str(self.bin_dir / argv[0]), *argv[1:]]
        if self._as_postgres:
            runuser = shutil.which("runuser")
            if runuser is None:
                raise EmbeddedBackendError(
                    "running as root needs `runuser` (util-linux) to start PostgreSQL as the "
                    "postgres user: install util-linux, or run mtcache as an ordinary user"
                )
            return [runuser, "-u", SERVER_USER, "--", *argv]
        return argv

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        command = self._command(argv)
        result = subprocess.run(
            command, capture_output=True, text=True, cwd="/", stdin=subprocess.DEVNULL, check=False
        )
        if check and result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()
            tail = detail[-1] if detail else f"exit code {result.returncode}"
            log_hint = f" (server log: {self.log_file})" if argv[0] == "pg_ctl" else ""
            raise EmbeddedBackendError(f"`{' '.join(argv[:2])}` failed: {tail}{log_hint}")
        return result

    def _hand_to_postgres_user(self) -> None:
        if not self._as_postgres:
            return
        try:
            user = pwd.getpwnam(SERVER_USER)
        except KeyError:
            raise EmbeddedBackendError(
                "running as root, but there is no `postgres` OS user to run the server as: "
                f"{INSTALL_HINT} (the package creates the user)"
            ) from None
        # initdb makes the data directory the postgres user's own; the rest of root (log, port
        # file) must be writable by it too.
        for path in [self.root, *(p for p in self.root.iterdir() if p != self.data_dir)]:
            os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)
        os.chmod(self.root, DIRECTORY_MODE)  # its own now: no passage for its group
        probe = subprocess.run(
            ["runuser", "-u", SERVER_USER, "--", "test", "-w", str(self.root)],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        if probe.returncode != 0:
            raise EmbeddedBackendError(
                f"the postgres OS user cannot reach {self.root}: make its parent directories "
                "traversable (chmod o+x) or choose another --cache location"
            )

    def _initdb(self) -> None:
        make_private_dirs(self.root)
        if self.data_dir.exists():
            # A half-made data directory (initdb interrupted) is useless; start over.
            shutil.rmtree(self.data_dir)
        self._hand_to_postgres_user()
        self._run(
            [
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-instructions",
            ]
        )
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.write("\n# mtcache embedded backend\n")
            conf.write("\n".join(self.settings.lines(self.bin_dir.parent / "lib")) + "\n")

    def _start(self) -> int:
        preferred = None
        if self.port_file.is_file() and self.port_file.read_text().strip().isdigit():
            preferred = int(self.port_file.read_text().strip())
        port = free_port(preferred)
        self._hand_to_postgres_user()
        self._run(
            [
                "pg_ctl",
                "start",
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-w",
                "-t",
                "60",
                "-o",
                f"-p {port}",
            ]
        )
        self.port_file.write_text(f"{port}\n")
        make_private(self.port_file)
        self._wait_accepting(port)
        return port

    def _wait_accepting(self, port: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn("postgres", port), connect_timeout=2):
                    return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise EmbeddedBackendError(
                        f"the embedded PostgreSQL started but does not accept connections on "
                        f"port {port}: {exc} (server log: {self.log_file})"
                    ) from exc
                time.sleep(0.1)

    def _ensure_database(self, port: int, name: str) -> None:
        with psycopg.connect(self.dsn("postgres", port), autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
