"""Sessions of `mtcache serve` side by side: a slow remote statement does not hold up another
session's hit, a CancelRequest stops a local (DuckDB) or a remote statement, a client that dies
mid-statement or breaks the protocol takes nobody else down and the cache loses nothing,
hundreds of sessions at once, and SIGTERM with statements still running. No step waits on a
clock: each waits for a state it can see (the backend's pg_stat_activity, the server's own
count of running statements)."""

from __future__ import annotations

import concurrent.futures as cf
import functools
import os
import resource
import signal
import socket
import struct
import subprocess
import time
import typing as t
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from cache.server.counters import ServerCounter
from cache.server.process import serving_process
from cache.store.counters import Counter
from cache.wire import protocol
from tests.answers import typed
from tests.serving import (
    SLOW_LOCAL,
    Served,
    cache_numbers,
    numbers_table,
    quiet,
    raw_session,
    raw_session_keyed,
    relayed_runs,
    serving,
)

BOUND = "-c mtcache.currency_bound=600"
BOOKS = "SELECT isbn, title, price, authorid FROM books WHERE authorid = %s ORDER BY isbn"


@pytest.fixture(scope="module")
def served(bookstore_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    numbers_table(bookstore_dsn)
    with serving(
        bookstore_dsn, tmp_path_factory.mktemp("sessions") / "cache.duckdb", (1, 2)
    ) as found:
        cache_numbers(found)
        yield found


@pytest.fixture(autouse=True)
def _earlier_sessions_ended(served: Served) -> None:
    """Each test starts once the sessions of the tests before it have ended (a client that
    closed its connection has its session ended by the server a moment later): the tests
    that count sessions count their own."""
    _wait_for(lambda: served.server.sessions() == 0, "the earlier tests' sessions ended")


def _ended(served: Served, pid: int) -> bool:
    """Whether the session of the client whose BackendKeyData gave ``pid`` has ended."""
    return served.server.session_of(pid) is None


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    """Until ``condition`` holds (a state the test can see), checked every few ms; the limit
    is only there to fail rather than hang."""
    deadline = time.monotonic() + 120
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def _sleeping_at_backend(pg: psycopg.Connection[t.Any]) -> bool:
    found = pg.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
        "AND query LIKE '%pg_sleep(600)%' AND pid <> pg_backend_pid()"
    ).fetchone()
    return bool(found and found[0])


def _hits_right(
    served: Served, conn: psycopg.Connection[t.Any], pg: psycopg.Connection[t.Any], author: int
) -> None:
    """A cached read on ``conn``: PostgreSQL's answer, and from the cache."""
    got = conn.execute(BOOKS, [author]).fetchall()
    assert typed(got) == typed(pg.execute(BOOKS, [author]).fetchall())
    routes = [row[1] for row in conn.execute("EXPLAIN LAST STATEMENT").fetchall()]
    assert routes == ["local"], routes


def test_a_slow_remote_statement_never_blocks_another_sessions_hit(served: Served) -> None:
    with (
        psycopg.connect(served.dsn, autocommit=True) as slow,
        psycopg.connect(served.dsn, options=BOUND, autocommit=True) as fast,
        psycopg.connect(served.backend, autocommit=True) as pg,
        cf.ThreadPoolExecutor(1) as pool,
    ):
        running = pool.submit(slow.execute, "SELECT pg_sleep(600)")
        _wait_for(lambda: _sleeping_at_backend(pg), "the slow statement running")
        hits = served.engine.counters()[Counter.HITS]
        for round_ in range(20):
            _hits_right(served, fast, pg, 1 + round_ % 2)
        assert served.engine.counters()[Counter.HITS] >= hits + 20
        assert not running.done()  # all the hits came while it still ran
        slow.cancel_safe()
        with pytest.raises(psycopg.errors.QueryCanceled):
            running.result(timeout=120)
        assert slow.execute("SELECT 1").fetchone() == (1,)


