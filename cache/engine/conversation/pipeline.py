"""The backend's side of a client's conversation: what the client's messages ask of the
backend, sent on the session's connection in libpq's pipeline mode without waiting, and
their answers given to the client in the order of its messages (`BackendPipeline.queue`:
answers made without the backend wait their turn among those the backend gives). Statements
are parsed at the backend under the server's names (shared by the sessions of a pool);
results are relayed as the client's messages (`relay`), COPY included."""

from __future__ import annotations

import contextlib
import dataclasses
import typing as t
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
from psycopg import pq
from psycopg.pq import ExecStatus

from cache.backend.session_pool import PREPARED_LIMIT
from cache.engine.conversation.statements import Out, Statement, result_formats
from cache.engine.link import relay
from cache.engine.session import Session
from cache.wire import protocol
from cache.wire.state import ProtocolState, Step


class Sink:
    """Where a conversation's answers go (the server's writer); muted while the answers of
    a failed cycle are read past (`BackendPipeline.read_past`)."""

    __slots__ = ("_muted", "write")

    def __init__(self, write: Out) -> None:
        self.write = write
        self._muted = False

    def __call__(self, data: bytes) -> None:
        if not self._muted:
            self.write(data)

    @contextlib.contextmanager
    def muted(self) -> Iterator[None]:
        muted, self._muted = self._muted, True
        try:
            yield
        finally:
            self._muted = muted


@dataclass
class Expect:
    """What the client gets for one piped backend command, in order: ``read`` takes the
    command's results off the backend and writes the client's messages."""

    read: Callable[[], bool]  # False: the command failed (an ErrorResponse was written)


@dataclass
class Ready:
    data: bytes  # messages made without the backend, sent in their turn


@dataclass
class Relaying:
    """A backend command's results on their way to the client (`BackendPipeline.relay`)."""

    conn: psycopg.Connection[t.Any]
    out: Out
    simple: bool
    mixed: list[int] | None
    ok: bool = True
    described: bool = False  # (simple) the rows under way were described
    transcoder: relay.Transcoder | None = None
    tag: relay.Tag = dataclasses.field(default_factory=relay.Tag)


