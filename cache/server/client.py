"""One client's conversation with the server, after startup: the messages of the simple and
extended query protocols, each answered by the session engine (cached reads and the cache's
own statements) or passed through to the backend on the session's own connection
(`cache.server.relay`).

`Conversation.handle(message)` takes one message and writes the answer to ``out``; it does
no socket I/O with the client (`cache.server.server` moves the bytes). The extended protocol
keeps PostgreSQL's order: answers leave in the order of the messages, and after an error
every message up to the next Sync is ignored. Backend work of a pipeline is sent without
waiting (libpq's pipeline mode) and its answers are read in order when the client syncs or
flushes, or when a statement the engine answers comes next.
"""

from __future__ import annotations

import dataclasses
import logging
import select
import typing as t
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg import pq
from psycopg.pq import ExecStatus

from cache.engine.result import Result
from cache.engine.route import CachedRead, Passthrough, Route, Write
from cache.engine.session import Session
from cache.server import protocol, relay, values
from cache.server.placeholders import Converted, to_backend, to_engine
from cache.server.protocol import Field, ProtocolViolation
from sql_ext.errors import Error, diagnostics
from sql_ext.statements import split_statements

log = logging.getLogger("mtcache.server")

Out = Callable[[bytes], None]

_TEXT_SIZE = -1


@dataclass
class Statement:
    """A statement the client prepared (Parse)."""

    sql: bytes  # as the client sent it
    text: str
    param_types: tuple[int, ...]  # as the client gave them (0: unspecified)
    converted: Converted  # the engine's text: $n as %s
    route: Route
    backend_name: bytes | None = None  # its name at the backend once parsed there
    # (parameter types, result columns or None for no rows), once described
    described: tuple[tuple[int, ...], list[Field] | None] | None = None

    @property
    def passthrough(self) -> bool:
        return isinstance(self.route, Passthrough | Write)


@dataclass
class Portal:
    statement: Statement
    bind: protocol.Bind
    # rows made and not yet sent (a row-limited Execute), and the tag at their end
    rows: deque[bytes] | None = None
    tag: bytes = b""


@dataclass
class _Expect:
    """What the client gets for one piped backend command, in order: ``read`` takes the
    command's results off the backend and writes the client's messages."""

    read: Callable[[], bool]  # False: the command failed (an ErrorResponse was written)


@dataclass
class _Ready:
    data: bytes  # messages made without the backend, sent in their turn


