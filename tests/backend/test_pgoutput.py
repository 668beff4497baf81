"""pgoutput decoding (cache/backend/pgoutput/) on a real stream: a slot made with an exported
snapshot over a replication connection, changes peeked through the SQL interface (and streamed:
cache/backend/replication.SlotStream), grouped into transactions in commit order with
PostgreSQL's text values."""

from __future__ import annotations

import datetime as dt
import secrets
import time
import typing as t

import psycopg
import pytest

from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.pgoutput.messages import UNCHANGED, DecodeError, decode, lsn_text, lsn_value
from cache.backend.pgoutput.transactions import Transactions
from cache.backend.replication import (
    SlotStream,
    create_publication,
    create_slot,
    drop_slot,
    slot_state,
    wal_mark,
)

PEEK = (
    "SELECT data FROM pg_logical_slot_peek_binary_changes('t_slot', NULL, NULL, "
    "'proto_version', '1', 'publication_names', 't_pub')"
)


def peek_raw(conn: psycopg.Connection[t.Any], commits: int) -> list[bytes]:
    """The slot's messages once ``commits`` transactions are in them: decoding reads the WAL
    flushed so far, and the test cluster commits asynchronously (flushed within 200 ms)."""
    deadline = time.monotonic() + 60
    while True:
        rows = [bytes(r[0]) for r in conn.execute(PEEK).fetchall()]
        if sum(r[:1] == b"C" for r in rows) >= commits or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


@pytest.fixture
def stream(pg_cluster: EmbeddedPostgres) -> t.Iterator[tuple[str, str]]:
    dsn = pg_cluster.create_database("pgoutput")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE items (id int PRIMARY KEY, label text, price numeric(8,2), notes text)"
        )
        conn.execute("INSERT INTO items VALUES (1, 'before', 1.50, NULL)")
    create_publication(dsn, "t_pub", [("public", "items")])
    with create_slot(dsn, "t_slot") as start:
        consistent = lsn_text(start.consistent_lsn)
        # the exported snapshot is the stream's starting point: it sees what came before
        with psycopg.connect(dsn) as reader:
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            reader.execute(f"SET TRANSACTION SNAPSHOT '{start.snapshot}'")
            assert reader.execute("SELECT id FROM items").fetchall() == [(1,)]
            reader.rollback()
    try:
        yield dsn, consistent
    finally:
        drop_slot(dsn, "t_slot")  # slots hold WAL back


def test_a_stream_decodes_into_transactions_in_commit_order(stream: tuple[str, str]) -> None:
    dsn, consistent = stream
    # incompressible, so stored out of line (TOAST): an update that keeps it does not send it
    big = secrets.token_hex(60_000)
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute(
                "INSERT INTO items VALUES (2, 'two', 2.25, %s), (3, NULL, NULL, NULL)", (big,)
            )
        conn.execute("UPDATE items SET label = 'after' WHERE id = 2")
        conn.execute("UPDATE items SET id = 4 WHERE id = 3")  # a key change sends the old key
        conn.execute("DELETE FROM items WHERE id = 1")
        rows = peek_raw(conn, 4)
    transactions = list(Transactions().read(rows))
    assert [[(c.kind, c.old, c.new) for _, c in tx.decoded()] for tx in transactions] == [
        [("insert", None, ("2", "two", "2.25", big)), ("insert", None, ("3", None, None, None))],
        [("update", None, ("2", "after", "2.25", UNCHANGED))],
        [("update", ("3", None, None, None), ("4", None, None, None))],
        [("delete", ("1", None, None, None), None)],
    ]
    relation = transactions[0].decoded()[0][0]
    assert (relation.schema, relation.name) == ("public", "items")
    assert [(c.name, c.key) for c in relation.columns] == [
        ("id", True),
        ("label", False),
        ("price", False),
        ("notes", False),
    ]
    lsns = [tx.commit_lsn for tx in transactions]
    assert lsns == sorted(lsns) and lsns[0] >= lsn_value(consistent)
    now = dt.datetime.now(dt.UTC)
    assert all(abs((now - tx.commit_time).total_seconds()) < 60 for tx in transactions)
    assert lsn_text(lsn_value(consistent)) == consistent