def test_cancel_request_stops_a_local_statement(served: Served) -> None:
    with (
        psycopg.connect(served.dsn, autocommit=True) as conn,
        psycopg.connect(served.dsn, options=BOUND, autocommit=True) as other,
        psycopg.connect(served.backend, autocommit=True) as pg,
        cf.ThreadPoolExecutor(1) as pool,
    ):
        plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {SLOW_LOCAL}").fetchall())
        assert "LocalQuery (engine=duckdb, sql=SELECT COUNT(*) FROM numbercopy" in plan, plan
        running = pool.submit(conn.execute, SLOW_LOCAL)
        _wait_for(lambda: served.server.running() >= 1, "the local statement running")
        conn.cancel_safe()
        with pytest.raises(psycopg.errors.QueryCanceled) as caught:
            running.result(timeout=120)
        assert caught.value.diag.sqlstate == "57014"
        # the session goes on, and so does everyone else, with the same answers
        assert conn.execute("SELECT count(*) FROM numbers CURRENCY BOUND 10 MIN").fetchone() == (
            2000,
        )
        _hits_right(served, other, pg, 1)


@pytest.mark.parametrize("prepared", [False, True], ids=["unprepared", "prepared"])
def test_cancel_request_stops_a_remote_statement(served: Served, prepared: bool) -> None:
    with (
        psycopg.connect(served.dsn, autocommit=True) as conn,
        psycopg.connect(served.backend, autocommit=True) as pg,
        cf.ThreadPoolExecutor(1) as pool,
    ):
        if prepared:  # (a prepared statement's second run: the event loop relays it)
            sql = "SELECT pg_sleep(600) WHERE %s"
            assert conn.execute(sql, [False], prepare=True).fetchall() == []
            quiet(served)  # (the worker that parsed it has let go of the session)
            running = pool.submit(conn.execute, sql, [True], prepare=True)
        else:
            running = pool.submit(conn.execute, "SELECT pg_sleep(600)")
        _wait_for(lambda: _sleeping_at_backend(pg), "the remote statement running")
        conn.cancel_safe()
        with pytest.raises(psycopg.errors.QueryCanceled):
            running.result(timeout=120)
        assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("when", ["relayed raw", "relayed in a block", "by a worker", "idle"])
def test_a_session_whose_backend_connection_is_lost_ends(served: Served, when: str) -> None:
    """The backend ends a session's backend connection (pg_terminate_backend, as a restart
    would) while a statement runs there, or while the session is idle: the client gets the
    error and the server ends the session, as PostgreSQL ends it, rather than running the
    client's next statements in another backend session without its prepared statements,
    settings and transaction. Other sessions go on."""
    sql = "SELECT pg_sleep(600) WHERE %s"
    with (
        psycopg.connect(served.dsn, autocommit=True) as conn,
        psycopg.connect(served.dsn, autocommit=True, options=BOUND) as other,
        psycopg.connect(served.backend, autocommit=True) as pg,
        cf.ThreadPoolExecutor(1) as pool,
    ):
        assert conn.execute(sql, [False], prepare=True).fetchall() == []
        quiet(served)  # (the worker that parsed it has let go of the session)
        session = served.server.session_of(conn.info.backend_pid)
        backend = session.link.if_open() if session is not None else None
        assert backend is not None
        pid = backend.info.backend_pid
        raw = served.server.counters[ServerCounter.RELAYED_RAW]
        if when == "idle":
            pg.execute("SELECT pg_terminate_backend(%s)", [pid])
            _wait_for(
                lambda: served.server.session_of(conn.info.backend_pid) is None, "the session ended"
            )
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
        else:
            if when == "relayed in a block":
                conn.execute("BEGIN")
                quiet(served)
            # (a run with its Parse goes to a worker, a prepared statement's run is relayed)
            running = pool.submit(conn.execute, sql, [True], prepare=when != "by a worker")
            _wait_for(lambda: _sleeping_at_backend(pg), "the remote statement running")
            pg.execute("SELECT pg_terminate_backend(%s)", [pid])
            with pytest.raises(psycopg.OperationalError, match="terminating connection"):
                running.result(timeout=120)
            assert served.server.counters[ServerCounter.RELAYED_RAW] - raw == (
                1 if when == "relayed raw" else 0
            )
            with pytest.raises(psycopg.OperationalError):
                conn.execute(sql, [False], prepare=True)
        assert conn.closed
        _hits_right(served, other, pg, 1)
        assert other.execute("SELECT count(*) FROM numbers").fetchone() == (2000,)
    with psycopg.connect(served.dsn, autocommit=True) as again:
        assert again.execute(sql, [False], prepare=True).fetchall() == []
        assert again.execute(sql, [False], prepare=True).fetchall() == []