class Conversation:
    """The protocol state of one client connection (see the module)."""

    def __init__(self, session: Session, out: Out, settings: values.OutputSettings,
                 describe: Callable[[str, tuple[int, ...]], tuple[tuple[int, ...],
                                                                   list[Field] | None]],
                 next_message: Callable[[], protocol.Message],
                 reported: dict[str, str]) -> None:  # fmt: skip
        self.session = session
        self.out = out
        self.settings = settings
        self._describe = describe  # the backend's description of a statement, cached
        self._next_message = next_message  # the client's next message (COPY FROM STDIN)
        self.reported = reported  # the ParameterStatus values the client has
        self._noticed: list[str] = []  # backend notices sent during the current statement
        session.add_notice_handler(self._notice)
        self.statements: dict[bytes, Statement] = {}
        self.portals: dict[bytes, Portal] = {}
        self._queue: deque[_Expect | _Ready] = deque()
        self._piped = False  # the backend connection is in pipeline mode
        self._unnamed_owner: Statement | None = None  # whose text the backend's "" holds
        self._names = 0
        self.ignoring = False  # after an error, until Sync
        self.last_status = b"I"

    # -- messages ------------------------------------------------------------------------------

    def handle(self, message: protocol.Message) -> bool:
        """Answer one message; False when the client ends the session (Terminate)."""
        if isinstance(message, protocol.Terminate):
            return False
        if isinstance(message, protocol.Sync):
            self._sync()
            return True
        if self.ignoring:
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
                self._drain()
            elif isinstance(message, protocol.FunctionCall):
                raise _Refusal("0A000", "the fastpath function call interface is not supported "
                               "by the cache server: call the function in a SELECT")
            elif isinstance(message, protocol.CopyData | protocol.CopyDone | protocol.CopyFail):
                pass  # outside COPY: PostgreSQL ignores them too
            else:
                raise ProtocolViolation(f"unexpected message {type(message).__name__}")
        except relay.BackendRefused as exc:
            self._drain()
            self.out(exc.message)
            self.ignoring = True
        except (_Refusal, Error, psycopg.Error) as exc:
            self._error(exc, getattr(message, "sql", None))
        return True

    # -- the simple query protocol -------------------------------------------------------------

    def _query_message(self, sql: bytes) -> None:
        """A Query message: its statements, then ReadyForQuery whatever happened."""
        self._drain(leave_pipeline=True)
        try:
            self._simple_query(sql)
        except relay.BackendRefused as exc:
            self.out(exc.message)
        except (_Refusal, Error, psycopg.Error) as exc:
            self._error(exc, sql)
            self.ignoring = False
        self._ready()

    def _simple_query(self, sql: bytes) -> None:
        text = sql.decode(self.settings.codec)
        parts = split_statements(text)
        if not parts:
            self.out(protocol.EMPTY_QUERY)
            return
        routes = [(part, self._route(part, with_params=False)) for part in parts]
        if all(isinstance(r, Passthrough | Write) for _, r in routes):
            self._backend_simple(sql, routes)  # as the client wrote it (error positions)
            return
        run: list[tuple[str, Route]] = []  # statements for the backend, sent together
        for part, routed in routes:
            if isinstance(routed, Passthrough | Write):
                run.append((part, routed))
                continue
            if run:
                if not self._backend_simple(None, run):
                    return
                run = []
            if not self._engine_simple(part, routed):
                return
        if run:
            self._backend_simple(None, run)

    def _backend_simple(self, sql: bytes | None, run: list[tuple[str, Route]]) -> bool:
        """Statements passed through in one Query message (one implicit transaction)."""
        if sql is None:
            sql = ";".join(part for part, _ in run).encode(self.settings.codec)
        ok = self._relay_query(sql)
        for _, routed in run:
            self.session.forwarded(t.cast(Passthrough | Write, routed))
        return ok

    def _relay_query(self, sql: bytes) -> bool:
        conn = self._backend()
        pgconn = conn.pgconn
        pgconn.send_query(sql)
        relay.flush(pgconn)
        pgconn.set_chunked_rows_mode(relay.CHUNK_ROWS)
        ok = True
        described = False
        tag = relay.Tag()
        while (result := relay.wait_result(pgconn)) is not None:
            status = result.status
            if status in relay.ROWS:
                if not described:
                    self.out(protocol.row_description(relay.fields_of(result)))
                    described = True
                relay.send_rows(result, self.out)
                if tag.seen(result):
                    self.out(protocol.command_complete(tag.take()))
                    described = False
            elif status == ExecStatus.COMMAND_OK:
                self.out(protocol.command_complete(result.command_status or b""))
            elif status == ExecStatus.EMPTY_QUERY:
                self.out(protocol.EMPTY_QUERY)
            elif status == ExecStatus.COPY_OUT:
                self._copy_out(conn, result)
            elif status == ExecStatus.COPY_IN:
                ok = self._copy_in(conn, result) and ok
            else:
                self.out(relay.diagnostic_message(result))
                ok = False
        self._notifications()
        return ok

    def _engine_simple(self, text: str, routed: Route) -> bool:
        """A statement the cache answers (or judges) in a Query message."""
        if self.session.backend_transaction_status() == pq.TransactionStatus.INERROR:
            raise _Refusal("25P02", "current transaction is aborted, commands ignored until "
                           "end of transaction block")  # fmt: skip
        if isinstance(routed, CachedRead):
            result = self._read_locally(routed, None)
            if result is None:  # the backend answers it, its clauses cut out
                return self._relay_query(routed.query.backend_sql.encode(self.settings.codec))
        else:
            result = self.session.execute(text)
        self._send_result(result, describe=True, formats=None)
        return True

    # -- the extended query protocol -----------------------------------------------------------

    def _parse(self, message: protocol.Parse) -> None:
        text = message.sql.decode(self.settings.codec)
        converted = to_engine(text)
        has_params = bool(converted.order)
        routed = self._route(converted.sql if has_params else text, with_params=has_params)
        statement = Statement(message.sql, text, message.param_types, converted, routed)
        name = message.name
        if name and name in self.statements:
            raise _Refusal("42P05", f'prepared statement "{name.decode(errors="replace")}" '
                           "already exists")  # fmt: skip
        previous = self.statements.get(name) if not name else None
        if previous is not None and previous.backend_name:
            self._close_at_backend(previous)
        self.statements[name] = statement
        if statement.passthrough:
            self._prepare_at_backend(statement, name)
        else:
            self._queue.append(_Ready(protocol.PARSE_COMPLETE))

    def _prepare_at_backend(self, statement: Statement, client_name: bytes) -> None:
        pgconn = self._piped_backend()
        if client_name:
            self._names += 1
            backend_name = f"mtcache_{self._names}".encode()
        else:
            backend_name = b""
            self._unnamed_owner = statement
        statement.backend_name = backend_name
        pgconn.send_prepare(backend_name, statement.sql, statement.param_types or None)

        def read() -> bool:
            result = self._command_result(pgconn)
            if result.status != ExecStatus.COMMAND_OK:
                statement.backend_name = None
                self.out(relay.diagnostic_message(result))
                return False
            self.out(protocol.PARSE_COMPLETE)
            return True

        self._queue.append(_Expect(read))

    def _bind(self, message: protocol.Bind) -> None:
        statement = self.statements.get(message.statement)
        if statement is None:
            raise _Refusal("26000", f'prepared statement "{_name(message.statement)}" does not '
                           "exist")  # fmt: skip
        if message.portal and message.portal in self.portals:
            raise _Refusal("42P03", f'cursor "{_name(message.portal)}" already exists')
        self.portals[message.portal] = Portal(statement, message)
        self._queue.append(_Ready(protocol.BIND_COMPLETE))

    def _describe_message(self, message: protocol.Describe) -> None:
        if message.kind == b"S":
            statement = self.statements.get(message.name)
            if statement is None:
                raise _Refusal("26000", f'prepared statement "{_name(message.name)}" does '
                               "not exist")  # fmt: skip
            self._with_description(statement, lambda params, fields: self.out(
                protocol.parameter_description(params) + (
                    protocol.row_description(fields) if fields is not None
                    else protocol.NO_DATA)))  # fmt: skip
            return
        portal = self.portals.get(message.name)
        if portal is None:
            raise _Refusal("34000", f'portal "{_name(message.name)}" does not exist')

        def described(_: tuple[int, ...], fields: list[Field] | None) -> None:
            if fields is None:
                self.out(protocol.NO_DATA)
                return
            formats = relay.result_formats(portal.bind.result_formats, len(fields))
            chosen = [f._replace(format=c) for f, c in zip(fields, formats, strict=True)]
            self.out(protocol.row_description(chosen))

        self._with_description(portal.statement, described)

    def _with_description(self, statement: Statement, then: _Described) -> None:
        """Call ``then`` with the statement's parameter types and columns, in its turn."""
        if statement.described is not None:
            found = statement.described
            self._queue.append(_Expect(lambda: _then(then, found)))
            return
        if not statement.passthrough:
            found = self._describe(self._backend_text(statement), statement.param_types)
            statement.described = found
            self._queue.append(_Expect(lambda: _then(then, found)))
            return
        pgconn = self._piped_backend()
        self._ensure_at_backend(statement)
        pgconn.send_describe_prepared(statement.backend_name or b"")

        def read() -> bool:
            result = self._command_result(pgconn)
            if result.status != ExecStatus.COMMAND_OK:
                self.out(relay.diagnostic_message(result))
                return False
            params = tuple(result.param_type(i) for i in range(result.nparams))
            fields = relay.fields_of(result) if result.nfields else None
            statement.described = (params, fields)
            then(params, fields)
            return True

        self._queue.append(_Expect(read))

    def _execute(self, message: protocol.Execute) -> None:
        portal = self.portals.get(message.portal)
        if portal is None:
            raise _Refusal("34000", f'portal "{_name(message.portal)}" does not exist')
        if portal.rows is not None:  # a row-limited portal, continued
            self._queue.append(_Ready(self._portal_rows(portal, message.max_rows)))
            return
        statement = portal.statement
        if statement.passthrough:
            self._execute_at_backend(portal, message.max_rows)
            return
        self._drain()
        if self.ignoring:
            return
        if self.session.backend_transaction_status() == pq.TransactionStatus.INERROR:
            raise _Refusal("25P02", "current transaction is aborted, commands ignored until "
                           "end of transaction block")  # fmt: skip
        params = self._engine_params(portal)
        routed = statement.route
        engine_sql = statement.converted.sql if statement.converted.order else statement.text
        if isinstance(routed, CachedRead):
            result = self._read_locally(routed, params)
            if result is None:
                backend_sql = to_backend(routed.query.backend_sql, statement.converted.order) \
                    if statement.converted.order else routed.query.backend_sql  # fmt: skip
                self._execute_text_at_backend(portal, backend_sql, message.max_rows)
                return
        else:
            result = self.session.execute(engine_sql, params if params else None)
        formats = relay.result_formats(portal.bind.result_formats,
                                       len(result.columns or ()))  # fmt: skip
        if message.max_rows > 0 and result.rows is not None:
            self._send_result(result, describe=False, formats=formats,
                              into=self._holder(portal))  # fmt: skip
            self.out(self._portal_rows(portal, message.max_rows))
            return
        self._send_result(result, describe=False, formats=formats)

    def _execute_at_backend(self, portal: Portal, max_rows: int) -> None:
        statement = portal.statement
        pgconn = self._piped_backend()
        self._ensure_at_backend(statement)
        bind = portal.bind
        formats = list(bind.result_formats)
        uniform = len(set(formats)) <= 1
        pgconn.send_query_prepared(
            statement.backend_name or b"", list(bind.params),
            [bind.param_format(i) for i in range(len(bind.params))] or None,
            (formats[0] if formats else 0) if uniform else 0)  # fmt: skip
        self._expect_rows(portal, max_rows, None if uniform else formats, statement.route)

    def _execute_text_at_backend(self, portal: Portal, sql: str, max_rows: int) -> None:
        """A cached read the backend answers: its text (clauses cut), the client's values."""
        pgconn = self._piped_backend()
        bind = portal.bind
        formats = list(bind.result_formats)
        uniform = len(set(formats)) <= 1
        statement = portal.statement
        types = statement.described[0] if statement.described else statement.param_types
        pgconn.send_query_params(
            sql.encode(self.settings.codec), list(bind.params), list(types) or None,
            [bind.param_format(i) for i in range(len(bind.params))] or None,
            (formats[0] if formats else 0) if uniform else 0)  # fmt: skip
        self._unnamed_owner = None
        self._expect_rows(portal, max_rows, None if uniform else formats, None)
        self.session.answered_remotely(t.cast(CachedRead, statement.route).query)

    def _expect_rows(self, portal: Portal, max_rows: int, mixed: list[int] | None,
                     routed: Route | None) -> None:  # fmt: skip
        conn = self._backend()
        pgconn = conn.pgconn

        def read() -> bool:
            held = max_rows > 0
            out = self._holder(portal) if held else self.out
            if not held:
                pgconn.set_chunked_rows_mode(relay.CHUNK_ROWS)
            transcoder = None
            ok = True
            tag = relay.Tag()
            while (result := relay.wait_result(pgconn)) is not None:
                status = result.status
                if status in relay.ROWS:
                    if mixed is not None and transcoder is None:
                        transcoder = relay.Transcoder(conn, result, relay.result_formats(
                            mixed, result.nfields))  # fmt: skip
                    relay.send_rows(result, out, transcoder)
                    if tag.seen(result):
                        out(protocol.command_complete(tag.take()))
                elif status == ExecStatus.COMMAND_OK:
                    out(protocol.command_complete(result.command_status or b""))
                elif status == ExecStatus.EMPTY_QUERY:
                    out(protocol.EMPTY_QUERY)
                elif status == ExecStatus.PIPELINE_ABORTED:
                    ok = False
                elif status in (ExecStatus.COPY_IN, ExecStatus.COPY_OUT):
                    self.out(protocol.error_response("0A000", "COPY through the extended "
                             "query protocol is not supported by the cache server: send it "
                             "as a simple query"))  # fmt: skip
                    ok = False
                else:
                    self.out(relay.diagnostic_message(result))
                    ok = False
            if ok and routed is not None:
                self.session.forwarded(t.cast(Passthrough | Write, routed))
            if held and ok:
                self.out(self._portal_rows(portal, max_rows))
            return ok

        self._queue.append(_Expect(read))

    def _holder(self, portal: Portal) -> Out:
        """Where a row-limited Execute's messages wait: the rows in the portal, the
        CommandComplete's tag apart."""
        portal.rows = deque()
        rows = portal.rows

        def hold(data: bytes) -> None:
            if data[:1] == b"C":
                portal.tag = data[5:-1]
            else:
                rows.append(data)

        return hold

    def _portal_rows(self, portal: Portal, max_rows: int) -> bytes:
        """The next rows of a row-limited portal, then PortalSuspended when a full batch
        went out (as PostgreSQL, which cannot tell that nothing is left), else the tag, a
        SELECT's counting the rows of this batch as PostgreSQL's does."""
        rows = portal.rows
        assert rows is not None
        taken: list[bytes] = []
        while rows and (max_rows <= 0 or len(taken) < max_rows):
            taken.append(rows.popleft())
        if max_rows > 0 and len(taken) == max_rows:
            return b"".join(taken) + protocol.PORTAL_SUSPENDED
        tag = portal.tag
        if tag.startswith(b"SELECT "):
            tag = b"SELECT %d" % len(taken)
        return b"".join(taken) + protocol.command_complete(tag)

    def _close(self, message: protocol.Close) -> None:
        if message.kind == b"S":
            statement = self.statements.pop(message.name, None)
            if statement is not None and statement.backend_name:
                self._close_at_backend(statement)
        else:
            self.portals.pop(message.name, None)
        self._queue.append(_Ready(protocol.CLOSE_COMPLETE))

    def _close_at_backend(self, statement: Statement) -> None:
        name = statement.backend_name
        statement.backend_name = None
        if not name:
            return
        pgconn = self._piped_backend()
        pgconn.send_close_prepared(name)
        self._queue.append(_Expect(lambda: self._command_result(pgconn) is not None))

    def _ensure_at_backend(self, statement: Statement) -> None:
        """Parse the statement at the backend again if its unnamed statement was replaced."""
        name = statement.backend_name
        if name is None or (name == b"" and self._unnamed_owner is not statement):
            pgconn = self._piped_backend()
            statement.backend_name = b""
            self._unnamed_owner = statement
            pgconn.send_prepare(b"", statement.sql, statement.param_types or None)

            def read() -> bool:
                result = self._command_result(pgconn)
                if result.status != ExecStatus.COMMAND_OK:
                    self.out(relay.diagnostic_message(result))
                    return False
                return True

            self._queue.append(_Expect(read))

    def _sync(self) -> None:
        if self._piped:
            pgconn = self._backend().pgconn
            pgconn.pipeline_sync()
        self._drain(leave_pipeline=True)
        self.ignoring = False
        self._unnamed_portal_done()
        self._ready()

    def _unnamed_portal_done(self) -> None:
        # PostgreSQL drops the unnamed portal at the end of a transaction; keep it simple:
        # outside a transaction block nothing survives a Sync but named statements
        if self.last_status == b"I":
            self.portals = {k: v for k, v in self.portals.items() if k}

    # -- backend pipeline ------------------------------------------------------------------------

    def _backend(self) -> psycopg.Connection[t.Any]:
        return self.session.backend_connection()

    def _piped_backend(self) -> pq.abc.PGconn:
        conn = self._backend()
        pgconn = conn.pgconn
        if not self._piped:
            pgconn.enter_pipeline_mode()
            self._piped = True
        return pgconn

    def _command_result(self, pgconn: pq.abc.PGconn) -> pq.abc.PGresult:
        """A command's one result, then libpq's end of its results."""
        result = relay.wait_result(pgconn)
        assert result is not None
        while relay.wait_result(pgconn) is not None:
            pass
        return result

    def _drain(self, leave_pipeline: bool = False) -> None:
        """Answer what is queued, in order; ``leave_pipeline``: end libpq's pipeline mode
        (after a Sync, or before the engine uses the connection)."""
        queue = self._queue
        if self._piped:
            pgconn = self._backend().pgconn
            if any(isinstance(item, _Expect) for item in queue):
                if not leave_pipeline:
                    pgconn.send_flush_request()
                relay.flush(pgconn)
        else:
            pgconn = None
        while queue:
            item = queue.popleft()
            if isinstance(item, _Ready):
                if not self.ignoring:
                    self.out(item.data)
                continue
            if self.ignoring:
                out = self.out
                self.out = lambda _: None
                try:
                    item.read()
                finally:
                    self.out = out
            elif not item.read():
                self.ignoring = True
        if self._piped and leave_pipeline and pgconn is not None:
            # the Sync's own result, then out of pipeline mode
            while True:
                result = relay.wait_result(pgconn)
                if result is not None and result.status == ExecStatus.PIPELINE_SYNC:
                    break
            pgconn.exit_pipeline_mode()
            self._piped = False
            self.session.settle()

    # -- the engine's answers ------------------------------------------------------------------

    def _route(self, sql: str, with_params: bool) -> Route:
        return self.session.route(sql, with_params)

    def _read_locally(self, routed: CachedRead, params: list[t.Any] | None) -> Result | None:
        result = self.session.read_locally(routed.query, params)
        if result is None or not self.settings.supported:
            return None
        columns = result.columns or ()
        if not values.encodable(c.type_oid or 0 for c in columns):
            return None
        return result

    def _engine_params(self, portal: Portal) -> list[t.Any]:
        statement = portal.statement
        converted = statement.converted
        if not converted.order:
            return []
        bind = portal.bind
        types = statement.param_types
        if len(types) < len(bind.params) or 0 in types:
            if statement.described is None:
                statement.described = self._describe(self._backend_text(statement), types)
            types = statement.described[0]
        if len(bind.params) != len(types):
            raise _Refusal("08P01", f"bind message supplies {len(bind.params)} parameters, "
                           f"but prepared statement requires {len(types)}")  # fmt: skip
        decoded: list[t.Any] = []
        for i, (value, oid) in enumerate(zip(bind.params, types, strict=True)):
            if value is None:
                decoded.append(None)
                continue
            decode = values.decoder(oid, bind.param_format(i) == 1)
            if decode is None:
                raise _Refusal("0A000", f"parameter ${i + 1} has a type (OID {oid}) the cache "
                               "cannot read")  # fmt: skip
            decoded.append(decode(value))
        return converted.params(decoded)

    def _backend_text(self, statement: Statement) -> str:
        """What the backend is sent for the statement: a query's clauses cut out."""
        routed = statement.route
        if isinstance(routed, CachedRead):
            sql = routed.query.backend_sql
            return to_backend(sql, statement.converted.order) if statement.converted.order \
                else sql  # fmt: skip
        return statement.text

    def _send_result(self, result: Result, *, describe: bool, formats: list[int] | None,
                     into: Out | None = None) -> None:  # fmt: skip
        out = into or self.out
        for notice in result.notices:
            if notice in self._noticed:  # the backend's, sent as it came
                self._noticed.remove(notice)
                continue
            self.out(protocol.error_response("00000", notice, severity="NOTICE", notice=True))
        columns = result.columns
        if result.rows is None or columns is None:
            out(protocol.command_complete(result.status or ""))
            return
        oids = [c.type_oid or 25 for c in columns]
        if formats is None:
            formats = [0] * len(oids)
        if describe:
            out(protocol.row_description(result_fields(result, formats)))
        encode = values.encoders(oids, formats, self.settings)
        data_row = protocol.data_row
        for row in result.rows:
            out(data_row([None if v is None else f(v) for f, v in zip(encode, row,
                                                                       strict=True)]))  # fmt: skip
        out(protocol.command_complete(result.status or f"SELECT {len(result.rows)}"))

    # -- errors ----------------------------------------------------------------------------------

    def _error(self, exc: BaseException, sql: bytes | None = None) -> None:
        self._drain()
        text = sql.decode(self.settings.codec, errors="replace") if sql is not None else None
        fields = diagnostics(exc, text)
        if not isinstance(exc, psycopg.Error):
            self._fail_transaction()
        codec = self.settings.codec
        self.out(protocol.error_fields([(protocol.FIELD_CODES[k], v.encode(codec))
                                        for k, v in fields]))  # fmt: skip
        self.ignoring = True

    def _fail_transaction(self) -> None:
        """The cache failed a statement inside a transaction block: as PostgreSQL, the block
        is failed until ROLLBACK. The backend's transaction is made to fail, so it (and the
        client, through ReadyForQuery) sees exactly PostgreSQL's states from here on."""
        if self.session.backend_transaction_status() != pq.TransactionStatus.INTRANS:
            return
        pgconn = self._backend().pgconn
        pgconn.send_query_params(_FAIL_TRANSACTION, None)
        relay.flush(pgconn)
        if self._piped:
            self._queue.append(_Expect(lambda: bool(self._command_result(pgconn)) or True))
        else:
            while relay.wait_result(pgconn) is not None:
                pass

    def _ready(self) -> None:
        status = self.session.backend_transaction_status()
        code = _STATUS.get(status, b"I")
        self.last_status = code
        self._notifications()
        self._parameter_changes()
        self._noticed.clear()
        self.out(protocol.ready_for_query(code))

    def _parameter_changes(self) -> None:
        """ParameterStatus for every reported setting the backend session changed (SET
        TimeZone, ...)."""
        conn = self.session.backend_connection_if_open()
        if conn is None:
            return
        info = conn.info
        reported = self.reported
        for name, value in list(reported.items()):
            now = info.parameter_status(name)
            if now is not None and now != value:
                reported[name] = now
                self.out(protocol.parameter_status(name, now))
                if name == "DateStyle":
                    self.settings = dataclasses.replace(self.settings, date_style=now)
                elif name == "TimeZone":
                    pass  # the engine reads the zone from the connection itself

    def notify(self) -> None:
        """Forward what the backend sent while the session was idle (LISTEN)."""
        self._notifications()

    def _notice(self, diag: psycopg.errors.Diagnostic) -> None:
        """A NoticeResponse for a notice the backend sent, with all of its fields."""
        codec = self.settings.codec
        fields = [(protocol.FIELD_CODES[name], str(value).encode(codec, errors="replace"))
                  for name, value in diagnostics_of(diag)]  # fmt: skip
        self._noticed.append(diag.message_primary or "")
        self.out(protocol.error_fields(fields, notice=True))

    def _notifications(self) -> None:
        conn = self.session.backend_connection_if_open()
        if conn is None:
            return
        pgconn = conn.pgconn
        while (found := pgconn.notifies()) is not None:
            self.out(protocol.notification(found.be_pid, found.relname, found.extra))

    # -- COPY ------------------------------------------------------------------------------------

    def _copy_out(self, conn: psycopg.Connection[t.Any], result: pq.abc.PGresult) -> None:
        pgconn = conn.pgconn
        self.out(protocol.copy_response(b"H", bool(result.binary_tuples), _formats(result)))
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

    def _copy_in(self, conn: psycopg.Connection[t.Any], result: pq.abc.PGresult) -> bool:
        """COPY FROM STDIN: the client's CopyData to the backend until CopyDone (or
        CopyFail); Flush and Sync are ignored meanwhile, as PostgreSQL does."""
        pgconn = conn.pgconn
        self.out(protocol.copy_response(b"G", bool(result.binary_tuples), _formats(result)))
        while True:
            message = self._next_message()
            if isinstance(message, protocol.CopyData):
                while pgconn.put_copy_data(message.data) == 0:
                    select.select([], [pgconn.socket], [])
            elif isinstance(message, protocol.CopyDone):
                pgconn.put_copy_end()
                break
            elif isinstance(message, protocol.CopyFail):
                pgconn.put_copy_end(message.message or b"COPY failed")
                break
            elif isinstance(message, protocol.Flush | protocol.Sync):
                continue
            else:
                pgconn.put_copy_end(b"unexpected message type during COPY from stdin")
                break
        relay.flush(pgconn)
        return True