class BackendPipeline:
    """The session's backend connection as one client's conversation uses it (see the
    module). ``error``: how a backend's ErrorResponse reaches the client (the conversation's,
    which ends the session after a FATAL one); ``next_message``: the client's next message
    (COPY FROM STDIN takes its data so)."""

    def __init__(
        self,
        session: Session,
        out: Sink,
        state: ProtocolState,
        error: Callable[[bytes], None],
        next_message: Callable[[], protocol.Message],
    ) -> None:
        self.session = session
        self.out = out
        self.state = state
        self._error = error
        self._next_message = next_message
        self.queue: deque[Expect | Ready] = deque()
        self.piped = False  # the backend connection is in pipeline mode
        self._unnamed_owner: Statement | None = None  # whose text the backend's "" holds
        self._unnamed_at = 0  # the link's `statements` when it was parsed
        self._names = 0

    @property
    def quiet(self) -> bool:
        """Nothing of the client's waits here: no answer queued, no pipeline under way."""
        return not self.queue and not self.piped

    def connection(self) -> psycopg.Connection[t.Any]:
        return self.session.link.connection()

    def enter(self) -> pq.abc.PGconn:
        """The connection, in pipeline mode."""
        pgconn = self.connection().pgconn
        if not self.piped:
            pgconn.enter_pipeline_mode()
            self.piped = True
        return pgconn

    def leave(self) -> pq.abc.PGconn:
        """The connection out of pipeline mode (every result read: `drain` first)."""
        pgconn = self.connection().pgconn
        if self.piped:
            pgconn.exit_pipeline_mode()
            self.piped = False
        return pgconn

    # -- the answers, in order -----------------------------------------------------------------

    def ready(self, data: bytes) -> None:
        """An answer made without the backend, sent in its turn."""
        self.queue.append(Ready(data))

    def expect(self, read: Callable[[], bool]) -> None:
        """An answer the backend gives, read in its turn (False: it failed)."""
        self.queue.append(Expect(read))

    def expect_command(
        self,
        pgconn: pq.abc.PGconn,
        done: Callable[[pq.abc.PGresult], None],
        failed: Callable[[], None] | None = None,
    ) -> None:
        """A piped command (Parse, Describe) answered in its turn: ``done`` with its result,
        or, when the backend refused it, its ErrorResponse for the client (and ``failed``)."""

        def read() -> bool:
            result = self._command_result(pgconn)
            if result.status != ExecStatus.COMMAND_OK:
                if failed is not None:
                    failed()
                self._error(relay.diagnostic_message(result))
                return False
            done(result)
            return True

        self.expect(read)

    def discard_result(self, pgconn: pq.abc.PGconn) -> None:
        """A piped command whose result the client does not see."""
        self.expect(lambda: bool(self._command_result(pgconn)) or True)

    def _command_result(self, pgconn: pq.abc.PGconn) -> pq.abc.PGresult:
        """A command's one result, then libpq's end of its results."""
        result = relay.wait_result(pgconn)
        assert result is not None
        while relay.wait_result(pgconn) is not None:
            pass
        return result

    def drain(self, leave_pipeline: bool = False) -> None:
        """Answer what is queued, in order; ``leave_pipeline``: end libpq's pipeline mode
        (after a Sync, or before the engine uses the connection)."""
        queue = self.queue
        if self.piped:
            pgconn = self.connection().pgconn
            if any(isinstance(item, Expect) for item in queue):
                if not leave_pipeline:
                    pgconn.send_flush_request()
                relay.flush(pgconn)
        else:
            pgconn = None
        while queue:
            self._answer(queue.popleft())
        if self.piped and leave_pipeline and pgconn is not None:
            # the Sync's own result, then out of pipeline mode
            while True:
                result = relay.wait_result(pgconn)
                if result is not None and result.status == ExecStatus.PIPELINE_SYNC:
                    break
                if result is None and pgconn.status == pq.ConnStatus.BAD:
                    self.piped = False  # (the connection is gone: the session ends)
                    raise psycopg.OperationalError("the backend connection was lost")
            pgconn.exit_pipeline_mode()
            self.piped = False
            self.session.settle()

    def answer_ready(self) -> None:
        """The queued answers whose backend results are all here, in order, until one that
        is not (nothing waits)."""
        if not self.piped:
            return
        pgconn = self.connection().pgconn
        queue = self.queue
        while queue:
            item = queue[0]
            if isinstance(item, Expect) and pgconn.is_busy():
                return
            self._answer(queue.popleft())

    def _answer(self, item: Expect | Ready) -> None:
        """One queued answer given; after a failure (the state drops what follows until
        Sync), read past."""
        if isinstance(item, Ready):
            if not self.state.ignoring:
                self.out(item.data)
        elif self.state.ignoring:
            self.read_past(item)
        elif not item.read():
            self.state.error()

    def read_past(self, item: Expect) -> None:
        """A queued command's results read and dropped (an earlier one failed: the client
        gets nothing more until its Sync)."""
        with self.out.muted():
            item.read()

    def sent(self) -> None:
        """The client sent nothing more for now: what its pipeline queued for the backend
        goes there, so that the backend runs it as PostgreSQL would (its answers wait for
        the client's Sync or Flush, but for an error: `answer_ready`)."""
        if self.piped and any(isinstance(item, Expect) for item in self.queue):
            relay.flush(self.connection().pgconn)

    def sync(self) -> None:
        """The client's Sync: the backend's, and every queued answer given."""
        if self.piped:
            self.connection().pgconn.pipeline_sync()
        self.drain(leave_pipeline=True)

    # -- statements at the backend -------------------------------------------------------------

    def parse(self, statement: Statement, name: bytes, answer: bytes) -> None:
        """A passed-through statement the client prepared as ``name``, parsed at the backend
        under the server's name for it (``answer``, ParseComplete, when it is)."""
        link = self.session.link
        backend_name = b""  # the backend's names are the server's (the engine names too)
        if name and link.pooled:  # named by its text: pooled sessions share it
            backend_name = statement.pooled_name()
            if link.if_open() is None or self.holds(statement, backend_name):
                # parsed at the backend when first used (`ensure`): a client that prepares
                # synchronously for many sessions (pgbench's threads) waits for no pooled
                # connection here while its other sessions hold them
                statement.backend_name = backend_name
                self.ready(answer)
                return
        elif name:
            self._names += 1
            backend_name = f"mtcache_{self._names}".encode()
        self.prepare(statement, backend_name, answer)

    def prepare(self, statement: Statement, backend_name: bytes, answer: bytes = b"") -> None:
        """Parse the statement at the backend under this name; ``answer`` for the client
        when it succeeds."""
        pgconn = self.enter()
        if not backend_name:
            self._unnamed_owner = statement
            self._unnamed_at = self.session.link.statements
        statement.backend_name = backend_name
        prepared = self.session.link.prepared
        if prepared is not None and backend_name:  # (a pooled connection's: oldest closed)
            prepared[backend_name] = None
            while len(prepared) > PREPARED_LIMIT:
                oldest, _ = prepared.popitem(last=False)
                pgconn.send_close_prepared(oldest)
                self.discard_result(pgconn)
        pgconn.send_prepare(backend_name, statement.sql, statement.param_types or None)

        def failed() -> None:
            statement.backend_name = None
            if prepared is not None:
                prepared.pop(backend_name, None)

        self.expect_command(pgconn, lambda _: self.out(answer), failed)

    def ensure(self, statement: Statement) -> None:
        """Parse the statement at the backend again if its unnamed statement was replaced."""
        if not self.holds(statement):
            self.prepare(statement, statement.backend_name or b"")

    def holds(self, statement: Statement, name: bytes | None = None) -> bool:
        """Whether the backend holds the statement parsed (under ``name``, else its own): its
        unnamed statement may have been replaced since, and a pooled connection may be
        another than the one it was parsed on."""
        name = statement.backend_name if name is None else name
        if name is None:
            return False
        link = self.session.link
        if name == b"":
            return (
                self._unnamed_owner is statement and self._unnamed_at == link.statements
            )  # (the engine's took it)
        prepared = link.prepared
        if prepared is None:
            return not link.pooled  # (a session's own connection holds its own)
        if name not in prepared:
            return False
        prepared.move_to_end(name)
        return True

    def forget_unnamed(self) -> None:
        """The backend's unnamed statement was taken by another text than a client's."""
        self._unnamed_owner = None

    def close(self, statement: Statement) -> None:
        """The client closed a statement: closed at the backend too (but a pooled one's,
        shared: the oldest are closed, `prepare`)."""
        name = statement.backend_name
        statement.backend_name = None
        if not name or self.session.link.pooled:
            return
        pgconn = self.enter()
        pgconn.send_close_prepared(name)
        self.discard_result(pgconn)

    def close_portal(self, name: bytes) -> None:
        """A cursor the client declared at the backend, closed there."""
        pgconn = self.enter()
        pgconn.send_close_portal(name)
        self.discard_result(pgconn)

    def describe_portal(self, name: bytes) -> None:
        """A cursor the client declared at the backend (``DECLARE c CURSOR FOR ...``, as
        psycopg's server-side cursors do), described there (where, if it does not exist
        either, the backend says so)."""
        pgconn = self.enter()
        pgconn.send_describe_portal(name)
        self.expect_command(
            pgconn,
            lambda result: self.out(
                protocol.row_description(relay.fields_of(result))
                if result.nfields
                else protocol.NO_DATA
            ),
        )

    def own_statement(
        self, pgconn: pq.abc.PGconn, sql: bytes, params: list[bytes | None] | None = None
    ) -> pq.abc.PGresult | None:
        """A statement of the server's own on the session's connection (outside a pipeline):
        its first result, the rest read and dropped. It takes the backend's unnamed
        statement, which a client's unnamed statement then no longer is."""
        self._unnamed_owner = None
        pgconn.send_query_params(sql, params)
        relay.flush(pgconn)
        found = relay.wait_result(pgconn)
        while relay.wait_result(pgconn) is not None:
            pass
        return found

    # -- the backend's results as the client's messages ----------------------------------------

    def relay(
        self,
        conn: psycopg.Connection[t.Any],
        out: Out,
        *,
        simple: bool,
        mixed: list[int] | None = None,
    ) -> bool:
        """A backend command's results as the client's messages (``simple``: a Query
        message's, each row set with its RowDescription, COPY relayed; ``mixed``: the
        client's per-column formats where libpq sent text): False if it failed."""
        relaying = Relaying(conn, out, simple, mixed)
        while (result := relay.wait_result(conn.pgconn)) is not None:
            self.relay_result(relaying, result)
        return relaying.ok

    def relay_result(self, relaying: Relaying, result: pq.abc.PGresult) -> None:
        """One result of a backend command (`relay`)."""
        out, simple = relaying.out, relaying.simple
        status = result.status
        if status in relay.ROWS:
            if simple and not relaying.described:
                out(protocol.row_description(relay.fields_of(result)))
                relaying.described = True
            if relaying.mixed is not None and relaying.transcoder is None:
                formats = relay.result_formats(relaying.mixed, result.nfields)
                relaying.transcoder = relay.Transcoder(relaying.conn, result, formats)
            relay.send_rows(result, out, relaying.transcoder)
            if relaying.tag.seen(result):
                out(protocol.command_complete(relaying.tag.take()))
                relaying.described = False
        elif status == ExecStatus.COMMAND_OK:
            out(protocol.command_complete(result.command_status or b""))
        elif status == ExecStatus.EMPTY_QUERY:
            out(protocol.EMPTY_QUERY)
        elif status == ExecStatus.PIPELINE_ABORTED:
            relaying.ok = False
        elif status == ExecStatus.COPY_OUT:  # (never piped: `Conversation.execute_copy`)
            self._copy_out(relaying.conn, result)
        elif status == ExecStatus.COPY_IN:
            self._copy_in(relaying.conn, result)
        else:
            self._error(relay.diagnostic_message(result))
            relaying.ok = False

    def _copy_out(self, conn: psycopg.Connection[t.Any], result: pq.abc.PGresult) -> None:
        pgconn = conn.pgconn
        self.out(protocol.copy_response(b"H", bool(result.binary_tuples), result_formats(result)))
        while True:
            n, data = pgconn.get_copy_data(1)
            if n == 0:
                relay.wait_readable(pgconn)
                pgconn.consume_input()
                continue
            if n < 0:
                break
            self.out(protocol.copy_data(bytes(data)))
        self.out(protocol.COPY_DONE)

    def _copy_in(self, conn: psycopg.Connection[t.Any], result: pq.abc.PGresult) -> None:
        """COPY FROM STDIN: the client's CopyData to the backend until CopyDone (or
        CopyFail); Flush and Sync are dropped meanwhile, as PostgreSQL does
        (`ProtocolState.receive`)."""
        pgconn = conn.pgconn
        state = self.state
        self.out(protocol.copy_response(b"G", bool(result.binary_tuples), result_formats(result)))
        state.copy_in()
        try:
            while True:
                message = self._next_message()
                step = state.receive(message)
                if step is Step.IGNORE:
                    continue
                if isinstance(message, protocol.CopyData):
                    while pgconn.put_copy_data(message.data) == 0:
                        relay.wait_writable(pgconn)
                elif isinstance(message, protocol.CopyDone):
                    pgconn.put_copy_end()
                    break
                elif isinstance(message, protocol.CopyFail):
                    pgconn.put_copy_end(message.message or b"COPY failed")
                    break
                else:
                    pgconn.put_copy_end(b"unexpected message type during COPY from stdin")
                    break
        finally:
            state.copy_over()
        relay.flush(pgconn)


__all__ = ["BackendPipeline", "Expect", "Ready", "Relaying", "Sink"]