def _views(conn: psycopg.Connection[t.Any]) -> list[tuple[t.Any, ...]]:
    """SHOW CACHED VIEWS without the ages (which grow as the test runs)."""
    cur = conn.execute("SHOW CACHED VIEWS")
    age = [d.name for d in cur.description or []].index("currency_seconds")
    return [row[:age] + row[age + 1 :] for row in cur.fetchall()]


def test_a_statement_whose_client_is_gone_before_it_starts_is_cancelled(served: Served) -> None:
    """The client sends a statement and is reset at once, before a worker has started it (or
    before the backend has it): the statement is cancelled all the same, as one running when
    its client went away, and the session ends."""
    with psycopg.connect(served.backend, autocommit=True) as pg:
        for _ in range(3):
            sock, pid = raw_session_keyed(served, BOUND)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.sendall(protocol.message(b"Q", b"SELECT pg_sleep(600)\0"))
            sock.close()
            _wait_for(functools.partial(_ended, served, pid), "the session ended")
            _wait_for(lambda: not _sleeping_at_backend(pg), "its backend statement ended")


@pytest.mark.parametrize("when", ["local", "remote", "in-transaction", "relayed"])
def test_a_client_killed_mid_statement_takes_nobody_else_down(served: Served, when: str) -> None:
    """The client sends a statement and vanishes (its socket reset): the server ends that
    session (its backend statement cancelled, its transaction rolled back), the others go on
    and the cache is as it was."""
    with (
        psycopg.connect(served.backend, autocommit=True) as pg,
        psycopg.connect(served.dsn, options=BOUND, autocommit=True) as other,
    ):
        before = pg.execute("SELECT count(*) FROM books").fetchone()
        views = _views(other)
        sessions = served.server.sessions()
        # (with no bound a SELECT passes through: prepared, the event loop relays its runs)
        sock = raw_session(served, None if when == "relayed" else BOUND)
        assert served.server.sessions() == sessions + 1
        if when == "local":
            sql = SLOW_LOCAL
        elif when in ("remote", "relayed"):
            sql = "SELECT pg_sleep(600)"
        else:
            sql = (
                "BEGIN; INSERT INTO books (isbn, authorid, title, publisherid, type, price) "
                "VALUES ('killed-1', 1, 'k', 1, 'x', 1); SELECT pg_sleep(600)"
            )
        if when == "relayed":  # a prepared run the event loop passes through
            sock.sendall(
                protocol.message(b"P", b"s\0" + sql.encode() + b"\0\0\0") + protocol.message(b"S")
            )
            seen = b""
            while not seen.endswith(protocol.ready_for_query(b"I")):
                seen += sock.recv(65536)
            quiet(served)  # (the worker that parsed it has let go of the session)
            relayed = relayed_runs(served)
            sock.sendall(
                protocol.message(b"B", b"\0s\0\0\0\0\0\0\0")
                + protocol.message(b"E", b"\0\0\0\0\0")
                + protocol.message(b"S")
            )
        else:
            sock.sendall(protocol.message(b"Q", sql.encode() + b"\0"))
        if when == "local":
            _wait_for(lambda: served.server.running() >= 1, "the statement running")
        else:
            _wait_for(lambda: _sleeping_at_backend(pg), "the statement running at the backend")
        if when == "relayed":
            assert relayed_runs(served) == relayed + 1
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset, as from a client killed with SIGKILL
        _wait_for(lambda: served.server.sessions() == sessions, "the session ended")
        _wait_for(lambda: not _sleeping_at_backend(pg), "its backend statement ended")
        assert pg.execute("SELECT count(*) FROM books").fetchone() == before
        assert _views(other) == views
        _hits_right(served, other, pg, 2)