_STATUS = {pq.TransactionStatus.IDLE: b"I", pq.TransactionStatus.INTRANS: b"T",
           pq.TransactionStatus.INERROR: b"E"}  # fmt: skip

# what makes the backend's transaction block fail when the cache failed one of its statements
_FAIL_TRANSACTION = (b"DO $$BEGIN RAISE EXCEPTION 'mtcache: the cache server failed a "
                     b"statement of this transaction block'; END$$")  # fmt: skip


class _Refusal(Exception):
    """The server refuses a message: an ErrorResponse with this SQLSTATE."""

    def __init__(self, sqlstate: str, text: str) -> None:
        super().__init__(text)
        self.sqlstate = sqlstate


_Described = Callable[[tuple[int, ...], list[Field] | None], None]


def _then(then: _Described, found: tuple[tuple[int, ...], list[Field] | None]) -> bool:
    then(*found)
    return True


def _formats(result: pq.abc.PGresult) -> list[int]:
    return [result.fformat(i) for i in range(result.nfields)]


def _name(name: bytes) -> str:
    return name.decode(errors="replace")


def result_fields(result: Result, formats: list[int]) -> list[Field]:
    """A result's RowDescription: PostgreSQL's own description of the statement where the
    engine has it (table and column numbers included), else name and type."""
    described = result.described
    if described is not None:
        return relay.fields_of(described, formats)
    columns = result.columns or ()
    return [Field(c.name.encode(), 0, 0, c.type_oid or 25, _TEXT_SIZE, c.type_modifier, f)
            for c, f in zip(columns, formats, strict=True)]  # fmt: skip


def diagnostics_of(diag: psycopg.errors.Diagnostic) -> list[tuple[str, str]]:
    """A psycopg Diagnostic's fields as (name, value), in protocol order."""
    return diagnostics(_WithDiag(diag))


class _WithDiag(Exception):
    def __init__(self, diag: psycopg.errors.Diagnostic) -> None:
        super().__init__(diag.message_primary)
        self.diag = diag


__all__ = ["Conversation"]
