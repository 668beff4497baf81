"""`mtcache serve`: the cache as a PostgreSQL server, driven by real clients (psycopg here;
psql and the raw protocol below). Every cached answer is compared with PostgreSQL's own answer
to the same statement: values, Python types and the description."""

from __future__ import annotations

import datetime as dt
import json
import re
import socket
import struct
import subprocess
import threading
import time
import typing as t
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cache.engine import state as state_module
from cache.engine.inspect import CACHE_ADVICE, status_document
from cache.engine.session import Session
from cache.server.counters import ServerCounter
from cache.store.counters import Counter
from cache.wire import protocol
from sql_ext import parse_one
from tests.answers import typed
from tests.serving import Served, quiet, raw_postgres, raw_session, relayed_runs, serving, until

BOOKS = "SELECT isbn, title, price, authorid FROM books WHERE authorid = %s ORDER BY isbn"


@pytest.fixture(scope="module")
def served(bookstore_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(
        bookstore_dsn, tmp_path_factory.mktemp("server") / "cache.duckdb", (1, 2, 3)
    ) as found:
        yield found


def _same(got: psycopg.Cursor[t.Any], want: psycopg.Cursor[t.Any]) -> list[t.Any]:
    rows, expected = got.fetchall(), want.fetchall()
    assert typed(rows) == typed(expected)
    described = [
        (d.name, d.type_code, d.internal_size, d.precision, d.scale) for d in got.description or []
    ]
    assert described == [
        (d.name, d.type_code, d.internal_size, d.precision, d.scale) for d in want.description or []
    ]
    return rows


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
@pytest.mark.parametrize("prepare", [False, True], ids=["unprepared", "prepared"])
def test_cached_reads_answer_as_postgres_in_both_formats(
    served: Served, binary: bool, prepare: bool
) -> None:
    hits = served.engine.counters()[Counter.HITS]
    with (
        psycopg.connect(served.dsn, autocommit=True) as conn,
        psycopg.connect(served.backend, autocommit=True) as pg,
    ):
        for author in (1, 2, 3, 2):
            got = conn.cursor(binary=binary).execute(
                BOOKS + " CURRENCY BOUND 10 MIN", (author,), prepare=prepare
            )
            want = pg.cursor(binary=binary).execute(BOOKS, (author,))
            assert _same(got, want)
    assert served.engine.counters()[Counter.HITS] >= hits + 4  # answered by the cache


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_values_of_every_cached_type_are_postgres_bytes(served: Served, binary: bool) -> None:
    """Each type the cache answers, edge values included, through a cached view."""
    sql = (
        "SELECT a.authorid, a.name, b.price, b.price * 1.5 AS scaled, "
        "b.price::float8 / 7 AS f8, b.price::float4 AS f4, b.authorid::int2 AS i2, "
        "b.authorid::int8 * 1000000000000 AS i8, b.isbn, b.price > 30 AS dear, "
        "b.price::numeric(20,6) - 100 AS negative "
        "FROM authors a JOIN books b ON b.authorid = a.authorid WHERE a.authorid = %s "
        "ORDER BY b.isbn"
    )
    with (
        psycopg.connect(served.dsn, autocommit=True) as conn,
        psycopg.connect(served.backend, autocommit=True) as pg,
    ):
        got = conn.cursor(binary=binary).execute(sql + " CURRENCY BOUND 10 MIN", (1,))
        want = pg.cursor(binary=binary).execute(sql, (1,))
        assert _same(got, want)


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_arrays_are_answered_locally_in_postgres_bytes(served: Served, binary: bool) -> None:
    """array_agg's arrays (text quoted by array_out's rules, numerics, NULL elements), as
    psycopg loads PostgreSQL's and byte for byte."""
    sql = (
        "SELECT b.authorid, array_agg(b.title || ' ' ORDER BY b.isbn) AS titles, "
        "array_agg(b.price ORDER BY b.isbn DESC), array_agg(CASE WHEN b.price > 30 THEN "
        "b.isbn END ORDER BY b.isbn) AS dear FROM books b WHERE b.authorid = 1 "
        "GROUP BY b.authorid"
    )
    hits = served.engine.counters()[Counter.HITS]
    with (
        psycopg.connect(served.dsn, autocommit=True) as conn,
        psycopg.connect(served.backend, autocommit=True) as pg,
    ):
        got = conn.cursor(binary=binary).execute(sql + " CURRENCY BOUND 10 MIN")
        want = pg.cursor(binary=binary).execute(sql)
        assert _same(got, want)
        sent = [
            c.pgconn.exec_params(text.encode(), [], result_format=int(binary))
            for c, text in ((conn, sql + " CURRENCY BOUND 10 MIN"), (pg, sql))
        ]
        ours, postgres = ([r.get_value(0, i) for i in range(4)] for r in sent)
        assert ours == postgres
    assert served.engine.counters()[Counter.HITS] >= hits + 2  # answered by the cache


def test_local_floats_follow_the_sessions_extra_float_digits(served: Served) -> None:
    """extra_float_digits is not reported to clients: the server reads it after a statement
    that may set it, and again when a SET LOCAL's transaction ends."""
    sql = (
        "SELECT isbn, price::float8 / 7 AS f8, price::float4 / 3 AS f4 FROM books "
        "WHERE authorid = %s ORDER BY isbn"
    )
    with (
        psycopg.connect(served.dsn, autocommit=True) as conn,
        psycopg.connect(served.backend, autocommit=True) as pg,
    ):
        for setting in (
            "SET extra_float_digits = 0",
            "SET extra_float_digits = -3",
            "BEGIN; SET LOCAL extra_float_digits = 1; COMMIT",
            "RESET extra_float_digits",
        ):
            conn.execute(setting)
            pg.execute(setting)
            hits = served.engine.counters()[Counter.HITS]
            for binary in (False, True):
                got = conn.cursor(binary=binary).execute(sql + " CURRENCY BOUND 10 MIN", (1,))
                assert _same(got, pg.cursor(binary=binary).execute(sql, (1,))), setting
            # the text itself, as psql would print it
            text = conn.pgconn.exec_(
                b"SELECT price::float8 / 7 FROM books WHERE authorid = 1 ORDER BY isbn "
                b"CURRENCY BOUND 10 MIN"
            )
            want = pg.pgconn.exec_(
                b"SELECT price::float8 / 7 FROM books WHERE authorid = 1 ORDER BY isbn"
            )
            assert [text.get_value(i, 0) for i in range(text.ntuples)] == [
                want.get_value(i, 0) for i in range(want.ntuples)
            ], setting
            assert served.engine.counters()[Counter.HITS] > hits  # answered by the cache


def test_simple_query_protocol_several_statements(served: Served) -> None:
    with psycopg.connect(served.dsn, autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute(
            "CREATE TEMP TABLE notes (n int, t text); INSERT INTO notes VALUES (1, 'a'),"
            " (2, 'b'); SELECT authorid FROM authors WHERE authorid = 2 CURRENCY BOUND "
            "10 MIN; SELECT count(*) FROM notes"
        )
        statuses, rows = [], []
        while True:
            statuses.append(cur.statusmessage)
            rows.append(cur.fetchall() if cur.description else None)
            if not cur.nextset():
                break
        assert statuses == ["CREATE TABLE", "INSERT 0 2", "SELECT 1", "SELECT 1"]
        assert rows == [None, None, [(2,)], [(2,)]]


def test_writes_transactions_and_read_your_writes(served: Served) -> None:
    with psycopg.connect(served.dsn) as conn:
        cur = conn.cursor()
        cur.execute("SELECT price FROM books WHERE isbn = 'isbn-00001' CURRENCY BOUND 10 MIN")
        (price,) = cur.fetchone() or ()
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        cur.execute("UPDATE books SET price = price + 1 WHERE isbn = 'isbn-00001'")
        cur.execute("SELECT price FROM books WHERE isbn = 'isbn-00001' CURRENCY BOUND 10 MIN")
        assert cur.fetchone() == (price + 1,)  # its own uncommitted write, not the cache's row
        conn.rollback()
        cur.execute("SELECT price FROM books WHERE isbn = 'isbn-00001'")
        assert cur.fetchone() == (price,)
        conn.rollback()


def test_a_clients_deallocate_all_leaves_the_engines_own_questions_alone(
    served: Served,
) -> None:
    """DEALLOCATE ALL and DISCARD ALL pass through to the session's backend connection, on
    which the engine asks its own catalog questions: those are never prepared statements the
    client's command could take away (psycopg prepares a query it runs five times)."""
    with (
        psycopg.connect(
            served.dsn, autocommit=True, options="-c mtcache.currency_bound=600"
        ) as conn,
        psycopg.connect(served.backend, autocommit=True) as pg,
    ):
        for round_ in range(8):
            conn.execute(f"CREATE TEMP TABLE scratch_{round_} (n int)")  # the catalog moves
            _same(conn.execute(BOOKS, (1,)), pg.execute(BOOKS, (1,)))
            if round_ in (5, 6):
                conn.execute("DEALLOCATE ALL" if round_ == 5 else "DISCARD ALL")


def test_errors_carry_every_field_postgres_sent(served: Served) -> None:
    statement = (
        "INSERT INTO books (isbn, authorid, title, publisherid, type, price) "
        "VALUES ('isbn-00001', 1, 't', 1, 'x', 1)"
    )
    errors = []
    for dsn in (served.dsn, served.backend):
        with (
            psycopg.connect(dsn, autocommit=True) as conn,
            pytest.raises(psycopg.errors.UniqueViolation) as caught,
        ):
            conn.execute(statement)
        diag = caught.value.diag
        errors.append(
            (
                diag.sqlstate,
                diag.message_primary,
                diag.message_detail,
                diag.constraint_name,
                diag.table_name,
                diag.schema_name,
                diag.source_function,
            )
        )
    assert errors[0] == errors[1]


def test_cache_errors_have_sqlstates_and_positions(served: Served) -> None:
    with psycopg.connect(served.dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.SyntaxError) as caught:
            conn.execute("SELECT * FROM books WHERE authorid = 1 CURRENCY BOUND -1 MIN")
        assert caught.value.diag.statement_position == "55"
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session goes on


def test_a_cache_error_in_a_transaction_block_fails_the_transaction(served: Served) -> None:
    with psycopg.connect(served.dsn) as conn:
        conn.execute("SELECT 1")
        with pytest.raises(psycopg.errors.SyntaxError):
            conn.execute("SELECT * FROM books CURRENCY BOUND -1 MIN")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("SELECT 1")
        conn.rollback()
        assert conn.execute("SELECT 2").fetchone() == (2,)


@pytest.mark.parametrize("user", ["server", "engine"])
def test_the_clients_unnamed_statement_outlives_the_servers_own(served: Served, user: str) -> None:
    """The server and the engine run statements of their own on a session's connection,
    which take the backend's unnamed statement: failing the backend's transaction when the
    cache failed a statement of the block ("server"), asking the backend which relations it
    resolves while planning a query on a temporary table ("engine"). The client's unnamed
    statement, parsed before, still runs as itself afterwards, as with PostgreSQL (extended
    protocol throughout: a simple Query would destroy it in both)."""
    sock, direct = raw_session(served), raw_postgres(served)

    def message(kind: bytes, body: bytes = b"") -> bytes:
        return protocol.message(kind, body)

    def run(statement: bytes) -> bytes:  # (no parameters)
        return (
            message(b"B", b"\0" + statement + b"\0\0\0\0\0\0\0")
            + message(b"E", b"\0\0\0\0\0")
            + message(b"S")
        )

    own = {
        "server": [
            message(b"P", b"b\0BEGIN\0\0\0") + run(b"b"),
            message(b"P", b"x\0SELECT * FROM books CURRENCY BOUND -1 MIN\0\0\0") + message(b"S"),
            message(b"P", b"r\0ROLLBACK\0\0\0") + run(b"r"),
        ],
        "engine": [message(b"P", b"x\0EXPLAIN (CACHE) SELECT k FROM scratch_u\0\0\0") + run(b"x")],
    }[user]
    steps = [
        message(b"P", b"t\0CREATE TEMP TABLE scratch_u (k int)\0\0\0") + run(b"t"),
        message(b"P", b"\0SELECT $1::int + 1\0\0\0") + message(b"S"),
        *own,
        message(b"B", b"\0\0\0\0\0\x01\0\0\0\x0241\0\0")
        + message(b"E", b"\0\0\0\0\0")
        + message(b"S"),
    ]
    answers = []
    for to in (sock, direct):
        got = []
        for step in steps:
            to.sendall(step)
            got.append(until(to, b"Z"))
        answers.append(got)
    if user == "server":
        assert answers[0][3][0][0] == b"E"  # (the cache's error, which failed the block)
    else:
        assert b"E" not in [kind for kind, _ in answers[0][2]]  # (the cache's plan)
    assert answers[0][-1] == answers[1][-1]
    assert (b"D", b"\0\x01\0\0\0\x0242") in answers[0][-1]
    sock.close()
    direct.close()


def test_show_cache_advice_counts_what_the_backend_answered(served: Served) -> None:
    """A cached read the backend answers, in either protocol and in a pipeline, is counted
    under its shape with the backend's time and why; SHOW CACHE ADVICE lists it with the DDL
    that would answer it."""
    remote = "SELECT r.rating FROM reviews r WHERE r.isbn = %s CURRENCY BOUND 10 MIN"
    with psycopg.connect(served.dsn, autocommit=True) as conn:
        before = {r[0]: r for r in conn.execute("SHOW CACHE ADVICE").fetchall()}
        for prepare in (False, True):
            conn.execute(remote, ("1",), prepare=prepare)
        with conn.pipeline():  # (three Executes before one Sync: each counted)
            for _ in range(3):
                conn.execute(remote, ("1",))
        cur = conn.execute("SHOW CACHE ADVICE")
        assert [d.name for d in cur.description or []] == [c for c, _ in CACHE_ADVICE]
        rows = {r[0]: r for r in cur.fetchall()}
    shape = "SELECT r.rating FROM reviews AS r WHERE r.isbn = %s CURRENCY BOUND 10 MIN"
    _, calls, backend_ms, reason, suggestion, saves_ms, size = rows[shape]
    earlier = before.get(shape, (shape, 0, 0.0))
    assert calls == earlier[1] + 5 and backend_ms > earlier[2]
    assert reason == "no view: no cached view answers reviews (r)"
    assert suggestion is not None and suggestion.startswith('CREATE CACHED VIEW "reviews_cache"')
    assert saves_ms > 0 and size > 0


def test_a_read_the_backend_answers_is_timed_and_its_bounds_counted_once(served: Served) -> None:
    """The backend's time for a cached read it answers, in the simple protocol too (a
    pg_sleep of 50 ms in it: the time counted is at least that); and a read's bounds are
    counted once per statement however the server's paths try it (at hand, then waiting)."""
    slow = (
        "SELECT b.title, pg_sleep(0.05) IS NULL FROM books b WHERE b.authorid = 1 "
        "CURRENCY BOUND 10 MIN"
    )
    asks = served.engine.store.asks
    asks.fold(time.time())
    before = asks.counts("bookcopy", time.time()).get(600.0, 0.0)
    with psycopg.connect(served.dsn, autocommit=True) as conn:
        psycopg.ClientCursor(conn).execute(slow)  # (a Query message: the simple protocol)
        for prepare in (False, True, True):
            conn.execute(BOOKS + " CURRENCY BOUND 10 MIN", (1,), prepare=prepare)
        rows = {r[0]: r for r in conn.execute("SHOW CACHE ADVICE").fetchall()}
    _, calls, backend_ms, reason, *_ = rows[parse_one(slow).normalized]
    assert calls >= 1 and backend_ms >= 50.0, backend_ms
    assert reason.startswith("allowlist: ")
    now = time.time()
    asks.fold(now)
    # the three local reads, each once (the slow one asks nothing: no view can answer what
    # DuckDB cannot compute; the counts halve in an hour: over these seconds, by millionths)
    assert asks.counts("bookcopy", now)[600.0] - before == pytest.approx(3.0, abs=0.01)


def test_the_cache_statements_over_the_wire(served: Served) -> None:
    """EXPLAIN LAST STATEMENT, SHOW CACHED VIEWS / CACHE STATUS and the provenance NOTICE,
    in both protocols; the setting also comes as a startup option."""
    notices: list[tuple[str | None, str | None]] = []  # message, detail (read in the handler)
    with psycopg.connect(served.dsn, autocommit=True, options="-c mtcache.provenance=on") as conn:
        conn.add_notice_handler(lambda d: notices.append((d.message_primary, d.message_detail)))
        assert conn.execute("SHOW mtcache.provenance").fetchone() == ("on",)
        for prepare in (False, True):
            notices.clear()
            conn.execute(BOOKS + " CURRENCY BOUND 10 MIN", (1,), prepare=prepare)
            [(message, detail)] = notices
            assert (message or "").startswith("provenance: books: local via bookcopy")
            provenance = json.loads(detail or "")
            rows = conn.execute("EXPLAIN LAST STATEMENT").fetchall()
            assert [(r[0], r[1], r[2], json.loads(r[3])) for r in rows] == [
                (p["table"], p["route"], p["view"], p["regions"]) for p in provenance
            ]
            # a read the backend answers, in either protocol: remote
            notices.clear()
            conn.execute(BOOKS, (1,), prepare=prepare)
            assert json.loads(notices[-1][1] or "") == [
                {
                    "table": "books",
                    "route": "remote",
                    "view": None,
                    "regions": [],
                    "currency_seconds": 0.0,
                    "snapshot_ids": [],
                    "stale": False,
                }
            ]
        conn.execute("SET mtcache.provenance = off")
        notices.clear()
        conn.execute(BOOKS + " CURRENCY BOUND 10 MIN", (1,))
        assert notices == []
        conn.execute("RESET mtcache.provenance")  # back to the value the session began with
        assert conn.execute("SHOW mtcache.provenance").fetchone() == ("on",)
        conn.execute("SET mtcache.provenance = off")
        cur = conn.execute("SHOW CACHED VIEWS")
        assert cur.statusmessage == "SHOW 2"
        assert [d.name for d in cur.description or []][:3] == ["name", "table", "consistency"]
        assert [d.type_code for d in cur.description or []][5] == 20  # rows: bigint
        assert sorted(r[0] for r in cur.fetchall()) == ["authorcopy", "bookcopy"]
        document = status_document(conn.execute("SHOW CACHE STATUS").fetchall())
        assert [v["name"] for v in document["views"]] == ["authorcopy", "bookcopy"]
    host, port = served.server.address
    with pytest.raises(psycopg.OperationalError, match="requires a Boolean value"):
        psycopg.connect(
            f"host={host} port={port} user=postgres dbname="
            f"{psycopg.conninfo.conninfo_to_dict(served.dsn)['dbname']}",
            options="-c mtcache.provenance=perhaps",
        )


def test_cache_status_counts_the_hits_of_running_sessions(served: Served) -> None:
    """SHOW CACHE STATUS gives the engine's counters as they are now, not those the file
    saved when sessions last ended."""
    with psycopg.connect(served.dsn, autocommit=True) as conn:

        def hits() -> int:
            return int(
                status_document(conn.execute("SHOW CACHE STATUS").fetchall())["counters"][
                    Counter.HITS
                ]
            )

        before = hits()
        for _ in range(3):
            conn.execute(BOOKS + " CURRENCY BOUND 10 MIN", (2,)).fetchall()
        assert hits() == before + 3 == served.engine.counters()[Counter.HITS]


def test_pipeline_mode(served: Served) -> None:
    with (
        psycopg.connect(served.dsn, autocommit=True) as conn,
        psycopg.connect(served.backend, autocommit=True) as pg,
    ):
        conn.execute("CREATE TEMP TABLE piped (n int)")
        with conn.pipeline():
            first = conn.execute("INSERT INTO piped VALUES (1), (2)")
            cached = conn.execute(BOOKS + " CURRENCY BOUND 10 MIN", (3,))
            counted = conn.execute("SELECT count(*) FROM piped")
        assert first.rowcount == 2
        assert typed(cached.fetchall()) == typed(pg.execute(BOOKS, (3,)).fetchall())
        assert counted.fetchone() == (2,)


def test_copy_passes_through(served: Served) -> None:
    with psycopg.connect(served.dsn, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE copied (n int, t text)")
        with conn.cursor().copy("COPY copied FROM STDIN") as copy:
            for row in [(1, "one"), (2, "two\ttab")]:
                copy.write_row(row)
        with conn.cursor().copy("COPY copied TO STDOUT") as copy:
            assert list(copy.rows()) == [("1", "one"), ("2", "two\ttab")]


def test_listen_notify_pass_through(served: Served) -> None:
    with (
        psycopg.connect(served.dsn, autocommit=True) as listener,
        psycopg.connect(served.dsn, autocommit=True) as sender,
    ):
        listener.execute("LISTEN chan")
        sender.execute("NOTIFY chan, 'hello'")
        found = next(listener.notifies(timeout=10, stop_after=1))
        assert (found.channel, found.payload) == ("chan", "hello")


def test_psql_through_the_server(served: Served, tmp_path: Path) -> None:
    host, port = served.server.address
    dbname = psycopg.conninfo.conninfo_to_dict(served.backend)["dbname"]
    (tmp_path / "in.csv").write_text("isbn-copy-1,1.50\nisbn-copy-2,2.25\n")
    script = (
        "\\d books\n"
        "SELECT isbn, price FROM books WHERE authorid = 1 ORDER BY isbn LIMIT 2 "
        "CURRENCY BOUND 10 MIN;\n"
        "CREATE TEMP TABLE copied (isbn text, price numeric(8, 2));\n"
        f"\\copy copied FROM '{tmp_path / 'in.csv'}' WITH (FORMAT csv)\n"
        "SELECT isbn, price FROM copied ORDER BY isbn;\n"
        "\\copy (SELECT isbn, price FROM books WHERE authorid = 1 ORDER BY isbn) TO "
        f"'{tmp_path / 'served.csv'}' WITH (FORMAT csv)\n"
    )
    run = subprocess.run(
        [
            "psql",
            "-X",
            "-h",
            host,
            "-p",
            str(port),
            "-U",
            "postgres",
            "-d",
            dbname,
            "-v",
            "ON_ERROR_STOP=1",
        ],
        input=script,
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert 'Table "public.books"' in run.stdout
    assert "COPY 2" in run.stdout and " isbn-copy-2 |  2.25" in run.stdout, run.stdout
    direct = subprocess.run(
        [
            "psql",
            "-X",
            served.backend,
            "-c",
            "SELECT isbn, price FROM books WHERE authorid = 1 ORDER BY isbn LIMIT 2",
            "-c",
            "\\copy (SELECT isbn, price FROM books WHERE authorid = 1 ORDER BY "
            f"isbn) TO '{tmp_path / 'direct.csv'}' WITH (FORMAT csv)",
        ],
        text=True,
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert direct.stdout.split("COPY")[0] in run.stdout
    copied = (tmp_path / "served.csv").read_text()
    assert copied and copied == (tmp_path / "direct.csv").read_text()


# -- the protocol, byte by byte -------------------------------------------------------------------


def test_row_limited_execute_suspends_the_portal(served: Served) -> None:
    sock = raw_session(served)
    sql = b"SELECT isbn FROM books WHERE authorid = 1 ORDER BY isbn CURRENCY BOUND 10 MIN"
    sock.sendall(
        protocol.message(b"P", b"\0" + sql + b"\0\0\0")
        + protocol.message(b"B", b"\0\0\0\0\0\0\0\0")
        + protocol.message(b"E", b"\0" + struct.pack("!i", 2))
        + protocol.message(b"E", b"\0" + struct.pack("!i", 0))
        + protocol.message(b"S")
    )
    kinds = [kind for kind, _ in until(sock, b"Z")]
    assert kinds[:5] == [b"1", b"2", b"D", b"D", b"s"]
    assert kinds[-2:] == [b"C", b"Z"] and kinds.count(b"D") > 2
    sock.close()


def test_a_prepared_run_sent_at_once_gets_the_bytes_of_its_messages(served: Served) -> None:
    """A client's Bind, Describe, Execute and Sync arriving together are answered in one
    step from what the cache holds (the server's fast lane): byte for byte what the same
    messages get through their turns one by one, in text and binary, with and without a
    Describe, in the unnamed and a named portal; a key the cache does not hold goes the
    usual way (to the backend)."""
    sock = raw_session(served, "-c mtcache.admit_on_miss=off")  # (the cache stays as it is)
    sql = BOOKS.replace("%s", "$1").encode() + b" CURRENCY BOUND 10 MIN"
    sock.sendall(
        protocol.message(b"P", b"s\0" + sql + b"\0\0\0")
        + protocol.message(b"D", b"Ss\0")
        + protocol.message(b"S")
    )
    assert [kind for kind, _ in until(sock, b"Z")] == [b"1", b"t", b"T", b"Z"]

    def run(author: int, binary: bool, describe: bool, portal: bytes) -> bytes:
        value = str(author).encode()
        bind = (
            portal
            + b"\0s\0"
            + struct.pack("!hhhi", 1, 0, 1, len(value))
            + value
            + struct.pack("!hh", 1, int(binary))
        )
        return (
            protocol.message(b"B", bind)
            + (protocol.message(b"D", b"P" + portal + b"\0") if describe else b"")
            + protocol.message(b"E", portal + b"\0\0\0\0\0")
            + protocol.message(b"S")
        )

    def answer(data: bytes) -> list[tuple[bytes, bytes]]:
        sock.sendall(data)
        return until(sock, b"Z")

    runs = [
        (author, binary, describe, portal)
        for author in (1, 2, 3, 99)
        for binary in (False, True)
        for describe in (False, True)
        for portal in (b"", b"p")
    ]
    flush = protocol.message(b"H")  # (a run that does not start with its Bind: one by one)
    before = served.server.counters[ServerCounter.AT_HAND]
    one_by_one = [answer(flush + run(*each)) for each in runs]
    served.engine.memo.lookups.wait()
    quiet(served)
    assert served.server.counters[ServerCounter.AT_HAND] == before
    version = served.engine.store.version
    at_once = [answer(run(*each)) for each in runs]
    assert at_once == one_by_one
    # every cached run was answered at once, but for one after each change another test's
    # background work committed meanwhile (the regions are read again) and one clock reading
    cached = sum(1 for author, *_ in runs if author != 99)
    changes = served.engine.store.version - version
    assert cached - changes - 1 <= served.server.counters[ServerCounter.AT_HAND] - before <= cached
    kinds = [kind for kind, _ in at_once[0]]
    assert kinds[0] == b"2" and kinds[-2:] == [b"C", b"Z"] and b"D" in kinds
    assert [kind for kind, _ in at_once[-1]][:2] == [b"2", b"T"]
    sock.close()


def test_a_passed_through_run_sent_at_once_gets_the_bytes_of_its_messages(served: Served) -> None:
    """Runs of passed-through prepared statements arriving whole are sent to the backend
    by the event loop, which relays the answer as it comes (no hand-off to a worker): outside
    a transaction block byte for byte, the backend's answer being PostgreSQL's own bytes (the
    same bytes sent to PostgreSQL directly get them); in a block through libpq, the bytes the
    same messages get one by one - rows in text and binary, a write, an error, a notice, with
    and without a Describe."""
    sock, direct = raw_session(served), raw_postgres(served)

    def answer(data: bytes, to: socket.socket = sock) -> list[tuple[bytes, bytes]]:
        to.sendall(data)
        return until(to, b"Z")

    def query(sql: bytes, to: socket.socket = sock) -> list[bytes]:
        return [kind for kind, _ in answer(protocol.message(b"Q", sql + b"\0"), to)]

    statements = {
        b"r": b"SELECT k, v, x FROM relayed WHERE k >= $1 ORDER BY k",
        b"w": b"UPDATE relayed SET v = upper(v) WHERE k = $1",
        b"e": b"SELECT 1 / ($1::int - $1::int)",
        b"n": b"SELECT pg_temp.said($1)",
    }
    for to in (sock, direct):
        assert b"E" not in query(
            b"CREATE TEMP TABLE relayed (k int PRIMARY KEY, v text, x numeric);"
            b"INSERT INTO relayed SELECT g, 'v' || g, g / 7.0 FROM generate_series(1, 50) g;"
            b"UPDATE relayed SET v = upper(v) WHERE k IN (3, 48);"  # (as the write leaves them)
            b"CREATE FUNCTION pg_temp.said(int) RETURNS int LANGUAGE plpgsql AS "
            b"$$BEGIN RAISE NOTICE 'said %', $1; RETURN $1; END$$",
            to,
        )
        for name, sql in statements.items():
            kinds = [
                kind
                for kind, _ in answer(
                    protocol.message(b"P", name + b"\0" + sql + b"\0\0\0")
                    + protocol.message(b"D", b"S" + name + b"\0")
                    + protocol.message(b"S"),
                    to,
                )
            ]
            assert kinds[0] == b"1" and kinds[-1] == b"Z" and b"E" not in kinds, (name, kinds)

    def run(name: bytes, key: int, binary: bool, describe: bool) -> bytes:
        value = str(key).encode()
        bind = (
            b"\0"
            + name
            + b"\0"
            + struct.pack("!hhhi", 1, 0, 1, len(value))
            + value
            + struct.pack("!hh", 1, int(binary))
        )
        return (
            protocol.message(b"B", bind)
            + (protocol.message(b"D", b"P\0") if describe else b"")
            + protocol.message(b"E", b"\0\0\0\0\0")
            + protocol.message(b"S")
        )

    runs = [
        (name, key, binary, describe)
        for name in statements
        for key in (3, 48)
        for binary in (False, True)
        for describe in (False, True)
    ]
    flush = protocol.message(b"H")  # (a run that does not start with its Bind: one by one)
    for block in (False, True):
        if block:
            assert query(b"BEGIN") == [b"C", b"Z"]
        before, raw = relayed_runs(served), served.server.counters[ServerCounter.RELAYED_RAW]
        remote = served.engine.counters().get(Counter.REMOTE, 0)
        one_by_one = [answer(flush + run(*each)) for each in runs if each[0] != b"e"]
        quiet(served)
        assert relayed_runs(served) == before
        counted = served.engine.counters().get(Counter.REMOTE, 0) - remote
        at_once = [answer(run(*each)) for each in runs if each[0] != b"e"]
        assert at_once == one_by_one
        assert relayed_runs(served) - before == len(at_once)
        # byte for byte outside a block, through libpq in one
        assert served.server.counters[ServerCounter.RELAYED_RAW] - raw == (
            0 if block else len(at_once)
        )
        # the session's bookkeeping as for any statement passed through (reads counted)
        assert served.engine.counters().get(Counter.REMOTE, 0) - remote == 2 * counted > 0
        if block:
            assert at_once[-1][-1] == (b"Z", b"T")
            # an error fails the block, as in PostgreSQL
            failed = [answer(flush + run(b"e", 1, False, True)), answer(run(b"e", 1, False, True))]
            assert failed[0][:2] == [(b"2", b""), failed[1][1]] and failed[0][2][0] == b"E"
            assert failed[1][2][0] == b"E" and failed[1][-1] == (b"Z", b"E")
            assert query(b"ROLLBACK") == [b"C", b"Z"]
        else:
            # PostgreSQL's own bytes, its error at Bind included (its plan folds 1 / 0)
            assert [_oids_blank(a) for a in at_once] == [
                _oids_blank(answer(run(*each), direct)) for each in runs if each[0] != b"e"
            ]
            failed = [answer(run(b"e", 1, False, True), to) for to in (sock, direct)]
            assert failed[0] == failed[1] and [k for k, _ in failed[0]] == [b"E", b"Z"]
    kinds = [kind for kind, _ in at_once[-1]]
    assert kinds == [b"2", b"T", b"N", b"D", b"C", b"Z"]  # the notice, before its row
    sock.close()
    direct.close()


def _session_of(served: Served, conn: psycopg.Connection[t.Any]) -> Session:
    """The server's session of a client connection (by the pid its BackendKeyData gave)."""
    found = served.server.session_of(conn.info.backend_pid)
    assert found is not None
    return found


def test_a_function_that_sets_a_reported_setting_in_a_raw_run(served: Served) -> None:
    """A statement passed through byte for byte that changes a reported setting unseen by
    its text (a function calling set_config): the client gets the ParameterStatus in the
    backend's answer, and the session's libpq learns it too before the next statement, so a
    later change back to the old value reaches the client as well."""
    with psycopg.connect(served.dsn, autocommit=True) as conn:
        before = conn.info.parameter_status("TimeZone")
        other = "Asia/Kolkata" if before != "Asia/Kolkata" else "America/Lima"
        conn.execute(
            "CREATE FUNCTION pg_temp.zoned(text) RETURNS text LANGUAGE sql AS "
            "$$SELECT set_config('TimeZone', $1, false)$$"
        )
        for zone in (before, before):  # (prepared, then run whole)
            conn.execute("SELECT pg_temp.zoned(%s)", [zone], prepare=True)
        quiet(served)  # (no worker holds the session: the loop relays the next run)
        raw = served.server.counters[ServerCounter.RELAYED_RAW]
        conn.execute("SELECT pg_temp.zoned(%s)", [other], prepare=True)
        assert served.server.counters[ServerCounter.RELAYED_RAW] == raw + 1
        assert conn.info.parameter_status("TimeZone") == other
        quiet(served)
        pg = _session_of(served, conn).link.if_open()
        assert pg is not None and pg.info.parameter_status("TimeZone") == other
        conn.execute(f"SET TimeZone TO '{before}'")  # (through libpq: back to its old value)
        assert conn.info.parameter_status("TimeZone") == before
        assert conn.execute("SHOW TimeZone").fetchone() == (before,)


def test_a_raw_write_when_the_clock_is_due_is_settled_off_the_loop(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write passed through byte for byte when the session's backend clock is due to be
    measured: its commit time needs that measurement, which the event loop may not wait for;
    a worker makes it before the session's next statement, and the write counts for the
    session's reads from then on."""
    measured_on: list[int] = []
    spied = state_module.measure

    def measure(pg: psycopg.Connection[t.Any]) -> t.Any:
        measured_on.append(threading.get_ident())
        return spied(pg)

    monkeypatch.setattr(state_module, "measure", measure)
    update = "UPDATE books SET price = price + 1 WHERE isbn = %s"
    plain = "SELECT price FROM books WHERE isbn = %s"
    with (
        psycopg.connect(served.dsn, autocommit=True) as conn,
        psycopg.connect(served.backend, autocommit=True) as direct,
    ):
        found = direct.execute(
            "SELECT isbn FROM books WHERE authorid = 2 ORDER BY isbn LIMIT 1"
        ).fetchone()
        assert found is not None
        (isbn,) = found
        conn.execute(update, [isbn], prepare=True)
        state = _session_of(served, conn).state
        first = state.written_at["books"]
        raw = served.server.counters[ServerCounter.RELAYED_RAW]
        state._remeasure_at = dt.datetime.now(dt.UTC)  # (as CLOCK_MAX_AGE seconds later)
        measured_on.clear()
        quiet(served)  # (no worker holds the session: the loop relays the next run)
        conn.execute(update, [isbn], prepare=True)
        assert served.server.counters[ServerCounter.RELAYED_RAW] == raw + 1
        quiet(served)
        assert measured_on and served.server.loop_thread not in measured_on
        assert not state.writing and state.written_at["books"] > first
        _same(conn.execute(plain + " CURRENCY BOUND 10 MIN", [isbn]), direct.execute(plain, [isbn]))


def _oids_blank(answer: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Messages with what differs between two sessions blanked: the table OIDs of their
    RowDescriptions, the number of their temporary schema."""
    found = []
    for kind, body in answer:
        blanked = body
        if kind == b"T":
            fields, pos = bytearray(body), 2
            for _ in range(struct.unpack_from("!h", body)[0]):
                pos = body.index(b"\0", pos) + 1
                fields[pos : pos + 4] = bytes(4)
                pos += 18
            blanked = bytes(fields)
        found.append((kind, re.sub(rb"pg_temp_\d+", b"pg_temp", blanked)))
    return found


def test_ssl_request_is_declined_and_startup_goes_on(served: Served) -> None:
    sock = socket.create_connection(served.server.address, timeout=10)
    sock.sendall(struct.pack("!ii", 8, protocol.SSL_REQUEST))
    assert sock.recv(1) == b"N"
    sock.close()
    with psycopg.connect(served.dsn + " sslmode=prefer") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_wrong_database_is_refused(served: Served) -> None:
    host, port = served.server.address
    with pytest.raises(psycopg.OperationalError, match="not served here"):
        psycopg.connect(f"host={host} port={port} user=postgres dbname=elsewhere")


def test_busy_port_and_bad_listen_are_one_line_errors(
    served: Served, mtcache_bin: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    host, port = served.server.address
    env = dict(
        clean_env, MTCACHE_BACKEND=served.backend, MTCACHE_CACHE=str(tmp_path / "other.duckdb")
    )
    for listen, says in (
        (f"{host}:{port}", "cannot listen"),
        ("nonsense", "HOST:PORT"),
        ("0.0.0.0:7777", "authentication"),
    ):
        run = subprocess.run(
            [mtcache_bin, "serve", "--listen", listen],
            env=env,
            text=True,
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 1, run.stderr
        assert says in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
