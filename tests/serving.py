"""An in-process cache server for the tests that drive it with real clients."""

from __future__ import annotations

import dataclasses
import re
import signal
import socket
import struct
import subprocess
import threading
import time
import typing as t
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

import cache
from cache.engine.engine import Engine
from cache.server.counters import ServerCounter
from cache.server.options import ServerOptions
from cache.server.server import Server
from cache.wire import protocol
from tests.schemas import AUTHORS_AND_BOOKS


class Served(t.NamedTuple):
    engine: Engine
    server: Server
    dsn: str  # the server's
    backend: str  # PostgreSQL's

    @property
    def host(self) -> str:
        return str(self.server.address[0])

    @property
    def port(self) -> int:
        return int(self.server.address[1])

    @property
    def dbname(self) -> str:
        return str(psycopg.conninfo.conninfo_to_dict(self.backend)["dbname"])


LOG_WAIT = 60.0  # seconds a line of a server's log may take to come, at most


class Log:
    """A server's stderr, read in a thread; `wait_for` a line matching a pattern."""

    def __init__(self, stream: t.IO[str]) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: t.IO[str]) -> None:
        for line in iter(stream.readline, ""):
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # (the end)
            self._changed.notify_all()

    def close(self) -> None:
        self._thread.join(60)

    def wait_for(self, pattern: str) -> str:
        deadline = time.monotonic() + LOG_WAIT
        with self._changed:
            while True:
                found = [line for line in self.lines if re.search(pattern, line)]
                if found:
                    return found[0]
                assert "" not in self.lines, f"the server stopped: {''.join(self.lines)}"
                left = deadline - time.monotonic()
                assert left > 0, f"no line matching {pattern!r} in {''.join(self.lines)}"
                self._changed.wait(left)


class Serving(t.NamedTuple):
    """A `mtcache serve` process started by `serve_process`."""

    log: Log
    port: int  # where it listens
    metrics: str  # its metrics endpoint's base URL ("" without --metrics)


@contextmanager
def serve_process(argv: list[str], env: dict[str, str]) -> Iterator[Serving]:
    """`mtcache serve` as a process (``argv``), once it listens; stopped with SIGTERM after
    the block, which must end it with exit 0."""
    process = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    log = Log(process.stderr)
    try:
        line = log.wait_for("listening on")
        port = int(re.search(r"listening on \S+:(\d+) ", line).group(1))  # type: ignore[union-attr]
        metrics = re.search(r"metrics on (http://\S+)/metrics", line)
        yield Serving(log, port, metrics.group(1) if metrics else "")
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(60)
        log.close()
        process.stderr.close()
    assert code == 0, "".join(log.lines)


@contextmanager
def server_of(
    backend: str, cache_path: Path, options: ServerOptions | None = None, **engine_options: t.Any
) -> Iterator[Served]:
    """A server on a free loopback port over the cache file ``cache_path`` (created empty when
    missing), run in a thread of this process (``options``: its listen address and grace
    period are the tests'; ``engine_options``: the `Engine`'s)."""
    engine = Engine(backend, cache_path, **engine_options)
    options = dataclasses.replace(options or ServerOptions(), listen="127.0.0.1:0", grace_seconds=2)
    server = Server(engine, options)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.address
    dbname = psycopg.conninfo.conninfo_to_dict(backend)["dbname"]
    dsn = f"host={host} port={port} user=postgres dbname={dbname}"
    try:
        yield Served(engine, server, dsn, backend)
    finally:
        server.shutdown()
        thread.join(30)
        engine.close()


@contextmanager
def serving(
    backend: str,
    cache_path: Path,
    authors: t.Sequence[int],
    options: ServerOptions | None = None,
    numbers: bool = False,
    **engine_options: t.Any,
) -> Iterator[Served]:
    """A server (`server_of`) over a cache of AUTHORS_AND_BOOKS, ``authors`` admitted (and
    the numbers, `cache_numbers`). With a statement timeout in ``options`` the cache is built
    in this process before the server starts: its limits are not for the tests' setup (a
    cold refresh may take longer than a test's short timeout)."""
    statements = [
        AUTHORS_AND_BOOKS,
        f"INSERT INTO authorlist_pct VALUES {', '.join(f'({a})' for a in authors)}",
    ]
    if numbers:
        statements += NUMBERCOPY
    before = options is not None and options.limits.statement_timeout is not None
    if before:
        with cache.connect(
            backend=backend, cache_path=cache_path, autocommit=True, background=False
        ) as conn:
            conn.admin.apply_ddl(statements[0])  # (a script: the cursor takes one statement)
            cur = conn.cursor()
            for statement in statements[1:]:
                cur.execute(statement)
    with server_of(backend, cache_path, options, **engine_options) as served:
        if not before:
            with psycopg.connect(served.dsn, autocommit=True) as conn:
                for statement in statements:
                    conn.execute(statement)
        yield served


