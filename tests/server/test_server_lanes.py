"""A statement's lane, the server's hit path for runs of a prepared point lookup
(`Conversation.lane_at_hand`, `cache.engine.lane`): byte for byte what the full path answers,
in text and binary, with and without a Describe, for keys with rows, without, and NULL; and
never an answer the full path would not give: after the session's own write, inside a
transaction block, after a refresh of the view, after the session's bound changed."""

from __future__ import annotations

import itertools
import struct
import threading
import time
import typing as t
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cache.engine.session import Session
from cache.server.counters import ServerCounter
from cache.wire import protocol
from tests.answers import typed
from tests.serving import Served, quiet, raw_session, server_of, until

POINT = "SELECT abalance, note, amount FROM accounts WHERE aid = %s"
BOUND = "-c mtcache.currency_bound=600"


@pytest.fixture(scope="module")
def served(backend_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with psycopg.connect(backend_dsn, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS accounts")
        setup.execute(
            "CREATE TABLE accounts (aid integer PRIMARY KEY, abalance integer, "
            "note text, amount numeric(12,2))"
        )
        setup.execute(
            "INSERT INTO accounts SELECT g, g * 3, CASE WHEN g % 5 = 0 THEN NULL "
            "ELSE 'n' || g END, g * 1.5 FROM generate_series(1, 500) g"
        )
    with server_of(backend_dsn, tmp_path_factory.mktemp("lanes") / "cache.duckdb") as found:
        with psycopg.connect(found.dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE CACHED VIEW accountcopy AS SELECT * FROM accounts REFRESH EVERY 10 MIN"
            )
            conn.execute("REFRESH CACHED VIEW accountcopy")
        yield found


def _lanes(served: Served) -> int:
    """The prepared runs the server's lanes answered so far."""
    return served.server.counters[ServerCounter.LANE]


def _warm(served: Served, read: t.Callable[[int], object]) -> None:
    """Runs enough for the plan, the decision and the lookup index to be made."""
    for key in range(1, 8):
        read(key)
    memo = served.engine.memo
    assert memo is not None and memo.lookups is not None
    memo.lookups.wait()
    quiet(served)


@pytest.mark.parametrize(("binary", "describe"), list(itertools.product((False, True), repeat=2)))
def test_a_lane_gives_the_bytes_the_full_path_gives(
    served: Served, binary: bool, describe: bool
) -> None:
    sock = raw_session(served, BOUND)
    sql = POINT.replace("%s", "$1").encode()
    sock.sendall(
        protocol.message(b"P", b"s\0" + sql + b"\0\0\0")
        + protocol.message(b"D", b"Ss\0")
        + protocol.message(b"S")
    )
    assert [kind for kind, _ in until(sock, b"Z")] == [b"1", b"t", b"T", b"Z"]

    def run(key: int | None) -> bytes:
        value = b"" if key is None else str(key).encode()
        length = -1 if key is None else len(value)
        bind = (
            b"\0s\0"
            + struct.pack("!hhhi", 1, 0, 1, length)
            + value
            + struct.pack("!hh", 1, int(binary))
        )
        return (
            protocol.message(b"B", bind)
            + (protocol.message(b"D", b"P\0") if describe else b"")
            + protocol.message(b"E", b"\0\0\0\0\0")
            + protocol.message(b"S")
        )

    def answer(data: bytes) -> list[tuple[bytes, bytes]]:
        sock.sendall(data)
        return until(sock, b"Z")

    flush = protocol.message(b"H")  # (a run that does not start with its Bind: one by one)
    _warm(served, lambda key: answer(run(key)))
    keys = [1, 2, 5, 499, 0, 501, None, 10, 7]  # (5, 10: a NULL note; 0, 501: no row)
    one_by_one = [answer(flush + run(key)) for key in keys]
    before = _lanes(served)
    at_once = [answer(run(key)) for key in keys]
    assert at_once == one_by_one
    # the second run makes the lane again (the runs one by one ended it), a NULL goes the
    # full path; one more may, if the backend's clock was measured again meanwhile
    assert len(keys) - 4 <= _lanes(served) - before <= len(keys) - 3
    kinds = [kind for kind, _ in at_once[0]]
    assert kinds == ([b"2", b"T"] if describe else [b"2"]) + [b"D", b"C", b"Z"]
    sock.close()


def _same(got: psycopg.Cursor[t.Any], want: psycopg.Cursor[t.Any]) -> list[t.Any]:
    rows, expected = got.fetchall(), want.fetchall()
    assert typed(rows) == typed(expected)
    assert [(d.name, d.type_code) for d in got.description or []] == [
        (d.name, d.type_code) for d in want.description or []
    ]
    return rows


def test_a_lane_never_answers_what_the_full_path_would_not(served: Served) -> None:
    with (
        psycopg.connect(served.dsn, autocommit=True, options=BOUND) as conn,
        psycopg.connect(served.dsn, autocommit=True) as admin,
        psycopg.connect(served.backend, autocommit=True) as pg,
    ):

        def read(key: int) -> list[t.Any]:
            return conn.execute(POINT, (key,), prepare=True).fetchall()

        def check(key: int) -> list[t.Any]:
            return _same(conn.execute(POINT, (key,), prepare=True), pg.execute(POINT, (key,)))

        def lane_hits() -> int:
            quiet(served)
            return _lanes(served)

        _warm(served, read)
        before = lane_hits()
        for key in range(1, 41):
            check(key)
        assert lane_hits() - before >= 37  # (see the test above)
        try:
            # the session's own write: its next read sees it (the backend answers)
            conn.execute("UPDATE accounts SET abalance = abalance + 1 WHERE aid = 7")
            assert check(7) == [(22, "n7", pg.execute(POINT, (7,)).fetchone()[2])]
            # a transaction block: its reads see its writes
            conn.execute("BEGIN")
            conn.execute("UPDATE accounts SET abalance = -1 WHERE aid = 8")
            assert read(8)[0][0] == -1
            conn.execute("ROLLBACK")
            check(8)
            # a change at the backend, then the view refreshed by another session
            _warm(served, read)
            pg.execute("UPDATE accounts SET note = 'changed' WHERE aid = 9")
            admin.execute("REFRESH CACHED VIEW accountcopy")
            assert check(9)[0][1] == "changed"
            # a change the cache has not seen (within the bound: the cache may answer), then a
            # bound the cached copy does not meet: the backend answers
            _warm(served, read)
            before = lane_hits()
            pg.execute("UPDATE accounts SET note = 'fresh' WHERE aid = 11")
            read(11)
            assert lane_hits() > before
            conn.execute("SET CURRENCY BOUND 0 SECONDS")
            assert check(11)[0][1] == "fresh"
            conn.execute("SET CURRENCY BOUND 10 MIN")
        finally:
            pg.execute(
                "UPDATE accounts SET abalance = aid * 3, note = CASE WHEN aid % 5 = 0 "
                "THEN NULL ELSE 'n' || aid END WHERE aid IN (7, 9, 11)"
            )
            admin.execute("REFRESH CACHED VIEW accountcopy")


def test_a_lane_of_two_keys_answers_as_postgresql(served: Served) -> None:
    """A lookup on two keys takes the lane's general reading of a run (the usual one-key
    lookup has its own: the tests above)."""
    two_keys = "SELECT abalance, note, amount FROM accounts WHERE aid = %s AND note = %s"
    with (
        psycopg.connect(served.dsn, autocommit=True, options=BOUND) as conn,
        psycopg.connect(served.backend, autocommit=True) as pg,
    ):

        def read(key: int) -> list[t.Any]:
            return conn.execute(two_keys, (key, f"n{key}"), prepare=True).fetchall()

        _warm(served, read)
        quiet(served)
        before = _lanes(served)
        pairs = [(k, f"n{k}") for k in range(12, 40)] + [(41, "n42"), (45, "n45"), (0, "n0")]
        found = [
            _same(conn.execute(two_keys, pair, prepare=True), pg.execute(two_keys, pair))
            for pair in pairs
        ]
        quiet(served)
        assert _lanes(served) - before >= len(pairs) - 3  # (see the tests above)
        # (a note is NULL where the key is a multiple of 5: no row)
        assert [len(rows) for rows in found] == [int(k % 5 != 0) for k in range(12, 40)] + [0, 0, 0]


def test_a_lane_that_stopped_holding_is_made_again(served: Served, tmp_path: Path) -> None:
    """A lane ends when what its role may read is due to be asked again (or with any change
    committed to the cache file); when another session has meanwhile asked it, the full path
    answers the next run at hand, and the lane must be made again then, not left ended for
    the rest of the session (the bench found one of its two sessions on the slower path for
    good, a second after it started)."""
    # (what a role may read known for 0.2 s: the lanes end; then for a minute, ample for
    # what follows)
    with (
        server_of(served.backend, tmp_path / "cache.duckdb", privilege_seconds=0.2) as own,
        psycopg.connect(own.dsn, autocommit=True, options=BOUND) as first,
        psycopg.connect(own.dsn, autocommit=True, options=BOUND) as second,
    ):
        first.execute(
            "CREATE CACHED VIEW accountcopy AS SELECT * FROM accounts REFRESH EVERY 10 MIN"
        )
        first.execute("REFRESH CACHED VIEW accountcopy")

        def reader(conn: psycopg.Connection[t.Any]) -> t.Callable[[int], object]:
            return lambda key: conn.execute(POINT, (key,), prepare=True).fetchall()

        def lane_hits(read: t.Callable[[int], object], keys: range) -> int:
            quiet(own)
            before = _lanes(own)
            for key in keys:
                read(key)
                quiet(own)
            return _lanes(own) - before

        one, two = reader(first), reader(second)
        _warm(own, one)
        _warm(own, two)
        time.sleep(0.3)  # (both lanes ended, and what the role may read is due)
        own.engine.privileges.seconds = 60.0
        assert lane_hits(two, range(1, 11)) >= 5  # (its first run asks: fresh for a minute)
        # the first run finds its lane ended and is answered at hand; the next ones by the
        # lane made again (one more may find the clock measured again meanwhile)
        assert lane_hits(one, range(1, 21)) >= 18


RANGE = "SELECT count(*), sum(abalance) FROM accounts WHERE aid BETWEEN %s AND %s"


def test_a_read_the_loop_began_is_driven_on_by_a_worker_not_begun_again(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run the event loop took whole whose read would wait (a DuckDB statement: each run
    has other values) is handed to a worker at its first wait, and the worker drives that
    same read on (`Conversation.suspended`): one read per run, not a second begun by the
    worker, and the answer PostgreSQL's."""
    begun: list[tuple[object, bool]] = []  # each read's values, and whether the loop began it
    read = Session.read

    def counted(self: Session, query: t.Any, params: t.Any = None, lane: bool = False) -> t.Any:
        begun.append((params, threading.get_ident() == served.server.loop_thread))
        return read(self, query, params, lane)

    with (
        psycopg.connect(served.dsn, autocommit=True, options=BOUND) as conn,
        psycopg.connect(served.backend, autocommit=True) as pg,
    ):
        for low in range(1, 4):  # (planned and described)
            conn.execute(RANGE, [low, low + 50], prepare=True).fetchall()
        quiet(served)
        monkeypatch.setattr(Session, "read", counted)
        runs = [(low, low + 7 * low) for low in range(10, 40)]
        for low, high in runs:
            cur = conn.execute(RANGE, [low, high], prepare=True)
            assert typed(cur.fetchall()) == typed(pg.execute(RANGE, [low, high]).fetchall())
            quiet(served)
        monkeypatch.undo()
    assert begun == [([low, high], True) for low, high in runs]