@pytest.mark.parametrize(
    "garbage",
    [
        b"Y\0\0\0\x04",  # an unknown message type
        b"P\0\0\0\x05x",  # a truncated Parse (no terminators)
        b"Q\xff\xff\xff\xff",  # a negative length
        b"B\0\0\0\x0a\0\0\0\x05\0\0",  # a Bind with more parameter formats than it carries
        b"Q\0\0\0\x09SEL",  # a message cut short: the client then goes away
    ],
    ids=["unknown-type", "truncated", "bad-length", "bad-bind", "cut-short"],
)
def test_a_broken_message_closes_only_its_session(served: Served, garbage: bytes) -> None:
    with (
        psycopg.connect(served.backend, autocommit=True) as pg,
        psycopg.connect(served.dsn, options=BOUND, autocommit=True) as other,
    ):
        views = _views(other)
        sessions = served.server.sessions()
        sock = raw_session(served, BOUND)
        sock.sendall(garbage)
        if garbage.startswith(b"Q\0\0\0\x09"):
            sock.shutdown(socket.SHUT_WR)
        said = b""
        while data := sock.recv(65536):
            said += data
        sock.close()
        if not garbage.startswith(b"Q\0\0\0\x09"):
            assert said[:1] == b"E" and b"C08P01" in said, said  # a protocol violation
        _wait_for(lambda: served.server.sessions() == sessions, "the session ended")
        assert _views(other) == views
        _hits_right(served, other, pg, 1)


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def _messages(data: bytes) -> list[tuple[bytes, bytes]]:
    """A backend's answer cut into (type, body) pairs."""
    found, pos = [], 0
    while pos < len(data):
        length = struct.unpack_from("!i", data, pos + 1)[0]
        found.append((data[pos : pos + 1], data[pos + 5 : pos + 1 + length]))
        pos += 1 + length
    return found


def test_a_client_that_does_not_read_holds_only_itself_up(served: Served) -> None:
    """A client pipelines a 20 MB result (more than the sockets hold), 2,000 executions of a
    cached lookup and the 20 MB again, reading nothing: its statement waits for it to read
    (running, the server holding no more than it must), another session's hits are answered
    meanwhile; then it gets every answer, complete and in order."""
    with (
        psycopg.connect(served.backend, autocommit=True) as pg,
        psycopg.connect(served.dsn, options=BOUND, autocommit=True) as other,
    ):
        rows = {a: len(pg.execute(BOOKS, [a]).fetchall()) for a in (1, 2)}
        big = _message(b"Q", b"SELECT repeat('x', 1000) FROM generate_series(1, 20000)\0")
        sql = BOOKS.replace("%s", "$1").encode()
        runs = 2000
        pipeline = [big, _message(b"P", b"s\0" + sql + b"\0\0\0"), _message(b"S", b"")]
        for i in range(runs):
            key = str(1 + i % 2).encode()
            pipeline += [
                _message(b"B", b"\0s\0\0\0\0\1" + struct.pack("!i", len(key)) + key + b"\0\0"),
                _message(b"D", b"P\0"),
                _message(b"E", b"\0\0\0\0\0"),
                _message(b"S", b""),
            ]
        pipeline.append(big)
        running = served.server.running()
        sock = raw_session(served, BOUND)
        with cf.ThreadPoolExecutor(1) as sender:
            sent = sender.submit(sock.sendall, b"".join(pipeline))
            # the first 20 MB cannot all be sent: its statement waits for the client
            _wait_for(lambda: served.server.running() > running, "the statement running")
            for author in (1, 2, 1):  # another session, meanwhile
                _hits_right(served, other, pg, author)
            ready = protocol.ready_for_query(b"I")
            chunks, readies, tail = [], 0, b""
            while readies < runs + 3:
                data = sock.recv(1 << 20)
                assert data, "the server closed the connection"
                readies += (tail + data).count(ready)  # (one may straddle two chunks)
                tail = data[-(len(ready) - 1) :]
                chunks.append(data)
            sent.result()
        sock.close()
        answers = _messages(b"".join(chunks))

        def whole_big_result(at: int) -> int:
            """Where the answer to ``big`` starting at ``at`` ends (checked whole)."""
            end = at + 1 + 20000 + 2
            assert answers[at][0] == b"T"
            assert all(
                kind == b"D" and len(body) == 2 + 4 + 1000
                for kind, body in answers[at + 1 : end - 2]
            )
            assert answers[end - 2 : end] == [(b"C", b"SELECT 20000\0"), (b"Z", b"I")]
            return end

        pos = whole_big_result(0)
        assert [kind for kind, _ in answers[pos : pos + 2]] == [b"1", b"Z"]
        pos += 2
        for i in range(runs):
            expect = [b"2", b"T"] + [b"D"] * rows[1 + i % 2] + [b"C", b"Z"]
            kinds = [kind for kind, _ in answers[pos : pos + len(expect)]]
            assert kinds == expect, (i, kinds)
            pos += len(expect)
        assert whole_big_result(pos) == len(answers)


