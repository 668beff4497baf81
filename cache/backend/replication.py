"""The backend side of continuous maintenance (SPEC §6): a publication and a logical
replication slot per cache file, read through the SQL interface (psycopg cannot run
START_REPLICATION), decoded by `cache.backend.pgoutput`.

`create_slot` makes the slot over a replication connection with an exported snapshot and
keeps that connection open while the caller pulls in the snapshot (the snapshot lives only as
long as the connection that exported it, idle): the pull and the stream meet exactly at the
slot's consistent point. `peek` reads the complete transactions after the slot's confirmed
position without consuming them; `advance` confirms up to an LSN once the changes are safely
applied (the consumer stores the LSN with them, so a crash in between re-reads and skips).
"""

from __future__ import annotations

import typing as t
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import sql

from cache.backend.pgoutput import Transaction, Transactions, lsn_text, lsn_value
from cache.backend.reflect import connect_backend
from sql_ext.errors import translate


@dataclass(frozen=True)
class SlotStart:
    consistent_lsn: int  # changes committed after this are in the stream
    snapshot: str  # the exported snapshot of that point (valid inside `create_slot` only)


@dataclass(frozen=True)
class SlotState:
    exists: bool
    confirmed_lsn: int | None  # what the consumer has confirmed applied
    lag_bytes: int | None  # WAL written since then


def create_publication(dsn: str, publication: str, tables: list[tuple[str, str]]) -> None:
    """(Re)make ``publication`` over the (schema, table)s."""
    names = sql.SQL(", ").join(sql.Identifier(s, n) for s, n in tables)
    with connect_backend(dsn, autocommit=True) as conn:
        try:
            exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s",
                                  (publication,)).fetchone()  # fmt: skip
            # ALTER: the slot decodes on with the new table list from this commit on
            verb = "ALTER PUBLICATION {} SET TABLE {}" if exists else \
                "CREATE PUBLICATION {} FOR TABLE {}"  # fmt: skip
            conn.execute(sql.SQL(verb).format(sql.Identifier(publication), names))
        except psycopg.Error as exc:
            raise translate(exc, "creating the publication for continuous maintenance") from exc


def drop_publication(dsn: str, publication: str) -> None:
    with connect_backend(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication)))


@contextmanager
def create_slot(dsn: str, slot: str) -> Iterator[SlotStart]:
    """Create the slot; inside the block its exported snapshot can be joined
    (``SET TRANSACTION SNAPSHOT``) by other sessions."""
    with connect_backend(dsn, autocommit=True, replication="database") as rep:
        try:
            row = rep.execute(sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput "
                                      "(SNAPSHOT 'export')").format(sql.Identifier(slot))
                              ).fetchone()  # fmt: skip
        except psycopg.Error as exc:
            raise translate(exc, "creating the replication slot for continuous maintenance") \
                from exc  # fmt: skip
        assert row is not None
        yield SlotStart(lsn_value(row[1]), row[2])


def drop_slot(dsn: str, slot: str) -> bool:
    """Drop the slot if it exists (a slot left behind holds the backend's WAL)."""
    with connect_backend(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots "
            "WHERE slot_name = %s", (slot,)
        ).fetchone()
    return bool(row and row[0])


def slot_state(conn: psycopg.Connection[t.Any], slot: str) -> SlotState:
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text, pg_wal_lsn_diff(pg_current_wal_lsn(), "
        "confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    if row is None:
        return SlotState(False, None, None)
    return SlotState(True, lsn_value(row[0]) if row[0] else None, row[1])


def peek(
    conn: psycopg.Connection[t.Any], slot: str, publication: str, decoder: Transactions,
    limit: int = 10_000,
) -> list[Transaction]:  # fmt: skip
    """The complete transactions after the slot's confirmed position (up to about ``limit``
    messages), not consumed."""
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, %s, "
        "'proto_version', '1', 'publication_names', %s)", (slot, limit, publication)
    ).fetchall()
    return list(decoder.read(r[0] for r in rows))


def advance(conn: psycopg.Connection[t.Any], slot: str, lsn: int) -> None:
    """Confirm everything up to ``lsn`` applied: the backend may recycle that WAL."""
    conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, lsn_text(lsn)))
