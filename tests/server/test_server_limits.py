"""The server's limits, each refusal PostgreSQL's own: sessions at once in all and per role
(FATAL 53300), a statement's time (57014 "canceling statement due to statement timeout", for
the cache's own work and the backend's), a transaction's idle time (FATAL 25P03, the
transaction rolled back). Other sessions go on."""

from __future__ import annotations

import os
import subprocess
import typing as t
from collections.abc import Iterator

import psycopg
import pytest

from cache.server.counters import ServerCounter
from cache.server.limits import Limits
from cache.server.options import ServerOptions
from tests.conftest import cli_home
from tests.serving import (
    SLOW_LOCAL,
    Served,
    messages,
    numbers_table,
    raw_session,
    serving,
)

RESULT_BYTES = 4000  # what a local answer may take as sent: ~300 rows of one integer
LIMITS = Limits(
    max_sessions=4, max_sessions_per_role=3, statement_timeout=0.5, idle_in_transaction_timeout=0.5
)


@pytest.fixture(scope="module")
def served(bookstore_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    numbers_table(bookstore_dsn)
    with psycopg.connect(bookstore_dsn, autocommit=True) as pg:
        pg.execute("DROP TABLE IF EXISTS kept")
        pg.execute("CREATE TABLE kept (n integer)")
        if not pg.execute("SELECT 1 FROM pg_roles WHERE rolname = 'limits_other'").fetchone():
            pg.execute("CREATE ROLE limits_other LOGIN")
        pg.execute("GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA public TO limits_other")
    with serving(
        bookstore_dsn,
        tmp_path_factory.mktemp("limits") / "cache.duckdb",
        (1, 2),
        ServerOptions(limits=LIMITS, max_result_bytes=RESULT_BYTES),
        numbers=True,
    ) as found:
        yield found


def connect(served: Served, role: str = "postgres") -> psycopg.Connection[t.Any]:
    return psycopg.connect(served.dsn.replace("user=postgres", f"user={role}"), autocommit=True)


def test_sessions_past_the_limits_are_refused(served: Served) -> None:
    held = [connect(served) for _ in range(3)]
    try:
        with pytest.raises(
            psycopg.OperationalError, match='FATAL:  too many connections for role "postgres"'
        ):
            connect(served)
        other = connect(served, "limits_other")  # the fourth session, another role
        try:
            with pytest.raises(
                psycopg.OperationalError, match="FATAL:  sorry, too many clients already"
            ):
                connect(served, "limits_other")
            assert other.execute("SELECT 1").fetchone() == (1,)
        finally:
            other.close()
        assert all(conn.execute("SELECT 2").fetchone() == (2,) for conn in held)
    finally:
        for conn in held:
            conn.close()
    with connect(served) as again:  # the places are free once the sessions end
        assert again.execute("SELECT 3").fetchone() == (3,)


@pytest.mark.parametrize("sql", [SLOW_LOCAL, "SELECT pg_sleep(600)"], ids=["local", "remote"])
def test_a_statement_past_its_time_is_cancelled(served: Served, sql: str) -> None:
    with connect(served) as conn:
        with pytest.raises(
            psycopg.errors.QueryCanceled, match="canceling statement due to statement timeout"
        ):
            conn.execute(sql)
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session goes on


def test_a_session_idle_in_a_transaction_is_ended_and_its_transaction_rolled_back(
    served: Served,
) -> None:
    sock = raw_session(served)
    try:
        for sql in (b"BEGIN", b"INSERT INTO kept VALUES (1)"):
            sock.sendall(b"Q" + (len(sql) + 5).to_bytes(4, "big") + sql + b"\0")
            seen = []
            for kind, body in messages(sock):
                seen.append(kind)
                if kind == b"Z":
                    assert body == b"T"
                    break
        ended = list(messages(sock))  # nothing more is sent: the server ends the session
    finally:
        sock.close()
    assert len(ended) == 1 and ended[0][0] == b"E", ended
    fields = dict((f[:1], f[1:]) for f in ended[0][1].split(b"\0") if f)
    assert (fields[b"S"], fields[b"C"]) == (b"FATAL", b"25P03")
    assert fields[b"M"] == b"terminating connection due to idle-in-transaction timeout"
    with psycopg.connect(served.backend) as pg:
        assert pg.execute("SELECT count(*) FROM kept").fetchone() == (0,)


@pytest.mark.parametrize(
    "args, why",
    [
        (["--max-sessions", "0"], "--max-sessions must be at least 1, not 0"),
        (["--max-sessions-per-role", "-2"], "--max-sessions-per-role must be at least 1"),
        (["--statement-timeout", "soon"], "--statement-timeout: 'soon' is not a duration"),
        (
            ["--idle-in-transaction-timeout", "5 parsecs"],
            "--idle-in-transaction-timeout: '5 parsecs' is not a duration",
        ),
        (["--metrics", "nowhere"], "--metrics 'nowhere': write HOST:PORT"),
    ],
)
def test_mtcache_serve_refuses_options_it_cannot_read(
    bookstore_dsn: str, mtcache_bin: str, args: list[str], why: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTCACHE_")}
    cli_home(env, bookstore_dsn, "mtcache-limits-")
    done = subprocess.run(
        [mtcache_bin, "serve", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("mtcache: ") and why in lines[0], lines


def test_a_local_answer_past_the_result_limit_is_refused(served: Served) -> None:
    """A result the cache answers whose rows take more than --max-result-bytes gets 54000
    (simple and extended protocol, at hand or not), and the session goes on; a result the
    backend sends is relayed as it comes, whatever its size."""
    everything = "SELECT n FROM numbers ORDER BY n"
    with connect(served) as conn, psycopg.connect(served.backend, autocommit=True) as pg:
        conn.execute("SET mtcache.currency_bound = 600")
        at_once = served.server.counters[ServerCounter.AT_HAND]
        for prepare in (False, True, True, True):  # (the last runs answered at hand)
            with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="--max-result-bytes"):
                conn.execute(everything + " LIMIT %s", [2000], prepare=prepare)
            few = "SELECT n FROM numbers WHERE n <= %s ORDER BY n"
            assert (
                conn.execute(few, [10], prepare=prepare).fetchall()
                == pg.execute(few, [10]).fetchall()
            )
        assert served.server.counters[ServerCounter.AT_HAND] > at_once  # (the refusal at hand too)
        with pytest.raises(psycopg.errors.ProgramLimitExceeded):
            conn.execute(everything)
        conn.execute("RESET mtcache.currency_bound")
        assert conn.execute(everything).fetchall() == pg.execute(everything).fetchall()
