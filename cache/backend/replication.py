"""The backend side of continuous maintenance: a publication and a logical
replication slot per cache file, read as a stream (START_REPLICATION over psycopg's libpq
wrapper) and decoded by `cache.backend.pgoutput`.

`create_slot` makes the slot over a replication connection with an exported snapshot and
keeps that connection open while the caller pulls in the snapshot (the snapshot lives only as
long as the connection that exported it, idle): the pull and the stream meet exactly at the
slot's consistent point. `SlotStream` is one streaming session: the backend decodes each
transaction once, as it commits, and pushes it; the consumer confirms what it has applied
with standby status updates (it stores the LSN with the changes, so a crash before a
confirmation streams again from its stored position and skips nothing, applies nothing
twice). `wal_mark` gives a position the stream must pass to have brought everything
committed before it.
"""

from __future__ import annotations

import select
import struct
import time
import typing as t
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import pq, sql

from cache.backend.pgoutput.messages import lsn_text, lsn_value
from cache.backend.reflect import connect_backend
from cache.backend.requirements import STREAM, backend_requirements
from sql_ext.errors import OperationalError, translate


@dataclass(frozen=True)
class SlotStart:
    consistent_lsn: int  # changes committed after this are in the stream
    snapshot: str  # the exported snapshot of that point (valid inside `create_slot` only)


@dataclass(frozen=True)
class SlotState:
    exists: bool
    confirmed_lsn: int | None  # what the consumer has confirmed applied
    lag_bytes: int | None  # WAL written since then


def check_stream(dsn: str) -> None:
    """Refuse, before anything is made at the backend (a publication, a slot, the heartbeat
    table), a backend that cannot stream to the cache (`stream_requirements`)."""
    with connect_backend(dsn, autocommit=True) as conn:
        needs = backend_requirements(conn)
    unmet = [r.change for r in needs if r.needed_for == STREAM and not r.met]
    if unmet:
        raise OperationalError(
            "REFRESH CONTINUOUSLY needs the backend's logical replication, and nothing was "
            "changed: " + "; ".join(unmet)
        )


def create_publication(dsn: str, publication: str, tables: list[tuple[str, str]]) -> None:
    """(Re)make ``publication`` over the (schema, table)s."""
    names = sql.SQL(", ").join(sql.Identifier(s, n) for s, n in tables)
    with connect_backend(dsn, autocommit=True) as conn:
        try:
            exists = conn.execute(
                "SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)
            ).fetchone()
            # ALTER: the slot decodes on with the new table list from this commit on
            verb = (
                "ALTER PUBLICATION {} SET TABLE {}"
                if exists
                else "CREATE PUBLICATION {} FOR TABLE {}"
            )
            conn.execute(sql.SQL(verb).format(sql.Identifier(publication), names))
        except psycopg.Error as exc:
            raise translate(exc, "creating the publication for continuous maintenance") from exc


def publication_tables(dsn: str, publication: str) -> tuple[tuple[str, str], ...]:
    """The (schema, table)s ``publication`` carries (none: it does not exist)."""
    with connect_backend(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s "
            "ORDER BY 1, 2",
            (publication,),
        ).fetchall()
    return tuple((str(s), str(n)) for s, n in rows)


def drop_publication(dsn: str, publication: str) -> None:
    with connect_backend(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication)))


@contextmanager
def create_slot(dsn: str, slot: str) -> Iterator[SlotStart]:
    """Create the slot; inside the block its exported snapshot can be joined
    (``SET TRANSACTION SNAPSHOT``) by other sessions."""
    with connect_backend(dsn, autocommit=True, replication="database") as rep:
        try:
            row = rep.execute(
                sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'export')").format(
                    sql.Identifier(slot)
                )
            ).fetchone()
        except psycopg.Error as exc:
            raise translate(
                exc, "creating the replication slot for continuous maintenance"
            ) from exc
        assert row is not None
        yield SlotStart(lsn_value(row[1]), row[2])