def test_a_batch_ending_mid_transaction_goes_on_with_it(stream: tuple[str, str]) -> None:
    dsn, _ = stream
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO items VALUES (5, 'five', 5, NULL)")
        rows = peek_raw(conn, 1)
    decoder = Transactions()
    assert list(decoder.read(rows[:-1])) == []  # no Commit yet: kept for the next read
    done = list(decoder.read(rows[-1:]))
    assert [tx.decoded()[0][1].new for tx in done] == [("5", "five", "5.00", None)]
    assert decoder.unfinished is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "an empty message"),
        (b"Z", "unknown message 'Z'"),
        (b"B\x00\x00", "ends early"),
        (b"I\x00\x00\x00\x01X", "expected 'N'"),
    ],
)
def test_malformed_messages_are_decode_errors(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode(data)


def test_a_change_before_its_relation_is_a_decode_error() -> None:
    begin = b"B" + bytes(8) + bytes(8) + b"\x00\x00\x00\x07"
    insert = b"I\x00\x00\x00\x09N\x00\x01n"
    commit = b"C" + bytes(1 + 8 + 8 + 8)
    with pytest.raises(DecodeError, match="relation 9 before its description"):
        [tx.decoded() for tx in Transactions().read([begin, insert, commit])]


def test_streaming_from_a_position_and_confirming(stream: tuple[str, str]) -> None:
    """The consumer's cycle: stream from the stored position, apply, store the LSN, confirm;
    a session started again after a crash before the confirmation streams from the stored
    position (what came before it is not sent), and a session holds the slot until it ends."""
    dsn, consistent = stream
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(3):
            conn.execute("INSERT INTO items VALUES (%s, 'n', 1, NULL)", (10 + i,))
        mark = wal_mark(conn)  # after the three, flushed
    first = _streamed(dsn, lsn_value(consistent), mark)
    assert [[c.new[0] for _, c in tx.decoded()] for tx in first] == [["10"], ["11"], ["12"]]
    assert [c.new for _, c in first[2].decoded()] == [("12", "n", "1.00", None)]  # text form

    session = SlotStream(dsn, "t_slot", "t_pub", first[1].end_lsn, lsn_value(consistent))
    try:
        decoder = Transactions()
        rest: list[t.Any] = []
        while session.reached <= mark:
            rest += decoder.read(session.messages(1000, wait=0.2))
            session.ping()
        assert [tx.commit_lsn for tx in rest] == [first[2].commit_lsn]
        with pytest.raises(psycopg.errors.ObjectInUse):  # one session per slot
            SlotStream(dsn, "t_slot", "t_pub", first[1].end_lsn, 0)
        session.confirm(first[1].end_lsn, wait=5.0)
        with psycopg.connect(dsn) as conn:
            state = slot_state(conn, "t_slot")
        assert state.exists and state.confirmed_lsn == first[1].end_lsn
        assert state.lag_bytes is not None and state.lag_bytes > 0
    finally:
        session.close()
    # an active session does not stop the slot from being dropped: it is ended first
    session = SlotStream(dsn, "t_slot", "t_pub", first[1].end_lsn, 0)
    try:
        assert drop_slot(dsn, "t_slot") and not drop_slot(dsn, "t_slot")
    finally:
        session.close()
    with psycopg.connect(dsn) as conn:
        assert not slot_state(conn, "t_slot").exists


def _streamed(dsn: str, start: int, until: int) -> list[t.Any]:
    """The transactions streamed from ``start`` until the server has passed ``until``."""
    session = SlotStream(dsn, "t_slot", "t_pub", start, 0)
    decoder, found = Transactions(), []
    deadline = time.monotonic() + 60
    try:
        while session.reached <= until and time.monotonic() < deadline:
            found += decoder.read(session.messages(1000, wait=0.2))
            session.ping()
    finally:
        session.close()
    return found


def test_a_big_transaction_is_streamed_in_progress_and_spilled_in_pieces(
    stream: tuple[str, str], tmp_path: t.Any
) -> None:
    """Protocol 2 with streaming: a transaction past the backend's logical_decoding_work_mem
    arrives in stream blocks before its commit; its changes go to disk in pieces, read back
    in order at the commit, a rolled-back subtransaction's changes left out; a transaction
    rolled back whole yields nothing and leaves no file."""
    dsn, consistent = stream
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER DATABASE pgoutput SET logical_decoding_work_mem = '64kB'")
        with conn.transaction():
            conn.execute(
                "INSERT INTO items SELECT g, 'big ' || g, g, repeat('x', 200) "
                "FROM generate_series(100, 2099) g"
            )
            conn.execute("SAVEPOINT s")
            conn.execute("UPDATE items SET label = 'undone' WHERE id BETWEEN 100 AND 1099")
            conn.execute("ROLLBACK TO SAVEPOINT s")
            conn.execute("UPDATE items SET label = 'kept' WHERE id BETWEEN 2000 AND 2099")
        try:
            with conn.transaction():
                conn.execute(
                    "INSERT INTO items SELECT g, 'gone', g, repeat('y', 200) "
                    "FROM generate_series(5000, 6999) g"
                )
                raise RuntimeError("roll it back")
        except RuntimeError:
            pass
        conn.execute("INSERT INTO items VALUES (9, 'after', 9, NULL)")
        mark = wal_mark(conn)
    spill = tmp_path / "spill"
    session = SlotStream(dsn, "t_slot", "t_pub", lsn_value(consistent), 0)
    decoder, found = Transactions(spill_dir=spill, spill_changes=300), []
    try:
        deadline = time.monotonic() + 60
        while session.reached <= mark and time.monotonic() < deadline:
            found += decoder.read(session.messages(1000, wait=0.2))
            session.ping()
    finally:
        session.close()
    assert decoder.blocks > 1  # streamed while in progress
    big, after = found
    assert big.spill is not None and big.size > 2100
    pieces = list(big.pieces())
    assert len(pieces) > 2 and all(p.count <= 300 for p in pieces)
    changes = [c for p in pieces for _, c in p.decoded()]
    assert [c.new[0] for c in changes[:2000]] == [str(g) for g in range(100, 2100)]
    labels = [c.new[1] for c in changes[2000:]]
    assert labels == ["kept"] * 100  # the rolled-back subtransaction's updates left out
    assert {p.commit_lsn for p in pieces} == {big.commit_lsn}
    assert [c.new for _, c in after.decoded()] == [("9", "after", "9.00", None)]
    big.discard()
    assert not list(spill.iterdir())  # (the rolled-back transaction left nothing either)
