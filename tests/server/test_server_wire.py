"""Where a real client library's behaviour meets the server's protocol: what a session is told
of its backend process, a client encoding set after startup, a statement with no columns, a
backend that ends the session, a pipeline's error before its Sync, COPY through the extended
protocol. Each compared with what PostgreSQL itself sends the same bytes, or does for the
same client."""

from __future__ import annotations

import typing as t
from collections.abc import Iterator

import psycopg
import pytest

from cache.server.options import ServerOptions
from cache.wire import protocol
from tests.serving import Served, messages, quiet, raw_postgres, raw_session, serving, until

BOUND = "-c mtcache.currency_bound=600"
# no process has a pid past Linux's PID_MAX_LIMIT (2^22)
PID_MAX_LIMIT = 4_194_304


@pytest.fixture(scope="module")
def served(bookstore_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(bookstore_dsn, tmp_path_factory.mktemp("wire") / "cache.duckdb", (1, 2)) as found:
        yield found


@pytest.fixture(scope="module")
def pooled(bookstore_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(
        bookstore_dsn,
        tmp_path_factory.mktemp("wire-pooled") / "cache.duckdb",
        (1,),
        ServerOptions(pool_size=2),
    ) as found:
        yield found


def _message(kind: bytes, body: bytes = b"") -> bytes:
    return protocol.message(kind, body)


def _parse(sql: bytes, name: bytes = b"") -> bytes:
    return _message(b"P", name + b"\0" + sql + b"\0\0\0")


def _bind(statement: bytes = b"") -> bytes:
    return _message(b"B", b"\0" + statement + b"\0\0\0\0\0\0\0")


def _execute() -> bytes:
    return _message(b"E", b"\0\0\0\0\0")


SYNC = _message(b"S")


def _both(served: Served, steps: t.Sequence[bytes], options: str | None = None) -> list[t.Any]:
    """What the server (a session with ``options``) and PostgreSQL (a plain session: it has
    no cache settings) answer the same steps, each up to a ReadyForQuery."""
    answers = []
    for sock in (raw_session(served, options), raw_postgres(served)):
        got = []
        for step in steps:
            sock.sendall(step)
            got.append(until(sock, b"Z"))
        sock.close()
        answers.append(got)
    return answers


# -- the backend process a client is told of -----------------------------------------------------


def test_a_session_is_told_no_other_process(served: Served) -> None:
    """A session that has no backend connection of its own yet (it opens one when a statement
    first needs it) is told a process id no process can have, never another's; its own
    notifications carry that id, so a listener knows its own, as with PostgreSQL."""
    with (
        psycopg.connect(served.dsn, autocommit=True) as a,
        psycopg.connect(served.dsn, autocommit=True) as b,
        psycopg.connect(served.backend, autocommit=True) as pg,
    ):
        told = a.info.backend_pid
        assert told >= PID_MAX_LIMIT and told != b.info.backend_pid
        assert pg.execute("SELECT pg_cancel_backend(%s)", [told]).fetchone() == (False,)
        a.execute("LISTEN mine")
        a.execute("NOTIFY mine, 'hello'")
        (note,) = list(a.notifies(timeout=10, stop_after=1))
        assert (note.channel, note.payload, note.pid) == ("mine", "hello", told)
        b.execute("NOTIFY mine, 'other'")
        (other,) = list(a.notifies(timeout=10, stop_after=1))
        assert other.payload == "other" and other.pid != told


def test_a_session_with_its_own_backend_is_told_its_pid(served: Served) -> None:
    """A session whose startup parameters open its backend connection at once is told that
    backend's pid, as PostgreSQL tells it: pg_backend_pid() agrees, and terminating it ends
    the session with PostgreSQL's error."""
    options = "-c DateStyle=SQL,DMY"
    with (
        psycopg.connect(served.dsn, autocommit=True, options=options) as conn,
        psycopg.connect(served.backend, autocommit=True) as pg,
    ):
        told = conn.info.backend_pid
        assert conn.execute("SELECT pg_backend_pid()").fetchone() == (told,)
        assert pg.execute("SELECT pg_terminate_backend(%s)", [told]).fetchone() == (True,)
        with pytest.raises(psycopg.errors.AdminShutdown):
            for _ in range(600):  # (until the backend has gone: the server then ends it)
                conn.execute("SELECT 1")
                pg.execute("SELECT pg_sleep(0.05)")


def test_a_pooled_session_is_told_no_process(pooled: Served) -> None:
    with psycopg.connect(pooled.dsn, autocommit=True) as conn:
        told = conn.info.backend_pid
        assert told >= PID_MAX_LIMIT
        assert conn.execute("SELECT pg_backend_pid() <> %s", [told]).fetchone() == (True,)


# -- the client encoding ---------------------------------------------------------------------------


def test_a_client_encoding_set_after_startup_is_followed(served: Served) -> None:
    """SET client_encoding: statements, parameters, answers (local and the backend's) and
    notices in that encoding, as with PostgreSQL."""
    cached = "SELECT a.name FROM authors a WHERE a.authorid = 1"
    for target in (served.dsn, served.backend):
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute("SET client_encoding TO 'LATIN9'")
            assert conn.info.encoding == "iso8859-15"
            assert conn.execute("SELECT 'é€'::text, %s::text", ["ü"]).fetchone() == ("é€", "ü")
            seen: list[str] = []
            conn.add_notice_handler(lambda d, seen=seen: seen.append(d.message_primary or ""))
            conn.execute("DO $$BEGIN RAISE NOTICE 'é€'; END$$")
            assert seen == ["é€"]
            if target == served.dsn:
                conn.execute("SET mtcache.currency_bound = 600")
            row = conn.execute(cached).fetchone()
            assert row is not None and isinstance(row[0], str)


def test_an_encoding_the_server_cannot_read_is_refused_and_the_session_goes_on(
    served: Served,
) -> None:
    """A client encoding Python has no codec for (EUC_TW): the SET is refused with an error
    that says so, and the session goes on in its encoding; never a session left hanging."""
    sock = raw_session(served)
    sock.settimeout(60)
    sock.sendall(_message(b"Q", b"SET client_encoding TO 'EUC_TW'\0"))
    answer = until(sock, b"Z")
    kinds = [kind for kind, _ in answer]
    assert kinds[0] == b"E" and kinds[-1] == b"Z", kinds
    assert b"C0A000" in answer[0][1] and b"EUC_TW" in answer[0][1]
    sock.sendall(_message(b"Q", b"SHOW client_encoding\0"))
    shown = until(sock, b"Z")
    assert (b"D", b"\0\x01\0\0\0\x04UTF8") in shown
    sock.close()


# -- a statement without columns -----------------------------------------------------------------


@pytest.mark.parametrize("options", [None, BOUND], ids=["plain", "session bound"])
def test_a_statement_without_columns_is_described_as_postgresql(
    served: Served, options: str | None
) -> None:
    """`SELECT` with no target list returns rows of no columns: Describe answers a
    RowDescription of 0 fields (not NoData), and its rows follow."""
    steps = [
        _parse(b"select")
        + _message(b"D", b"S\0")
        + _bind()
        + _message(b"D", b"P\0")
        + _execute()
        + SYNC
    ]
    server, postgres = _both(served, steps, options)
    assert server == postgres
    with psycopg.connect(served.dsn, autocommit=True, options=options) as conn:
        assert conn.execute("select", prepare=True).fetchall() == [()]


# -- the backend ends the session ----------------------------------------------------------------


def test_a_backend_that_ends_the_session_ends_the_clients_as_postgresql(served: Served) -> None:
    """pg_terminate_backend of the session's own backend: the client gets the backend's
    FATAL (57P01) last and the connection closes, with no ReadyForQuery after it and no
    error of the server's own. (The row PostgreSQL sends before its FATAL, which libpq drops
    with the failed result, may not come: a client sees the error alike.)"""
    sql = b"SELECT pg_terminate_backend(pg_backend_pid())\0"
    answers = []
    for sock in (raw_session(served), raw_postgres(served)):
        sock.settimeout(60)
        sock.sendall(_message(b"Q", sql))
        answers.append(list(messages(sock)))  # (until the connection closes)
        sock.close()
    for answer in answers:
        kinds = [kind for kind, _ in answer]
        assert kinds[-1:] == [b"E"] and kinds.count(b"E") == 1 and b"Z" not in kinds, kinds
        assert b"C57P01" in answer[-1][1] and b"VFATAL" in answer[-1][1]
    for target in (served.dsn, served.backend):
        with psycopg.connect(target) as conn:
            with pytest.raises(psycopg.errors.AdminShutdown):
                conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            assert conn.closed


# -- a pipeline's error before its Sync ----------------------------------------------------------


def test_a_pipeline_error_arrives_before_the_sync(served: Served) -> None:
    """A pipeline of three statements, no Sync or Flush yet, the third failing: PostgreSQL
    sends what it has, the error last, at once; the server does too (a client waiting for
    the error would otherwise wait for ever)."""
    steps = (
        _parse(b"SELECT 1", b"a")
        + _bind(b"a")
        + _execute()
        + _parse(b"SELECT 2", b"b")
        + _bind(b"b")
        + _execute()
        # (failing as it runs: a constant 1 / 0 fails at Bind, folded by the planner, where
        # the server's message-by-message path has answered BindComplete itself)
        + _parse(b"SELECT 1 / (random() * 0)::int", b"c")
        + _bind(b"c")
        + _execute()
    )
    answers = []
    for sock in (raw_session(served), raw_postgres(served)):
        sock.settimeout(30)
        sock.sendall(steps)
        before = until(sock, b"E")  # (no Sync sent: the error must come by itself)
        sock.sendall(SYNC)
        answers.append((before, until(sock, b"Z")))
        sock.close()
    assert answers[0] == answers[1]
    assert b"C22012" in answers[0][0][-1][1]


# -- COPY through the extended protocol ----------------------------------------------------------


def test_copy_runs_through_the_extended_protocol(served: Served) -> None:
    """COPY TO STDOUT and FROM STDIN sent as Parse, Bind, Execute: PostgreSQL runs them, and
    so does the server (its answers are PostgreSQL's, byte for byte)."""
    with psycopg.connect(served.backend, autocommit=True) as pg:
        pg.execute("DROP TABLE IF EXISTS copied")
        pg.execute("CREATE TABLE copied (n integer, t text)")
    copy_out = b"COPY (SELECT n, n::text FROM generate_series(1, 3) n) TO STDOUT"
    out = [_parse(copy_out) + _bind() + _execute() + SYNC]
    server, postgres = _both(served, out)
    assert server == postgres
    assert [kind for kind, _ in server[0]].count(b"d") == 3
    copy_in = _parse(b"COPY copied FROM STDIN") + _bind() + _execute()
    rows = _message(b"d", b"1\tone\n2\ttwo\n") + _message(b"c") + SYNC
    answers = []
    for sock in (raw_session(served), raw_postgres(served)):
        sock.settimeout(60)
        sock.sendall(copy_in)
        started = until(sock, b"G")
        sock.sendall(rows)
        answers.append((started, until(sock, b"Z")))
        sock.close()
    assert answers[0] == answers[1]
    with psycopg.connect(served.backend, autocommit=True) as pg:
        assert pg.execute("SELECT count(*) FROM copied").fetchone() == (4,)
    quiet(served)