def test_hundreds_of_sessions_at_once(served: Served) -> None:
    """300 sessions open together, each reading a cached answer (no backend connection
    needed for that), 20 of them also a statement passed through (which opens one)."""
    with psycopg.connect(served.backend, autocommit=True) as pg:
        want = {a: typed(pg.execute(BOOKS, [a]).fetchall()) for a in (1, 2)}
        held = _server_backends(pg)
        conns = [psycopg.connect(served.dsn, options=BOUND, autocommit=True) for _ in range(300)]
        try:
            assert served.server.sessions() >= 300

            def read(k: int) -> bool:
                conn = conns[k]
                got = typed(conn.execute(BOOKS, [1 + k % 2]).fetchall())
                if k % 15 == 0:
                    assert conn.execute("SELECT count(*) FROM pg_stat_activity").fetchone()
                return got == want[1 + k % 2]

            with cf.ThreadPoolExecutor(16) as pool:
                assert all(pool.map(read, range(len(conns))))
            # the sessions that needed one, and the engine's few shared ones (descriptions of
            # statements, the catalog): nothing like one per session
            assert 20 <= _server_backends(pg) - held < 30
        finally:
            for conn in conns:
                conn.close()


def test_sessions_past_descriptor_1024(served: Served) -> None:
    """A server with hundreds of sessions has file descriptors past 1024 (select's limit):
    waiting on a backend connection numbered so works."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard), hard))
    spare: list[int] = []
    try:
        while (fd := os.open(os.devnull, os.O_RDONLY)) < 1100:
            spare.append(fd)
        spare.append(fd)
        with (
            psycopg.connect(served.dsn, autocommit=True) as conn,
            psycopg.connect(served.dsn, options=BOUND, autocommit=True) as bound,
            psycopg.connect(served.backend, autocommit=True) as pg,
        ):
            _hits_right(served, bound, pg, 1)
            assert (
                conn.execute("SELECT count(*) FROM books").fetchone()
                == pg.execute("SELECT count(*) FROM books").fetchone()
            )
    finally:
        for fd in spare:
            os.close(fd)


def _server_backends(pg: psycopg.Connection[t.Any]) -> int:
    """Backend connections open for sessions of a cache server (not the test's own)."""
    found = pg.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client "
        "backend' AND pid <> pg_backend_pid() AND client_port IS NOT NULL "
        "AND application_name = ''"
    ).fetchone()
    return int(found[0]) if found else 0


def test_sigterm_cancels_what_outlives_the_grace(
    bookstore_dsn: str, mtcache_bin: str, tmp_path: Path
) -> None:
    """SIGTERM: no new sessions; a statement that runs longer than the grace period is
    cancelled (57014 or the connection's end), then the server closes the file and exits 0."""
    cache_path = tmp_path / "cache.duckdb"
    with (
        open(tmp_path / "server.log", "ab") as log,
        serving_process(bookstore_dsn, cache_path, "--grace", "1", log=log) as where,
        psycopg.connect(bookstore_dsn, autocommit=True) as pg,
        cf.ThreadPoolExecutor(1) as pool,
    ):
        dsn = f"host={where.host} port={where.port} user=postgres dbname={where.database}"
        conn = psycopg.connect(dsn, autocommit=True)
        running = pool.submit(conn.execute, "SELECT pg_sleep(600)")
        _wait_for(lambda: _sleeping_at_backend(pg), "the statement running")
        os.kill(where.pid, signal.SIGTERM)
        with pytest.raises(
            (psycopg.errors.QueryCanceled, psycopg.errors.AdminShutdown, psycopg.OperationalError)
        ):
            running.result(timeout=120)
        conn.close()
        _wait_for(lambda: not _process_alive(where.pid), "the server exited")
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(dsn, connect_timeout=5)
        _wait_for(lambda: not _sleeping_at_backend(pg), "its backend statement ended")
    said = (tmp_path / "server.log").read_text()
    assert "cancelling a statement still running at shutdown" in said, said
    # the file is whole and free: another process opens it
    run = subprocess.run(
        [mtcache_bin, "--backend", bookstore_dsn, "--cache", str(cache_path), "status", "--json"],
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