def drop_slot(dsn: str, slot: str, wait: float = 10.0) -> bool:
    """Drop the slot if it exists (a slot left behind holds the backend's WAL), ending the
    session that streams it, if any (a process of this cache file that is gone, or going)."""
    deadline = time.monotonic() + wait
    with connect_backend(dsn, autocommit=True) as conn:
        while True:
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE slot_name = %s AND active_pid IS NOT NULL",
                (slot,),
            )
            try:
                row = conn.execute(
                    "SELECT count(pg_drop_replication_slot(slot_name)) FROM "
                    "pg_replication_slots WHERE slot_name = %s",
                    (slot,),
                ).fetchone()
            except psycopg.errors.ObjectInUse:  # its session is still ending
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
                continue
            return bool(row and row[0])


def slot_state(conn: psycopg.Connection[t.Any], slot: str) -> SlotState:
    row = conn.execute(
        "SELECT confirmed_flush_lsn::text, pg_wal_lsn_diff(pg_current_wal_lsn(), "
        "confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    if row is None:
        return SlotState(False, None, None)
    return SlotState(True, lsn_value(row[0]) if row[0] else None, row[1])


def wal_mark(conn: psycopg.Connection[t.Any]) -> int:
    """A WAL position after every transaction committed so far, flushed: a logical message in
    a transaction of its own, committed synchronously (decoding reads flushed WAL only; the
    publication does not carry messages, so the stream passes it silently)."""
    with conn.transaction():
        conn.execute("SET LOCAL synchronous_commit = on")
        row = conn.execute("SELECT pg_logical_emit_message(true, 'mtcache', '')::text").fetchone()
    assert row is not None
    return lsn_value(row[0])


PG_EPOCH_UNIX = 946_684_800  # 2000-01-01, where the protocol's microseconds count from
# the backend's memory for a transaction's changes before it streams them (kB; its default
# is 64MB): the most that is left to send at a big transaction's commit
STREAM_WORK_MEM_KB = 8192
GATHER_SECONDS = 0.002  # a batch goes on while the next messages arrive within this long
GATHER_PAUSE = 0.0005  # and those arriving are let gather this long before they are read
XLOG_DATA = 25  # 'w', start LSN, end LSN, send time: then the pgoutput message
KEEPALIVE = struct.Struct("!QqB")  # after 'k': the server's WAL position, send time, reply?
STATUS = struct.Struct("!cQQQqB")  # 'r', written, flushed, applied, client time, reply?


class SlotStream:
    """One streaming session of a slot from ``start`` (`messages`: the pgoutput messages in
    commit order; `reached`: a position the server has sent everything before; `confirm`:
    the slot may recycle WAL up to an LSN). One thread at a time."""

    def __init__(self, dsn: str, slot: str, publication: str, start: int, confirmed: int):
        self.slot = slot
        self.confirmed = confirmed  # what this session last told the server is applied
        self.reached = 0
        self._keepalives = 0
        self._held: list[bytes] = []  # messages read while waiting for a reply
        self._conn = connect_backend(dsn, autocommit=True, replication="database")
        self._pg = self._conn.pgconn
        # protocol 2 streams a big transaction while it is in progress (PostgreSQL 14 on)
        streams = self._pg.server_version >= 140000
        options = "proto_version '2', streaming 'on'" if streams else "proto_version '1'"
        command = sql.SQL(
            "START_REPLICATION SLOT {} LOGICAL {} (" + options + ", publication_names {})"
        ).format(sql.Identifier(slot), sql.SQL(lsn_text(start)), sql.Literal(publication))
        try:
            if streams:
                self._stream_sooner()
            self._pg.send_query(command.as_bytes(self._conn))
            result = self._pg.get_result()
            if result is None or result.status != pq.ExecStatus.COPY_BOTH:
                raise (
                    psycopg.errors.error_from_result(result)
                    if result is not None
                    else psycopg.OperationalError(self._error())
                )
        except BaseException:
            self._conn.close()  # a session that did not start holds nothing
            raise

    def _stream_sooner(self) -> None:
        """This session's backend streams a transaction once it holds more than
        `STREAM_WORK_MEM_KB` of its changes (lower than the default 64MB; a lower setting is
        kept): what is left to send at the commit is no more than that."""
        found = self._pg.exec_(
            b"SELECT setting FROM pg_settings WHERE name = 'logical_decoding_work_mem'"
        )
        if found.status != pq.ExecStatus.TUPLES_OK or found.ntuples != 1:
            raise psycopg.errors.error_from_result(found)
        if int(found.get_value(0, 0) or 0) > STREAM_WORK_MEM_KB:
            done = self._pg.exec_(f"SET logical_decoding_work_mem = {STREAM_WORK_MEM_KB}".encode())
            if done.status != pq.ExecStatus.COMMAND_OK:
                raise psycopg.errors.error_from_result(done)

    def messages(self, limit: int, wait: float = 0.0) -> list[bytes]:
        """The messages that have arrived (up to about ``limit``); if none, waiting up to
        ``wait`` seconds for the server to send something (a keepalive ends the wait too)."""
        out, self._held = self._held, []
        self._pump(out, limit, wait, lambda: True, gather=GATHER_SECONDS)
        return out

    def confirm(self, lsn: int, wait: float = 0.0) -> None:
        """Tell the server everything up to ``lsn`` is applied; with ``wait``, until it has
        taken it in (its reply), at most that many seconds."""
        seen = self._keepalives
        self._send(lsn, reply=wait > 0)
        if wait > 0:
            self._pump(self._held, 1 << 30, wait, lambda: self._keepalives > seen)

    def ping(self) -> None:
        """Ask the server where it is (its reply moves `reached`)."""
        self._send(self.confirmed, reply=True)

    def fileno(self) -> int:
        return self._pg.socket

    def close(self, confirm: int | None = None) -> None:
        """End the session (the slot is free for the next), confirming ``confirm`` first."""
        try:
            if confirm is not None and confirm > self.confirmed:
                self.confirm(confirm, wait=2.0)
        finally:
            self._conn.close()

    def _pump(
        self,
        out: list[bytes],
        limit: int,
        wait: float,
        done: t.Callable[[], bool],
        gather: float = 0.0,
    ) -> None:
        """Read messages into ``out`` until ``done`` once some came (or ``wait`` passed); with
        ``gather``, on while more arrive within that many seconds, up to ``limit``."""
        deadline = time.monotonic() + wait
        pg, taken, drained = self._pg, 0, False
        get, keep = pg.get_copy_data, out.append
        while len(out) < limit:
            size, data = get(1)
            if size > 0:  # (the hot path: one message per row changed, kept inline)
                if data[0] == 0x77:  # 'w': XLogData
                    keep(data[XLOG_DATA:].tobytes())
                else:
                    self._take(data, out)
                taken += 1
                drained = False
                continue
            if size < 0:
                raise self._ended(size)
            if not drained:  # what the socket holds already
                pg.consume_input()
                drained = True
                continue
            if (taken or out) and done():
                # a batch in hand: more of it is on its way when the server is streaming (the
                # socket held a few messages each time: 187,000 batches of 5 for 10^6 rows)
                if not gather or not select.select([pg.socket], [], [], gather)[0]:
                    return
                time.sleep(GATHER_PAUSE)  # (more of it: read in one go, not a few at a time)
                pg.consume_input()
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            select.select([pg.socket], [], [], remaining)
            pg.consume_input()

    def _take(self, data: t.Any, out: list[bytes]) -> None:
        kind = data[0]
        if kind == 0x77:  # 'w': XLogData
            out.append(bytes(data[XLOG_DATA:]))
        elif kind == 0x6B:  # 'k': keepalive (everything before its position has been sent)
            position, _, reply = KEEPALIVE.unpack_from(data, 1)
            self.reached = max(self.reached, position)
            self._keepalives += 1
            if reply:
                self._send(self.confirmed, reply=False)

    def _send(self, lsn: int, reply: bool) -> None:
        now = int((time.time() - PG_EPOCH_UNIX) * 1_000_000)
        if (
            self._pg.put_copy_data(STATUS.pack(b"r", lsn, lsn, lsn, now, reply)) != 1
            or self._pg.flush() != 0
        ):
            raise psycopg.OperationalError(self._error())
        self.confirmed = max(self.confirmed, lsn)

    def _ended(self, size: int) -> Exception:
        if size == -1:  # the server ended the stream: its reason is in the result
            result = self._pg.get_result()
            if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
                return psycopg.errors.error_from_result(result)
        return psycopg.OperationalError(self._error() or "the replication stream ended")

    def _error(self) -> str:
        return self._pg.error_message.decode(errors="replace").strip()
