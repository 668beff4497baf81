"""One client's conversation with the server, after startup: the messages of the simple and
extended query protocols, each answered by the session engine (cached reads and the cache's
own statements) or passed through to the backend on the session's own connection
(`pipeline`).

`Conversation.handle(message)` takes one message and writes the answer to ``out``; it does
no socket I/O with the client (`cache.server` moves the bytes). What each message does to
the protocol's state is `cache.wire.state`'s: answers leave in the order of the messages,
and after an error in an extended cycle every message up to the next Sync is dropped. The
backend's work of a pipeline is sent without waiting (libpq's pipeline mode) and its answers
are read in order when the client syncs or flushes, or when a statement the engine answers
comes next. The event loop's ways to answer a whole run at once are `at_once`'s.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
import typing as t
from collections.abc import Callable

import psycopg
from psycopg import pq

from cache.engine import inspect
from cache.engine.conversation.answers import LocalAnswers
from cache.engine.conversation.pipeline import BackendPipeline, Sink
from cache.engine.conversation.reported import Description
from cache.engine.conversation.settings import ClientSettings
from cache.engine.conversation.statements import (
    Out,
    Portal,
    Refusal,
    Statement,
    SuspendedRead,
    Unreadable,
    bind_formats,
    decoders,
    effects,
    encodes,
    field,
    named,
)
from cache.engine.conversation.statistics import StatementStats
from cache.engine.link import relay
from cache.engine.read import drive
from cache.engine.result import Result
from cache.engine.route import CacheDdl, CachedRead, Passthrough, Route, Write
from cache.engine.session import Session
from cache.wire import protocol, values
from cache.wire.protocol import Field, ProtocolViolation
from cache.wire.state import ProtocolState, Step
from sql_ext.errors import Error, QueryCanceledError, diag_fields, diagnostics
from sql_ext.placeholders import to_engine
from sql_ext.statements import split_statements

log = logging.getLogger("mtcache.server")

_Described = Callable[[tuple[int, ...], list[Field] | None], None]

_STATUS = {
    pq.TransactionStatus.IDLE: b"I",
    pq.TransactionStatus.INTRANS: b"T",
    pq.TransactionStatus.INERROR: b"E",
}

# what makes the backend's transaction block fail when the cache failed one of its statements
_FAIL_TRANSACTION = (
    b"DO $$BEGIN RAISE EXCEPTION 'mtcache: the cache server failed a "
    b"statement of this transaction block'; END$$"
)


class Conversation:
    """The protocol conversation of one client connection (see the module)."""

    def __init__(
        self,
        session: Session,
        out: Out,
        settings: values.OutputSettings,
        describe: Callable[..., Description],
        next_message: Callable[[], protocol.Message],
        reported: dict[str, str],
        *,
        max_result_bytes: int | None = None,
        statement_stats: StatementStats | None = None,
    ) -> None:
        self.session = session
        self.out = Sink(out)
        self.state = ProtocolState()
        self.pipeline = BackendPipeline(
            session, self.out, self.state, self.backend_error, next_message
        )
        self.answers = LocalAnswers(session, self.out)
        self.client = ClientSettings(
            session, self.out, self.pipeline, self.answers.notice, settings, reported
        )
        self.answers.client = self.client
        self.answers.max_result_bytes = max_result_bytes
        self._describe = describe  # the backend's description of a statement, cached
        session.add_notice_handler(self._notice)
        self.statements: dict[bytes, Statement] = {}
        self.portals: dict[bytes, Portal] = {}
        self.cancel_reason: str | None = None  # why the running statement is cancelled
        self.listening = False  # a LISTEN reached the backend: notifications may come
        self.told_pid = 0  # the process id the client was told (BackendKeyData)
        # the error the backend ended the session with while it was idle: the session's last
        # message (`_notice`)
        self.farewell: bytes | None = None
        # statements by route, outcome and latency (`statistics`; None: not kept): when the
        # running one started (None: none runs), whether it failed
        self.statement_stats = statement_stats
        self._started: float | None = None
        self._failed = False
        # counts the messages handled other than reads at hand (`handle`, `AtOnce`): a lane
        # made at another count may have seen another session state (`AtOnce.lane`)
        self.epoch = 0
        # a cached read the event loop began and suspended at its first wait: the worker
        # that answers the run's Execute drives it on (`_read_locally`)
        self.suspended: SuspendedRead | None = None
        # counts what `epoch` counts but runs passed through raw: a raw lane made at another
        # count may have seen another session state (`RawRuns.lane`)
        self.handled = 0

    @property
    def reported(self) -> dict[str, str]:
        """The ParameterStatus values the client has."""
        return self.client.reported

    # -- messages ------------------------------------------------------------------------------

    def handle(self, message: protocol.Message) -> bool:
        """Answer one message; False when the client ends the session (Terminate)."""
        self.epoch += 1  # (anything but a read at hand may change the session: lanes end)
        self.handled += 1
        if isinstance(message, protocol.Query) and not self.pipeline.quiet:
            # (the extended messages before it are answered first: one that fails drops it,
            # as PostgreSQL, which answered them as they came, would)
            self._drain_failing()
        step = self.state.receive(message)
        if step is Step.END:
            return False
        if isinstance(message, protocol.Query | protocol.Execute):
            self.statement_starts()
        if step is Step.SYNC:
            self.sync()
            return True
        if step is not Step.ANSWER:
            return True
        try:
            if isinstance(message, protocol.Query):
                self._query_message(message.sql)
            elif isinstance(message, protocol.Parse):
                self._parse(message)
            elif isinstance(message, protocol.Bind):
                self._bind(message)
            elif isinstance(message, protocol.Describe):
                self._describe_message(message)
            elif isinstance(message, protocol.Execute):
                self._execute(message)
            elif isinstance(message, protocol.Close):
                self._close(message)
            elif isinstance(message, protocol.Flush):
                self.pipeline.drain()
            elif isinstance(message, protocol.FunctionCall):
                raise Refusal(
                    "0A000",
                    "the fastpath function call interface is not supported "
                    "by the cache server: call the function in a SELECT",
                )
            else:
                raise ProtocolViolation(f"unexpected message {type(message).__name__}")
        except relay.BackendRefused as exc:
            self._drain_failing()
            self.out(exc.message)
            self.state.error()
            self._failed = True
        except (Refusal, Error, psycopg.Error) as exc:
            self.error(exc, getattr(message, "sql", None))
        return True

    def _drain_failing(self) -> None:
        """`BackendPipeline.drain`, a backend error on the way an error of the cycle's."""
        try:
            self.pipeline.drain()
        except (Refusal, Error, psycopg.Error) as exc:
            self.error(exc)

    def statement_starts(self) -> None:
        """A statement's first message (Query, Execute): its latency runs from here to the
        ReadyForQuery that ends its cycle (`ready`), when statements are counted."""
        if self.statement_stats is not None and self._started is None:
            self._started = time.perf_counter()
            self._failed = False
            self.session.last_route = "cache"

    def idle(self) -> bool:
        """Nothing of the session's waits at the backend, and no transaction block is open
        there (outside one, a statement that fails touches nothing): answers at hand may be
        given."""
        return (
            not (self.pipeline.piped or self.client.output_changed)
            and self.session.link.transaction_status() == pq.TransactionStatus.IDLE
        )

    # -- the simple query protocol -------------------------------------------------------------

    def _query_message(self, sql: bytes) -> None:
        """A Query message: its statements, then ReadyForQuery whatever happened."""
        self.pipeline.drain(leave_pipeline=True)
        try:
            self._simple_query(sql)
        except relay.BackendRefused as exc:
            self.out(exc.message)
        except (Refusal, Error, psycopg.Error) as exc:
            self.error(exc, sql)
        self.ready()

    def _simple_query(self, sql: bytes) -> None:
        text = sql.decode(self.client.codec)
        parts = split_statements(text)
        if not parts:
            self.out(protocol.EMPTY_QUERY)
            return
        routes = [(part, self.session.route(part, False)) for part in parts]
        for part, routed in routes:
            if isinstance(routed, Passthrough):
                self.client.check_encoding(part)
        if all(isinstance(r, Passthrough | Write) for _, r in routes):
            self._backend_simple(sql, routes)  # as the client wrote it (error positions)
            return
        # runs of statements for the backend are sent together; runs of cache DDL applied
        # together (all or nothing, as a script); the cache's other statements one by one
        for kind, run in itertools.groupby(routes, key=lambda r: _simple_kind(r[1])):
            group = list(run)
            if kind == "backend":
                ok = self._backend_simple(None, group)
            elif kind == "ddl":
                self._check_not_failed()
                ddl = [t.cast(CacheDdl, routed).statement for _, routed in group]
                for result in self.session.apply_cache_ddl(ddl):
                    self.answers.send(result, describe=True, formats=None)
                ok = True
            else:
                ok = all(self._engine_simple(part, routed) for part, routed in group)
            if not ok:
                return

    def _backend_simple(self, sql: bytes | None, run: list[tuple[str, Route]]) -> bool:
        """Statements passed through in one Query message (one implicit transaction)."""
        if sql is None:
            sql = ";".join(part for part, _ in run).encode(self.client.codec)
        ok = self._relay_query(sql)
        for part, routed in run:
            if not self.forwarded(part, t.cast(Passthrough | Write, routed)):
                self.session.caught_up()
        self.answers.provenance()
        return ok

    def _relay_query(self, sql: bytes) -> bool:
        conn = self.pipeline.connection()
        pgconn = conn.pgconn
        pgconn.send_query(sql)
        relay.flush(pgconn)
        pgconn.set_chunked_rows_mode(relay.CHUNK_ROWS)
        ok = self.pipeline.relay(conn, self.out, simple=True)
        self._notifications()
        return ok

    def forwarded(self, sql: str, routed: Passthrough | Write) -> bool:
        """A statement reached the backend: a note when it may have changed a setting local
        answers are encoded by, and the session's bookkeeping (`Session.forwarded_at_hand`:
        False when what needs the backend's clock is left to `Session.caught_up`)."""
        output, listens = effects(sql)
        self.client.output_changed |= output
        self.listening |= listens
        return self.session.forwarded_at_hand(routed)

    def _engine_simple(self, text: str, routed: Route) -> bool:
        """A statement the cache answers (or judges) in a Query message."""
        self._check_not_failed()
        if isinstance(routed, CachedRead):
            result = self._read_locally(routed, None)
            if result is None:  # the backend answers it, its clauses cut out
                self.session.sending_remotely(routed.query)  # (its time: from now)
                ok = self._relay_query(routed.query.backend_sql.encode(self.client.codec))
                self.session.answered_remotely(routed.query, timed=True)
                self.answers.provenance()
                return ok
        else:
            result = self.session.execute(text)
        self.answers.send(result, describe=True, formats=None)
        return True

    # -- the extended query protocol -----------------------------------------------------------

    def _parse(self, message: protocol.Parse) -> None:
        text = message.sql.decode(self.client.codec)
        converted = to_engine(text)
        engine_sql = converted.sql if converted.order else text
        routed = self.session.route(engine_sql, bool(converted.order))
        if isinstance(routed, Passthrough):
            self.client.check_encoding(text)
        statement = Statement(message.sql, text, message.param_types, converted, routed)
        name = message.name
        if name and name in self.statements:
            raise Refusal(
                "42P05", f'prepared statement "{name.decode(errors="replace")}" already exists'
            )
        previous = self.statements.get(name) if not name else None
        if previous is not None and previous.backend_name:
            self.pipeline.close(previous)
        self.statements[name] = statement
        if not statement.passthrough:
            self.pipeline.ready(protocol.PARSE_COMPLETE)
            return
        self.pipeline.parse(statement, name, protocol.PARSE_COMPLETE)

    def _bind(self, message: protocol.Bind) -> None:
        statement = self.statements.get(message.statement)
        if statement is None:
            raise Refusal(
                "26000", f'prepared statement "{named(message.statement)}" does not exist'
            )
        if message.portal and message.portal in self.portals:
            raise Refusal("42P03", f'cursor "{named(message.portal)}" already exists')
        self.portals[message.portal] = Portal(statement, message)
        self.pipeline.ready(protocol.BIND_COMPLETE)

    def _describe_message(self, message: protocol.Describe) -> None:
        if message.kind == b"S":
            statement = self.statements.get(message.name)
            if statement is None:
                raise Refusal("26000", f'prepared statement "{named(message.name)}" does not exist')
            self._with_description(
                statement,
                lambda params, fields: self.out(
                    protocol.parameter_description(params)
                    + (protocol.row_description(fields) if fields is not None else protocol.NO_DATA)
                ),
            )
            return
        portal = self.portals.get(message.name)
        if portal is None:
            # a cursor the client declared at the backend: described there
            if not message.name or self.session.link.if_open() is None:
                raise Refusal("34000", f'portal "{named(message.name)}" does not exist')
            self.pipeline.describe_portal(message.name)
            return

        def described(_: tuple[int, ...], fields: list[Field] | None) -> None:
            self.out(protocol.NO_DATA if fields is None else portal.row_description())

        self._with_description(portal.statement, described)

    def _with_description(self, statement: Statement, then: _Described) -> None:
        """Call ``then`` with the statement's parameter types and columns, in its turn."""
        if statement.described is not None:
            found = statement.described
            self.pipeline.expect(lambda: _then(then, found))
            return
        if not statement.passthrough and not isinstance(statement.route, CachedRead):
            # the cache's own statements: their columns are known without running them
            columns = inspect.result_columns(statement.route)
            found = (
                tuple(statement.param_types),
                None if columns is None else [field(name, oid, -1, 0) for name, oid in columns],
            )
            statement.described = found
            self.pipeline.expect(lambda: _then(then, found))
            return
        if not statement.passthrough:
            found = statement.rows_described(
                self._description(statement.backend_text, statement.param_types)
            )
            statement.described = found
            self.pipeline.expect(lambda: _then(then, found))
            return
        pgconn = self.pipeline.enter()
        self.pipeline.ensure(statement)
        pgconn.send_describe_prepared(statement.backend_name or b"")

        def described(result: pq.abc.PGresult) -> None:
            params = tuple(result.param_type(i) for i in range(result.nparams))
            found = statement.rows_described(
                (params, relay.fields_of(result) if result.nfields else None)
            )
            statement.described = found
            then(*found)

        self.pipeline.expect_command(pgconn, described)

    def _execute(self, message: protocol.Execute) -> None:
        portal = self.portals.get(message.portal)
        if portal is None:
            raise Refusal("34000", f'portal "{named(message.portal)}" does not exist')
        if portal.rows is not None:  # a row-limited portal, continued
            self.pipeline.ready(portal.next_rows(message.max_rows))
            return
        statement = portal.statement
        if statement.copies:
            self._execute_copy(portal)
            return
        if statement.passthrough:
            self._execute_at_backend(portal, message.max_rows)
            return
        self.pipeline.drain()
        if self.state.ignoring:
            return
        self._check_not_failed()
        routed = statement.route
        try:
            params = self.engine_params(portal)
        except Unreadable:
            if not isinstance(routed, CachedRead):
                raise
            # a read whose values the cache cannot take (a regclass, say): the backend
            # answers it, as it answers every read the cache does not
            self._execute_text_at_backend(portal, routed, message.max_rows)
            return
        if isinstance(routed, CachedRead):
            result = self._read_locally(routed, params, portal)
            if result is None:
                self._execute_text_at_backend(portal, routed, message.max_rows)
                return
        else:
            result = self.session.execute(statement.engine_sql, params or None)
        self.answers.execute(portal, result, message.max_rows)

    def _execute_at_backend(self, portal: Portal, max_rows: int) -> None:
        statement = portal.statement
        pgconn = self.pipeline.enter()
        self.pipeline.ensure(statement)
        bind = portal.bind
        param_formats, result_format, mixed = bind_formats(bind)
        pgconn.send_query_prepared(
            statement.backend_name or b"", list(bind.params), param_formats, result_format
        )
        self._expect_rows(portal, max_rows, mixed, statement.route)

    def _execute_copy(self, portal: Portal) -> None:
        """COPY sent by Parse, Bind and Execute. libpq runs no COPY in pipeline mode: what is
        queued is answered first and the pipeline left (with no Sync: the backend's implicit
        transaction goes on), then the COPY's data passes as in a Query message."""
        statement = portal.statement
        pipeline = self.pipeline
        pipeline.ensure(statement)
        pipeline.drain()
        if self.state.ignoring:
            return
        pgconn = pipeline.leave()
        param_formats, result_format, mixed = bind_formats(portal.bind)
        pgconn.send_query_prepared(
            statement.backend_name or b"", list(portal.bind.params), param_formats, result_format
        )
        relay.flush(pgconn)
        if not pipeline.relay(pipeline.connection(), self.out, simple=False, mixed=mixed):
            self.state.error()
        elif not self.passed(statement, statement.route):
            self.session.caught_up()

    def _execute_text_at_backend(self, portal: Portal, routed: CachedRead, max_rows: int) -> None:
        """A cached read the backend answers: its text (clauses cut), the client's values."""
        pgconn = self.pipeline.enter()
        bind = portal.bind
        statement = portal.statement
        types = statement.described[0] if statement.described else statement.param_types
        param_formats, result_format, mixed = bind_formats(bind)
        pgconn.send_query_params(
            statement.backend_text.encode(self.client.codec),
            list(bind.params),
            list(types) or None,
            param_formats,
            result_format,
        )
        self.pipeline.forget_unnamed()
        self._expect_rows(portal, max_rows, mixed, None)
        self.session.answered_remotely(routed.query)

    def _expect_rows(
        self, portal: Portal, max_rows: int, mixed: list[int] | None, routed: Route | None
    ) -> None:
        conn = self.pipeline.connection()

        def read() -> bool:
            held = max_rows > 0
            if not held:
                # refused (an aborted pipeline, whose results are only read past): no matter
                with contextlib.suppress(psycopg.OperationalError):
                    conn.pgconn.set_chunked_rows_mode(relay.CHUNK_ROWS)
            out = portal.holder() if held else self.out
            ok = self.pipeline.relay(conn, out, simple=False, mixed=mixed)
            if ok and not self.passed(portal.statement, routed):
                self.session.caught_up()
            if held and ok:
                self.out(portal.next_rows(max_rows))
            return ok

        self.pipeline.expect(read)

    def passed(self, statement: Statement, routed: Route | None) -> bool:
        """A statement the backend answered: the bookkeeping of one passed through (None: a
        cached read it answered, counted apart), and the provenance NOTICE; False when what
        needs the backend's clock is left to `Session.caught_up`."""
        kept = routed is None or self.forwarded(statement.text, t.cast(Passthrough | Write, routed))
        self.answers.provenance()
        return kept

    def _close(self, message: protocol.Close) -> None:
        if message.kind == b"S":
            statement = self.statements.pop(message.name, None)
            if statement is not None and statement.backend_name:
                self.pipeline.close(statement)
        elif (
            self.portals.pop(message.name, None) is None
            and message.name
            and self.session.link.if_open() is not None
        ):
            self.pipeline.close_portal(message.name)  # a cursor declared at the backend
        self.pipeline.ready(protocol.CLOSE_COMPLETE)

    def sync(self) -> None:
        """A Sync: the cycle's answers, then ReadyForQuery."""
        self.pipeline.sync()
        if self.session.link.transaction_status() == pq.TransactionStatus.IDLE:
            self.portals.clear()  # portals end with their transaction, as PostgreSQL's
        self.ready()

    def _check_not_failed(self) -> None:
        """The cache answers nothing in a failed transaction block, as PostgreSQL."""
        if self.session.link.transaction_status() == pq.TransactionStatus.INERROR:
            raise Refusal(
                "25P02",
                "current transaction is aborted, commands ignored until end of transaction block",
            )

    def _description(self, text: str, types: tuple[int, ...]) -> Description:
        """The backend's description of a cached read: shared by the sessions, or, when a
        shared connection cannot describe it (a temporary table of this session's), made on
        the session's own connection."""
        try:
            return self._describe(text, types)
        except relay.BackendRefused:
            self.pipeline.drain()
            self.pipeline.forget_unnamed()  # (the description takes the backend's unnamed one)
            return self._describe(text, types, self.pipeline.connection())

    # -- the engine's answers ------------------------------------------------------------------

    def _read_locally(
        self, routed: CachedRead, params: list[t.Any] | None, portal: Portal | None = None
    ) -> Result | None:
        """The cache's answer, if it gives one the server can encode: the read the event loop
        began for the portal's run and suspended, driven on from where it stopped, else a
        read of its own."""
        suspended, self.suspended = self.suspended, None
        if not self.client.settings.supported:
            return None
        if suspended is not None and portal is not None and suspended.of(portal):
            result = drive(suspended.read.read).result
        else:
            result = self.session.read_locally(routed.query, params)
        return result if result is not None and encodes(result) else None

    def engine_params(self, portal: Portal) -> list[t.Any]:
        statement = portal.statement
        converted = statement.converted
        if not converted.order:
            return []
        bind = portal.bind
        types = self.param_types(portal)
        if len(bind.params) != len(types):
            raise Refusal(
                "08P01",
                f"bind message supplies {len(bind.params)} parameters, "
                f"but prepared statement requires {len(types)}",
            )
        decoded: list[t.Any] = []
        for i, (value, decode) in enumerate(zip(bind.params, decoders(bind, types), strict=True)):
            if value is None:
                decoded.append(None)
                continue
            if decode is None:
                raise Unreadable(
                    "0A000", f"parameter ${i + 1} has a type (OID {types[i]}) the cache cannot read"
                )
            decoded.append(decode(value))
        return converted.params(decoded)

    def param_types(self, portal: Portal) -> tuple[int, ...]:
        """The types of a portal's parameters: as the client gave them, else as the backend
        describes the statement."""
        statement = portal.statement
        types = statement.param_types
        if len(types) < len(portal.bind.params) or 0 in types:
            if statement.described is None:
                statement.described = statement.rows_described(
                    self._description(statement.backend_text, types)
                )
            types = statement.described[0]
        return types

    # -- errors and the end of a cycle ---------------------------------------------------------

    def error(self, exc: BaseException, sql: bytes | None = None) -> None:
        """The ErrorResponse of a statement's failure (the protocol's state moved by it)."""
        if self.state.ended:
            return  # (the session ends with the error the backend ended it with)
        self.pipeline.drain()
        codec = self.client.codec
        text = sql.decode(codec, errors="replace") if sql is not None else None
        if not isinstance(exc, psycopg.Error):
            self._fail_transaction()
        if isinstance(exc, QueryCanceledError) and self.cancel_reason is not None:
            exc = QueryCanceledError(f"canceling statement due to {self.cancel_reason}")
        if isinstance(exc, psycopg.Error) and self.session.link.lost:
            # (libpq's loss of the connection, which psycopg may class by the call that saw
            # it: the session ends with it, as PostgreSQL's would; with the error the backend
            # ended it by, when it sent one while the session was idle)
            self.backend_error(
                self.farewell
                or protocol.error_response(
                    "08006",
                    f"the backend connection was lost: {str(exc).strip()}",
                    severity="FATAL",
                )
            )
            return
        self.backend_error(protocol.diagnostic(diagnostics(exc, text), codec))
        self.state.error()

    def backend_error(self, message: bytes) -> None:
        """An ErrorResponse for the client; when the backend connection is gone with it (or
        the backend ends the session by it: FATAL), the session ends after it with no
        second one and no ReadyForQuery (`ProtocolState.fatal`), as PostgreSQL's would."""
        self.out(message)
        self._failed = True
        if protocol.ends_session(message):
            self.session.link.lose()
        if self.session.link.lost:
            self.state.fatal()

    def _fail_transaction(self) -> None:
        """The cache failed a statement inside a transaction block: as PostgreSQL, the block
        is failed until ROLLBACK. The backend's transaction is made to fail, so it (and the
        client, through ReadyForQuery) sees exactly PostgreSQL's states from here on."""
        if self.session.link.transaction_status() != pq.TransactionStatus.INTRANS:
            return
        pipeline = self.pipeline
        pgconn = pipeline.connection().pgconn
        if not pipeline.piped:
            pipeline.own_statement(pgconn, _FAIL_TRANSACTION)
            return
        pgconn.send_query_params(_FAIL_TRANSACTION, None)
        pipeline.forget_unnamed()
        pipeline.discard_result(pgconn)

    def ready(self) -> None:
        """The end of a cycle: what the backend reported meanwhile, then ReadyForQuery."""
        self.suspended = None  # (a read begun in this cycle and not driven on ends with it)
        if self.state.ended:
            return  # (the session ends with the error it was sent)
        status = self.session.link.transaction_status()
        self._notifications()
        client = self.client
        client.changes()
        if client.output_changed:
            client.read_output(status)
        self.answers.noticed.clear()
        self.session.remote_finished()  # (a cached read the backend answered: its time)
        started = self._started
        if started is not None and self.statement_stats is not None:
            self._started = None
            self.statement_stats.record(
                self.session.last_route, not self._failed, time.perf_counter() - started
            )
        if self.session.report_position:
            client.report_position()
        self.state.ready()
        self.out(protocol.ready_for_query(_STATUS.get(status, b"I")))
        if status == pq.TransactionStatus.IDLE and self.pipeline.quiet:
            self.session.link.release()  # (transaction pooling: between transactions)

    # -- what the backend sends unasked ----------------------------------------------------------

    def notify(self) -> None:
        """Forward what the backend sent while the session was idle (its socket was readable):
        notifications (LISTEN), and the answers of a pipeline the client has not synced yet
        that the backend sent because one of its statements failed (PostgreSQL sends an error
        at once)."""
        conn = self.session.link.if_open()
        if conn is None:
            return
        conn.pgconn.consume_input()
        self._notifications()
        self.pipeline.answer_ready()

    def _notice(self, diag: psycopg.errors.Diagnostic) -> None:
        """A NoticeResponse for a notice the backend sent, with all of its fields. An error
        it sent outside any statement (libpq passes it as a notice) ends the backend session
        (pg_terminate_backend of an idle one): it is the client's farewell (`farewell`)."""
        if diag.severity_nonlocalized in ("FATAL", "PANIC"):
            self.farewell = protocol.diagnostic(diag_fields(diag), self.client.codec)
            return
        self.answers.noticed.append(diag.message_primary or "")
        self.out(protocol.diagnostic(diag_fields(diag), self.client.codec, notice=True))

    def _notifications(self) -> None:
        conn = self.session.link.if_open()
        if conn is None:
            return
        pgconn = conn.pgconn
        own = self.session.link.pid
        while (found := pgconn.notifies()) is not None:
            # (one its own backend sent carries the pid the client was told, as PostgreSQL's)
            pid = self.told_pid if found.be_pid == own else found.be_pid
            self.out(protocol.notification(pid, found.relname, found.extra))

    # -- what the server's connection asks of the session's backend link ---------------------

    def backend_socket(self) -> int | None:
        """The socket of the session's backend connection, for the server to watch while it
        holds the session (None: none is open)."""
        conn = self.session.link.if_open()
        return conn.pgconn.socket if conn is not None else None

    @property
    def pooled(self) -> bool:
        return self.session.link.pooled

    @property
    def lost(self) -> bool:
        """Whether the session's backend connection was lost (the session then ends, as
        PostgreSQL's would)."""
        return self.session.link.lost

    @property
    def told_lost(self) -> bool:
        """Whether the session ended with an error the client was sent (after it, nothing)."""
        return self.state.ended

    def own_pid(self) -> int | None:
        """The process of a backend connection the session holds for itself (None: none
        yet, or a pooled one's, which changes)."""
        link = self.session.link
        return None if link.pooled else link.pid

    def release_backend(self) -> None:
        """A pooled connection back to the pool while the session is idle."""
        self.session.link.release()

    def in_transaction(self) -> bool:
        """Whether the backend session is inside a transaction block (failed or not)."""
        return self.session.link.transaction_status() in (
            pq.TransactionStatus.INTRANS,
            pq.TransactionStatus.INERROR,
        )

    def pipeline_sent(self) -> None:
        """The client sent nothing more for now (`BackendPipeline.sent`)."""
        self.pipeline.sent()


def _simple_kind(routed: Route) -> str:
    """How a Query message runs a statement: with its neighbours at the backend ("backend"),
    with its neighbours as one cache DDL script ("ddl"), or alone by the cache ("engine")."""
    if isinstance(routed, Passthrough | Write):
        return "backend"
    return "ddl" if isinstance(routed, CacheDdl) else "engine"


def _then(then: _Described, found: Description) -> bool:
    then(*found)
    return True


__all__ = ["Conversation"]