def relayed_runs(served: Served) -> int:
    """The prepared runs the server's loop passed through, byte for byte or not."""
    counters = served.server.counters
    return counters[ServerCounter.RELAYED] + counters[ServerCounter.RELAYED_RAW]


# a local statement that runs for minutes unless cancelled: 2,000^3 combinations in DuckDB,
# each hashed (a test DuckDB's statistics cannot decide in advance), over `with_numbers`
SLOW_LOCAL = (
    "SELECT count(*) FROM numbers a, numbers b, numbers c "
    "WHERE md5((a.n * b.n + c.n)::text) = 'x' CURRENCY BOUND 10 MIN"
)


def numbers_table(backend: str) -> None:
    """The backend table `SLOW_LOCAL` reads: 2,000 numbers (made again)."""
    with psycopg.connect(backend, autocommit=True) as pg:
        pg.execute("DROP TABLE IF EXISTS numbers")
        pg.execute("CREATE TABLE numbers (n integer PRIMARY KEY)")
        pg.execute("INSERT INTO numbers SELECT generate_series(1, 2000)")


NUMBERCOPY = [
    "CREATE CACHED VIEW numbercopy AS SELECT n FROM numbers REFRESH EVERY 10 MIN",
    "REFRESH CACHED VIEW numbercopy",
]


def cache_numbers(served: Served) -> None:
    """The numbers cached whole on the server, so `SLOW_LOCAL` runs locally."""
    with psycopg.connect(served.dsn, autocommit=True) as conn:
        for statement in NUMBERCOPY:
            conn.execute(statement)


def raw_session(served: Served, options: str | None = None) -> socket.socket:
    """A socket that has gone through startup with the server (user postgres, its database,
    ``options``) and read up to its first ReadyForQuery: for tests that speak the protocol
    byte by byte."""
    return raw_session_keyed(served, options)[0]


def raw_session_keyed(served: Served, options: str | None = None) -> tuple[socket.socket, int]:
    """`raw_session`, with the process id its BackendKeyData gave (`Server.session_of`)."""
    return _started_keyed(served.server.address, served.dbname, options)


def raw_postgres(served: Served) -> socket.socket:
    """As `raw_session`, with the server's backend itself: what PostgreSQL answers the same
    bytes."""
    found = psycopg.conninfo.conninfo_to_dict(served.backend)
    return _started((str(found["host"]), int(str(found["port"]))), served.dbname, None)


def _started(address: tuple[str, int], dbname: str, options: str | None) -> socket.socket:
    return _started_keyed(address, dbname, options)[0]


def _started_keyed(
    address: tuple[str, int], dbname: str, options: str | None
) -> tuple[socket.socket, int]:
    sock = socket.create_connection(address, timeout=60)
    body = (
        struct.pack("!i", protocol.PROTOCOL_3_0)
        + b"user\0postgres\0database\0"
        + dbname.encode()
        + b"\0"
    )
    if options:
        body += b"options\0" + options.encode() + b"\0"
    sock.sendall(struct.pack("!i", len(body) + 5) + body + b"\0")
    seen = b""
    while not seen.endswith(protocol.ready_for_query(b"I")):
        data = sock.recv(65536)
        assert data, "the server closed the connection at startup"
        seen += data
    at, pid = 0, 0
    while at < len(seen):  # (the messages up to ReadyForQuery: BackendKeyData among them)
        length = int.from_bytes(seen[at + 1 : at + 5], "big")
        if seen[at : at + 1] == b"K":
            pid = int.from_bytes(seen[at + 5 : at + 9], "big")
        at += 1 + length
    return sock, pid


def messages(sock: socket.socket) -> Iterator[tuple[bytes, bytes]]:
    """The server's messages on a raw session, as (type, body), until it closes."""
    buffer = b""
    while True:
        while len(buffer) < 5 or len(buffer) < 1 + struct.unpack("!i", buffer[1:5])[0]:
            data = sock.recv(65536)
            if not data:
                return
            buffer += data
        length = struct.unpack("!i", buffer[1:5])[0]
        yield buffer[:1], buffer[5 : 1 + length]
        buffer = buffer[1 + length :]


def until(sock: socket.socket, kind: bytes) -> list[tuple[bytes, bytes]]:
    """The server's messages on a raw session up to the first of type ``kind``."""
    seen = []
    for message in messages(sock):
        seen.append(message)
        if message[0] == kind:
            return seen
    return seen


def quiet(served: Served) -> None:
    """Until no session of the server is answered by a worker: a client may have its answer
    before the worker has let go of the session, and a run arriving meanwhile waits its turn
    instead of being answered by the event loop."""
    while not served.server.quiet():
        time.sleep(0.001)
