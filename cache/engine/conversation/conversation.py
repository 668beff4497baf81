"""One client's conversation with the server, after startup: the messages of the simple and
extended query protocols, each answered by the session engine (cached reads and the cache's
own statements) or passed through to the backend on the session's own connection
(`cache.engine.link.relay`).

`Conversation.handle(message)` takes one message and writes the answer to ``out``; it does
no socket I/O with the client (`cache.server.server` moves the bytes). The extended protocol
keeps PostgreSQL's order: answers leave in the order of the messages, and after an error
every message up to the next Sync is ignored. Backend work of a pipeline is sent without
waiting (libpq's pipeline mode) and its answers are read in order when the client syncs or
flushes, or when a statement the engine answers comes next.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import logging
import re
import time
import typing as t
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg import pq
from psycopg.pq import ExecStatus

from cache.backend.session_pool import PREPARED_LIMIT
from cache.engine import inspect
from cache.engine.conversation.placeholders import Converted, to_backend, to_engine
from cache.engine.conversation.reported import Description
from cache.engine.conversation.statistics import FOLD, StatementStats
from cache.engine.lane import Lane
from cache.engine.link import relay
from cache.engine.read import Suspended, at_hand
from cache.engine.result import Result
from cache.engine.route import CacheDdl, CachedRead, Passthrough, Route, Write
from cache.engine.session import Session
from cache.wire import protocol, values
from cache.wire.oids import OID
from cache.wire.protocol import Field, ProtocolViolation
from sql_ext.errors import Error, QueryCanceledError, diag_fields, diagnostics
from sql_ext.statements import split_statements

log = logging.getLogger("mtcache.server")

Out = Callable[[bytes], None]

# pg_type.typlen of the types the cache's own results have (-1: variable length)
_SIZES = {OID.bool: 1, OID.int8: 8, OID.float8: 8, OID.timestamptz: 8}
_READY_IDLE = protocol.ready_for_query(b"I")
_POSITION = "mtcache.position"  # reported with mtcache.report_position
_ONE_SELECTED = protocol.select_complete(1) + _READY_IDLE
# settings that shape PostgreSQL's text output without being reported in ParameterStatus
_OUTPUT_SETTINGS = ("EXTRA_FLOAT_DIGITS", "BYTEA_OUTPUT", "RESET ALL", "DISCARD")


@dataclass
class Statement:
    """A statement the client prepared (Parse)."""

    sql: bytes  # as the client sent it
    text: str
    param_types: tuple[int, ...]  # as the client gave them (0: unspecified)
    converted: Converted  # the engine's text: $n as %s
    route: Route
    backend_name: bytes | None = None  # its name at the backend once parsed there
    described: Description | None = None  # once described
    # its RowDescription by the result format codes of a Bind (`Conversation._row_description`)
    row_descriptions: dict[tuple[int, ...], bytes] = dataclasses.field(default_factory=dict)
    lane: _Lane | None = None  # its runs' hit path in the session (`Conversation.lane_at_hand`)
    # its runs passed through raw (`Conversation.raw_lane`): their shape, the backend's Bind
    # head for them, and the conversation's `handled` count when the last was
    raw_shape: protocol.RunShape | None = None
    raw_head: bytes = b""
    raw_handled: int = -1
    answered_at: int = -1  # the session's epoch at its last run answered at hand without one

    @property
    def passthrough(self) -> bool:
        return isinstance(self.route, Passthrough | Write)

    @functools.cached_property
    def copies(self) -> bool:
        """Whether it is a COPY (its data passes outside libpq's pipeline mode)."""
        return _COPY.match(self.text) is not None

    @property
    def returns_rows(self) -> bool:
        """Whether it is a query: its rows are described even when it has no column
        (``SELECT``: a RowDescription of no field, where other statements have NoData)."""
        routed = self.route
        return isinstance(routed, CachedRead) or (
            isinstance(routed, Passthrough) and routed.reads is not None
        )

    def rows_described(self, found: Description) -> Description:
        """A description from libpq, which gives no field alike for NoData and for rows of
        no column: the latter for a query."""
        params, fields = found
        return (params, []) if fields is None and self.returns_rows else found

    @functools.cached_property
    def relayed_as_is(self) -> bool:
        """Whether passing it through needs no more than relaying the backend's answer (no
        effect `_forwarded` notes)."""
        return not any(_effects(self.text))

    @functools.cached_property
    def raw(self) -> bool:
        """Whether its runs may pass through byte for byte (`Conversation.raw_run`): a plain
        read or write of rows, which leaves the backend session as its answer shows (no
        transaction control, DDL, SET, LISTEN or output setting, no set_config by name)."""
        routed = self.route
        plain = (isinstance(routed, Passthrough) and routed.reads is not None) or (
            isinstance(routed, Write) and routed.tables is not None and not routed.changes_catalog
        )
        return plain and self.relayed_as_is and "SET_CONFIG" not in self.text.upper()

    @functools.cached_property
    def encodable(self) -> bool:
        """Whether the server encodes every column of its description (once described)."""
        assert self.described is not None and self.described[1] is not None
        return values.encodable(f.type_oid for f in self.described[1])

    @property
    def engine_sql(self) -> str:
        """The text the engine routes and plans (``%s`` marks for ``$n`` ones)."""
        converted = self.converted
        return converted.sql if converted.order else self.text

    @property
    def backend_text(self) -> str:
        """What the backend is sent for the statement: a cached read's clauses cut out."""
        routed = self.route
        if not isinstance(routed, CachedRead):
            return self.text
        order = self.converted.order
        return to_backend(routed.query.backend_sql, order) if order else routed.query.backend_sql


@dataclass(frozen=True, slots=True, eq=False)
class _Lane:
    """The hit path of a statement's runs of one shape while the session only reads at hand
    (`Conversation.lane_at_hand`): the engine's lane, and the bytes around its rows."""

    epoch: int  # the conversation's, when it was made
    run: protocol.RunShape
    # a run's whole answer (`_lane_answer`), or None: the full path answers it
    answer: Callable[[bytes], bytes | None]


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


@dataclass
class _Relaying:
    """A backend command's results on their way to the client (`Conversation._relay_result`)."""

    conn: psycopg.Connection[t.Any]
    out: Out
    simple: bool
    mixed: list[int] | None
    ok: bool = True
    described: bool = False  # (simple) the rows under way were described
    transcoder: relay.Transcoder | None = None
    tag: relay.Tag = dataclasses.field(default_factory=relay.Tag)


@dataclass
class Passing:
    """A run of a prepared statement passed through on the event loop
    (`Conversation.run_at_backend`)."""

    portal: Portal
    relaying: _Relaying
    fd: int  # the backend connection's socket (libpq's, which it drops if the connection ends)

    @property
    def pgconn(self) -> pq.abc.PGconn:
        return self.relaying.conn.pgconn

    def send_on(self) -> bool:
        """Send more of what libpq holds of the run; True while some is left (the caller
        waits for the backend's socket to take it)."""
        try:
            return bool(self.pgconn.flush())
        except psycopg.Error:
            return False  # (the failure is read with the answer)

    waiting = True  # (libpq may have left bytes to send: the loop's writer is dropped at the end)


@dataclass(slots=True)
class RawRun:
    """A run of a plain statement passed through byte for byte (`Conversation.raw_run`):
    what the backend is sent, and its answer read as it comes (`Conversation.raw_received`)."""

    statement: Statement
    send: bytes  # what is still to be written to the backend
    fd: int  # the backend connection's socket
    scan: protocol.AnswerScan = dataclasses.field(default_factory=protocol.AnswerScan)
    waiting: bool = False  # the loop waits for the backend's socket to take the rest of send
    lost: bool = False  # the backend connection ended under it (`Conversation.raw_lost`)
    started: float = 0.0  # `time.perf_counter` when it was sent (with statement stats)


class Conversation:
    """The protocol state of one client connection (see the module)."""

    def __init__(
        self,
        session: Session,
        out: Out,
        settings: values.OutputSettings,
        describe: Callable[..., Description],
        next_message: Callable[[], protocol.Message],
        reported: dict[str, str],
    ) -> None:
        self.session = session
        self.out = out
        self.settings = settings
        self._describe = describe  # the backend's description of a statement, cached
        self._next_message = next_message  # the client's next message (COPY FROM STDIN)
        self.reported = reported  # the ParameterStatus values the client has
        self._reported_bytes: dict[bytes, bytes] = {}  # as libpq last gave them
        self._noticed: list[str] = []  # backend notices sent during the current statement
        session.add_notice_handler(self._notice)
        self.statements: dict[bytes, Statement] = {}
        self.portals: dict[bytes, Portal] = {}
        self._queue: deque[_Expect | _Ready] = deque()
        self._piped = False  # the backend connection is in pipeline mode
        self._unnamed_owner: Statement | None = None  # whose text the backend's "" holds
        self._unnamed_at = 0  # the link's `statements` when it was parsed
        self._names = 0
        self.ignoring = False  # after an error, until Sync
        self.cancel_reason: str | None = None  # why the running statement is cancelled
        self._output_changed = False  # a statement may have changed `_OUTPUT_SETTINGS`
        self.listening = False  # a LISTEN reached the backend: notifications may come
        self.max_result_bytes: int | None = None  # a local answer's encoded rows, at most
        self.told_pid = 0  # the process id the client was told (BackendKeyData)
        # the error the backend ended the session with while it was idle: the session's last
        # message (`_notice`)
        self.farewell: bytes | None = None
        # statements by route, outcome and latency (`statistics`; None: not kept): when the
        # running one started (None: none runs), whether it failed
        self.statement_stats: StatementStats | None = None
        self._started: float | None = None
        self._failed = False
        # the client was sent an error of the statement the backend connection was lost
        # under: the session ends without another (a client expects one error a statement)
        self.told_lost = False
        # counts the messages handled other than reads at hand (`handle`, `run_at_backend`): a
        # lane made at another count may have seen another session state (`lane_at_hand`)
        self.epoch = 0
        # counts what `epoch` counts but runs passed through raw: a raw lane made at another
        # count may have seen another session state (`raw_lane`)
        self.handled = 0
        # what a raw answer changed that libpq did not see (`raw_received`, `resync`):
        # reported settings by name, and whether its transaction status moved
        self._unsynced: dict[str, str] = {}
        self._status_unsynced = False
        self._clock_unsynced = False  # a raw write's commit time waits for the clock
        self._raw_fd = -1  # the backend socket of the raw lanes (`raw_lane`)

    # -- messages ------------------------------------------------------------------------------

    def handle(self, message: protocol.Message) -> bool:
        """Answer one message; False when the client ends the session (Terminate)."""
        self.epoch += 1  # (anything but a read at hand may change the session: lanes end)
        self.handled += 1
        if isinstance(message, protocol.Terminate):
            return False
        if isinstance(message, protocol.Query | protocol.Execute):
            self._statement_starts()
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
                raise _Refusal(
                    "0A000",
                    "the fastpath function call interface is not supported "
                    "by the cache server: call the function in a SELECT",
                )
            elif isinstance(message, protocol.CopyData | protocol.CopyDone | protocol.CopyFail):
                pass  # outside COPY: PostgreSQL ignores them too
            else:
                raise ProtocolViolation(f"unexpected message {type(message).__name__}")
        except relay.BackendRefused as exc:
            self._drain()
            self.out(exc.message)
            self.ignoring = True
            self._failed = True
        except (_Refusal, Error, psycopg.Error) as exc:
            self._error(exc, getattr(message, "sql", None))
        return True

    def _statement_starts(self) -> None:
        """A statement's first message (Query, Execute): its latency runs from here to the
        ReadyForQuery that ends its cycle (`_ready`), when statements are counted."""
        if self.statement_stats is not None and self._started is None:
            self._started = time.perf_counter()
            self._failed = False
            self.session.last_route = "cache"

    def at_hand(self, message: protocol.Message) -> bool:
        """Answer ``message`` now if that needs no waiting: no backend, no DuckDB statement,
        no planning (the server's event loop answers cached point lookups of prepared
        statements so). False: nothing was done; `handle` it where waiting is allowed."""
        if not self._idle():
            return False
        if (
            isinstance(message, protocol.Sync)
            and self.session.link.pooled
            and self.session.link.if_open() is not None
        ):
            return False  # (a worker gives the connection back: that may ask the backend)
        if isinstance(message, protocol.Sync | protocol.Flush | protocol.Bind):
            return self.handle(message)
        if not isinstance(message, protocol.Describe | protocol.Execute | protocol.Close):
            return False
        if self.ignoring:
            return self.handle(message)  # ignored until Sync
        if isinstance(message, protocol.Execute):
            return self._execute_at_hand(message)
        if message.kind == b"S":
            statement = self.statements.get(message.name)
        else:
            portal = self.portals.get(message.name)
            statement = portal.statement if portal is not None else None
        if statement is None:
            return False  # (a cursor declared at the backend, or an error)
        if isinstance(message, protocol.Close):
            if message.kind == b"S" and statement.backend_name:
                return False
        elif statement.described is None and (
            statement.passthrough or isinstance(statement.route, CachedRead)
        ):
            return False  # the backend describes it
        return self.handle(message)

    def _execute_at_hand(self, message: protocol.Execute) -> bool:
        """`at_hand` of an Execute."""
        portal = self.portals.get(message.portal)
        if portal is None or portal.rows is not None or message.max_rows > 0:
            return False
        self._statement_starts()
        found = self._answer_at_hand(portal)
        if found is None:
            return False
        self._drain()
        try:
            self._send_local(portal, found[0], 0)
        except _Refusal as exc:  # (past --max-result-bytes: as `handle` refuses it)
            self._error(exc)
        return True

    def execution_at_hand(self, bind: protocol.Bind, describe: bool) -> bool:
        """A whole run of a prepared statement (`protocol.execution`: Bind, Describe of its
        portal or not, Execute, Sync) answered at once if it is a cached read whose answer is
        at hand: the bytes its messages get one by one (`at_hand`), with none of their
        turns. False: nothing was done."""
        if self.portals or self._queue or self.ignoring or not self._idle():
            return False
        statement = self.statements.get(bind.statement)
        if statement is None or not isinstance(statement.route, CachedRead):
            return False
        self._statement_starts()
        portal = Portal(statement, bind)
        lane = statement.lane
        run = protocol.run_shape(bind, describe)
        stale = lane is None or lane.epoch != self.epoch or lane.run != run
        # a lane is made at the second such run of an epoch (a session that writes between
        # its reads does not pay for lanes it would not use), for the unnamed portal
        found = self._answer_at_hand(
            portal,
            lane=stale
            and statement.answered_at == self.epoch
            and not bind.portal
            and not self.listening,
        )
        if found is None:
            return False
        result, made = found
        head = self._bound(portal, describe)
        self.out(head)
        try:
            self._send_local(portal, result, 0)
        except _Refusal as exc:  # (past --max-result-bytes: then the Sync's answer)
            self._error(exc)
            self.ignoring = False
            self._ready()
            return True
        self._ready()  # (the portal ends with the Sync: it was never kept)
        if stale:
            if made is not None:
                statement.lane = self._lane(portal, run, head, result, made)
            statement.answered_at = self.epoch
        return True

    def bound_statement(self, data: bytes) -> Statement | None:
        """The prepared statement ``data`` binds to the unnamed portal, if it starts with such
        a Bind (the runs of lanes, `lane_at_hand` and `raw_lane`, are read no further)."""
        if data[5:6] != b"\0" or data[:1] != b"B":
            return None
        return self.statements.get(data[6 : data.find(b"\0", 6)])

    def lane_at_hand(self, statement: Statement, data: bytes) -> bytes | None:
        """The answer to a run of a prepared statement (as `execution_at_hand` takes them;
        ``statement``: the one it binds, `bound_statement`) by the lane its last run made,
        when ``data`` differs from that run only in its parameter values and the session did
        nothing but read at hand since (``epoch``): the same bytes as `execution_at_hand`'s,
        with only what could have changed checked (`cache.engine.lane`), for the caller to
        send. None: nothing was done."""
        # (the backend's transaction status is not asked: it changes only by a statement,
        # which ends the lanes; a named portal is not a lane's)
        lane = statement.lane
        if (
            lane is None
            or lane.epoch != self.epoch
            or self.portals
            or self._queue
            or self.ignoring
            or self._piped
            or self._output_changed
        ):
            return None
        stats = self.statement_stats
        started = time.perf_counter() if stats is not None else 0.0
        answer = lane.answer(data)
        if answer is None:  # (it no longer holds, or not for this run: the full path answers,
            statement.lane = None  # and makes it again, `execution_at_hand`)
        elif stats is not None:  # (the hit path: no call, no lock; `StatementStats.fold_hits`)
            hits = stats.hits
            hits.append(time.perf_counter() - started)
            if len(hits) >= FOLD:
                stats.fold_hits()
        return answer

    def _lane(
        self, portal: Portal, run: protocol.RunShape, head: bytes, result: Result, made: Lane
    ) -> _Lane | None:
        """The server's side of the lane the engine made for a run `execution_at_hand` just
        answered (``head``: its BindComplete and RowDescription), if it can have one."""
        rows = result.rows
        if result.notices or rows is None or result.status != f"SELECT {len(rows)}":
            return None
        bind = portal.bind
        decoders = _decoders(bind, self._param_types(portal))
        if None in decoders:
            return None
        formats = relay.result_formats(bind.result_formats, len(result.columns or ()))
        return _Lane(
            self.epoch,
            run,
            _lane_answer(
                run,
                t.cast(list[values.Decoder], decoders),
                portal.statement.converted,
                made,
                self._encoders(result, formats),
                head,
            ),
        )

    def _bound(self, portal: Portal, describe: bool) -> bytes:
        """BindComplete, then the portal's description if asked (a run taken whole)."""
        if not describe:
            return protocol.BIND_COMPLETE
        assert portal.statement.described is not None
        return protocol.BIND_COMPLETE + (
            protocol.NO_DATA
            if portal.statement.described[1] is None
            else self._row_description(portal)
        )

    def run_at_backend(self, bind: protocol.Bind, describe: bool) -> Passing | None:
        """Send a whole run of a passed-through prepared statement (`protocol.execution`) to
        the backend without waiting for its answer, which `relay_ready` relays as it comes:
        the server's event loop passes statements through so, with no hand-off to a worker.
        None: nothing was done (the run is answered message by message)."""
        if (
            (bind.portal and bind.portal in self.portals)
            or self._queue
            or self.ignoring
            or self._piped
            or self._output_changed
            or self.session.report_position
        ):
            return None
        statement = self.statements.get(bind.statement)
        if (
            statement is None
            or not statement.passthrough
            or not statement.relayed_as_is
            or statement.copies
            or (describe and statement.described is None)
        ):
            return None
        conn = self.session.link.if_open()
        if conn is None or not self._at_backend(statement):
            return None  # (the connection is opened, or the statement parsed, by a worker)
        param_formats, result_format, mixed = _bind_formats(bind)
        if mixed is not None:
            return None
        self.epoch += 1  # (as in `handle`)
        self.handled += 1
        self._statement_starts()
        self.session.last_route = "remote"
        portal = Portal(statement, bind)
        bound = self._bound(portal, describe)
        pgconn = conn.pgconn
        pgconn.send_query_prepared(
            statement.backend_name or b"", list(bind.params), param_formats, result_format
        )
        pgconn.set_chunked_rows_mode(relay.CHUNK_ROWS)
        self.out(bound)
        return Passing(portal, _Relaying(conn, self.out, False, None), pgconn.socket)

    def relay_ready(self, passing: Passing) -> bool:
        """Relay what the backend has sent of a run `run_at_backend` sent (its socket is
        readable); True when the run is over and answered, ReadyForQuery included (or the
        connection failed under it: its error, then the Sync's answer)."""
        pgconn = passing.pgconn
        try:
            pgconn.consume_input()
            while not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    self._relay_over(passing)
                    return True
                self._relay_result(passing.relaying, result)
        except psycopg.Error as exc:
            self.relay_failed(exc)
            return True
        return False

    def relay_failed(self, exc: psycopg.Error) -> None:
        """The backend connection failed under a run `run_at_backend` sent: its error, then
        the Sync's answer."""
        self._error(exc)
        self._sync()

    def raw_run(self, data: bytes, bind: protocol.Bind, describe: bool) -> RawRun | None:
        """A run of a passed-through plain read or write (``data``, as `protocol.execution`
        recognized it) to be sent to the backend as the client sent it, its Bind naming the
        backend's statement, and answered with the backend's bytes as they come
        (`raw_received`): no libpq between, so the server's event loop only moves bytes, as
        a pooler does. Only where libpq's view of the backend session stays true: outside a
        transaction block, with nothing of the session's under way or asynchronous (LISTEN),
        over a connection without TLS or GSSAPI; what such a run may still change unseen
        (a function calling set_config) is settled after it (`resync`). The statement keeps
        the run's shape: its next runs are recognized by their bytes (`raw_lane`). None:
        nothing was done."""
        statement = self.statements.get(bind.statement)
        if statement is None or not statement.raw:
            return None
        if (
            self.session.link.pooled and self.session.link.pinned is None
        ) or self.session.report_position:
            return None  # (its connection may be another session's by its next run)
        conn = self.session.link.if_open()
        if (
            conn is None
            or not self._at_backend(statement)
            or self.portals
            or self._queue
            or self.ignoring
            or self.listening
            or self.needs_resync
            or self.session.provenance_notices
            or not self._idle()
        ):
            return None
        pgconn = conn.pgconn
        if pgconn.ssl_in_use or pgconn.used_gssapi:
            return None
        shape = protocol.run_shape(bind, describe)
        head = shape.renaming(statement.backend_name or b"")
        if not bind.portal:
            statement.raw_shape, statement.raw_head = shape, head
            statement.raw_handled = self.handled
            self._raw_fd = pgconn.socket
        self.epoch += 1  # (as in `handle`)
        return RawRun(
            statement,
            shape.rebound(data, head),
            pgconn.socket,
            started=time.perf_counter() if self.statement_stats else 0.0,
        )

    def raw_lane(self, statement: Statement, data: bytes) -> RawRun | None:
        """`raw_run` of a run that differs from the last of ``statement`` passed through
        raw only in its parameter values (compared as bytes, not parsed: `protocol.RunShape`)
        when the conversation has done nothing since but such runs and reads at hand
        (``handled``): nothing the conversation would have checked can have changed. None:
        nothing was done."""
        shape = statement.raw_shape
        if statement.raw_handled != self.handled or shape is None or not shape.fits(data):
            return None
        self.epoch += 1  # (as in `handle`)
        return RawRun(
            statement,
            shape.rebound(data, statement.raw_head),
            self._raw_fd,
            started=time.perf_counter() if self.statement_stats else 0.0,
        )

    def raw_received(self, run: RawRun, data: bytes) -> bytes | None:
        """The whole messages of what the backend sent of a raw run, for the caller to
        forward; ``run.scan.done`` when its answer is over (then `raw_over`). None: the
        backend broke the protocol (the run is lost: `raw_lost`)."""
        try:
            return run.scan.feed(data)
        except protocol.BackendViolation as exc:
            self.raw_lost(run, str(exc))
            return None

    def raw_over(self, run: RawRun) -> None:
        """The session's bookkeeping of a raw run whose answer is over, done once the client
        has the answer (its own next statement waits for it, but not its reading of this
        one); `resync` is then due if ``needs_resync``."""
        scan = run.scan
        if self.statement_stats is not None:
            self.statement_stats.record(
                "remote", not scan.failed and not run.lost, time.perf_counter() - run.started
            )
        if scan.fatal:  # (the backend ended the session: the client has its error)
            self.told_lost = True
        if run.lost:
            return
        if not scan.failed:  # (`_forwarded`, its effects known to be none: `Statement.raw`)
            route = t.cast(Passthrough | Write, run.statement.route)
            if not self.session.forwarded_at_hand(route):
                self._clock_unsynced = True  # (`resync` settles it)
        if scan.reported or scan.status != b"I" or self._clock_unsynced:
            self.handled += 1  # (a worker must settle what the loop could not: `resync`)
            codec = self.settings.codec
            for name, value in scan.reported:  # (the client has them: they were answered)
                key, text = name.decode(codec, "replace"), value.decode(codec, "replace")
                self._client_has(key, text)
                self._unsynced[key] = text
                self._reported_bytes[name] = value  # (as libpq will hold it: `resync`)
            self._status_unsynced = scan.status != b"I"

    def raw_lost(self, run: RawRun, why: str) -> None:
        """The backend connection ended (or sent what is not the protocol) under a raw run:
        the connection is given up (`BackendLink.lose`: the server then ends the
        session, as PostgreSQL ends it); the client has what came whole before."""
        run.lost = True
        self.handled += 1
        self.session.link.lose()
        log.warning("a session's backend connection was lost under a statement: %s", why)

    @property
    def needs_resync(self) -> bool:
        return bool(self._unsynced) or self._status_unsynced or self._clock_unsynced

    def resync(self) -> bool:
        """libpq's view of the backend session made true again after a raw answer changed
        what libpq keeps (a worker's job; True: the session goes on). The transaction status
        is learnt by an empty query's ReadyForQuery; a reported setting by making the
        backend report it twice: set back to the value libpq holds (the one it had before),
        then to the new one, each in a statement of its own, the backend reporting a setting
        only when it differs from what it last reported. Settings no statement can set
        (server_version, in_hot_standby, ...) are left: only the client reads them, and it
        got them. A write relayed while the backend's clock was due to be measured gets its
        commit time here (`Session.caught_up`)."""
        unsynced, self._unsynced = self._unsynced, {}
        status_moved, self._status_unsynced = self._status_unsynced, False
        conn = self.session.link.if_open()
        pgconn = conn.pgconn if conn is not None else None
        if status_moved and pgconn is not None:
            self._own_statement(pgconn, b"")
        if self._clock_unsynced:
            self._clock_unsynced = False
            self.session.caught_up()
        if pgconn is None:
            return True
        names = [
            n
            for n in unsynced
            if n not in _READ_ONLY_REPORTED and pgconn.parameter_status(n.encode()) is not None
        ]
        if not names or pgconn.transaction_status != _IDLE:
            return True
        sets = b"SELECT " + b", ".join(
            b"set_config($%d, $%d, false)" % (2 * i + 1, 2 * i + 2) for i in range(len(names))
        )
        before = [pgconn.parameter_status(n.encode()) for n in names]
        for values_ in (before, [unsynced[n].encode(self.settings.codec) for n in names]):
            params = [p for n, v in zip(names, values_, strict=True) for p in (n.encode(), v)]
            result = self._own_statement(pgconn, sets, params)
            if result is None or result.status != ExecStatus.TUPLES_OK:
                log.warning(
                    "the server could not bring libpq's copy of %s up to date: %s",
                    ", ".join(names),
                    result and result.error_message,
                )
                break
        return True

    def _own_statement(
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

    def _relay_over(self, passing: Passing) -> None:
        """A run relayed whole: what its Execute and Sync do after the backend's answer
        (on the event loop: what needs the backend's clock measured is left to `resync`)."""
        portal = passing.portal
        if passing.relaying.ok and not self._passed(portal.statement, portal.statement.route):
            self._clock_unsynced = True
        if not self.session.settle_at_hand():  # (as when a pipeline ends)
            self._clock_unsynced = True
        self.portals[portal.bind.portal] = portal  # (the Sync ends it with its transaction)
        self._sync()

    def _idle(self) -> bool:
        """Nothing of the session's waits at the backend, and no transaction block is open
        there (outside one, a statement that fails touches nothing): answers at hand may be
        given."""
        return (
            not (self._piped or self._output_changed)
            and self.session.link.transaction_status() == pq.TransactionStatus.IDLE
        )

    def _answer_at_hand(
        self, portal: Portal, lane: bool = False
    ) -> tuple[Result, Lane | None] | None:
        """The answer of a bound cached read of a described statement from what the cache
        holds in memory (`Session.read` as far as it goes without waiting), and with ``lane``
        the lane it leaves; None: nothing was done."""
        statement = portal.statement
        routed, described = statement.route, statement.described
        # (columns the server cannot encode: known before the engine counts an answer)
        if (
            not isinstance(routed, CachedRead)
            or described is None
            or described[1] is None
            or not statement.encodable
            or not self.settings.supported
        ):
            return None
        if len(portal.bind.result_formats) not in (0, 1, len(described[1])):
            return None  # (refused where errors are made)
        try:
            params = self._engine_params(portal)
            reading = at_hand(self.session.read(routed.query, params, lane=lane))
        except (_Refusal, Error):
            return None  # (nothing was done: an error is made where it is handled)
        if isinstance(reading, Suspended) or reading.result is None:
            return None  # (nothing that counts was done: the full path reads it again)
        result = reading.result
        return (result, reading.lane) if _encodes(result) else None

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
        for part, routed in routes:
            if isinstance(routed, Passthrough):
                self._check_encoding(part)
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
                    self._send_result(result, describe=True, formats=None)
                ok = True
            else:
                ok = all(self._engine_simple(part, routed) for part, routed in group)
            if not ok:
                return

    def _backend_simple(self, sql: bytes | None, run: list[tuple[str, Route]]) -> bool:
        """Statements passed through in one Query message (one implicit transaction)."""
        if sql is None:
            sql = ";".join(part for part, _ in run).encode(self.settings.codec)
        ok = self._relay_query(sql)
        for part, routed in run:
            if not self._forwarded(part, t.cast(Passthrough | Write, routed)):
                self.session.caught_up()
        self._provenance_notice()
        return ok

    def _relay_query(self, sql: bytes) -> bool:
        conn = self._backend()
        pgconn = conn.pgconn
        pgconn.send_query(sql)
        relay.flush(pgconn)
        pgconn.set_chunked_rows_mode(relay.CHUNK_ROWS)
        ok = self._relay_results(conn, self.out, simple=True)
        self._notifications()
        return ok

    def _relay_results(
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
        relaying = _Relaying(conn, out, simple, mixed)
        while (result := relay.wait_result(conn.pgconn)) is not None:
            self._relay_result(relaying, result)
        return relaying.ok

    def _relay_result(self, relaying: _Relaying, result: pq.abc.PGresult) -> None:
        """One result of a backend command (`_relay_results`)."""
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
        elif status == ExecStatus.COPY_OUT:  # (never piped: `_execute_copy`)
            self._copy_out(relaying.conn, result)
        elif status == ExecStatus.COPY_IN:
            self._copy_in(relaying.conn, result)
        else:
            self._backend_error(relay.diagnostic_message(result))
            relaying.ok = False

    def _forwarded(self, sql: str, routed: Passthrough | Write) -> bool:
        """A statement reached the backend: a note when it may have changed a setting local
        answers are encoded by, and the session's bookkeeping (`Session.forwarded_at_hand`:
        False when what needs the backend's clock is left to `Session.caught_up`)."""
        output, listens = _effects(sql)
        self._output_changed |= output
        self.listening |= listens
        return self.session.forwarded_at_hand(routed)

    def _engine_simple(self, text: str, routed: Route) -> bool:
        """A statement the cache answers (or judges) in a Query message."""
        self._check_not_failed()
        if isinstance(routed, CachedRead):
            result = self._read_locally(routed, None)
            if result is None:  # the backend answers it, its clauses cut out
                ok = self._relay_query(routed.query.backend_sql.encode(self.settings.codec))
                self.session.answered_remotely(routed.query)
                self._provenance_notice()
                return ok
        else:
            result = self.session.execute(text)
        self._send_result(result, describe=True, formats=None)
        return True

    # -- the extended query protocol -----------------------------------------------------------

    def _parse(self, message: protocol.Parse) -> None:
        text = message.sql.decode(self.settings.codec)
        converted = to_engine(text)
        engine_sql = converted.sql if converted.order else text
        routed = self._route(engine_sql, with_params=bool(converted.order))
        if isinstance(routed, Passthrough):
            self._check_encoding(text)
        statement = Statement(message.sql, text, message.param_types, converted, routed)
        name = message.name
        if name and name in self.statements:
            raise _Refusal(
                "42P05", f'prepared statement "{name.decode(errors="replace")}" already exists'
            )
        previous = self.statements.get(name) if not name else None
        if previous is not None and previous.backend_name:
            self._close_at_backend(previous)
        self.statements[name] = statement
        if not statement.passthrough:
            self._queue.append(_Ready(protocol.PARSE_COMPLETE))
            return
        backend_name = b""  # the backend's names are the server's (the engine names too)
        if name and self.session.link.pooled:  # named by its text: pooled sessions share it
            backend_name = _pooled_name(statement)
            if self.session.link.if_open() is None or self._at_backend(statement, backend_name):
                # parsed at the backend when first used (`_ensure_at_backend`): a client that
                # prepares synchronously for many sessions (pgbench's threads) waits for no
                # pooled connection here while its other sessions hold them
                statement.backend_name = backend_name
                self._queue.append(_Ready(protocol.PARSE_COMPLETE))
                return
        elif name:
            self._names += 1
            backend_name = f"mtcache_{self._names}".encode()
        self._prepare_at_backend(statement, backend_name, protocol.PARSE_COMPLETE)

    def _prepare_at_backend(
        self, statement: Statement, backend_name: bytes, answer: bytes = b""
    ) -> None:
        """Parse the statement at the backend under this name; ``answer`` for the client
        when it succeeds."""
        pgconn = self._piped_backend()
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
                self._discard_result(pgconn)
        pgconn.send_prepare(backend_name, statement.sql, statement.param_types or None)

        def failed() -> None:
            statement.backend_name = None
            if prepared is not None:
                prepared.pop(backend_name, None)

        self._expect_command(pgconn, lambda _: self.out(answer), failed)

    def _bind(self, message: protocol.Bind) -> None:
        statement = self.statements.get(message.statement)
        if statement is None:
            raise _Refusal(
                "26000", f'prepared statement "{_name(message.statement)}" does not exist'
            )
        if message.portal and message.portal in self.portals:
            raise _Refusal("42P03", f'cursor "{_name(message.portal)}" already exists')
        self.portals[message.portal] = Portal(statement, message)
        self._queue.append(_Ready(protocol.BIND_COMPLETE))

    def _describe_message(self, message: protocol.Describe) -> None:
        if message.kind == b"S":
            statement = self.statements.get(message.name)
            if statement is None:
                raise _Refusal(
                    "26000", f'prepared statement "{_name(message.name)}" does not exist'
                )
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
            self._describe_backend_portal(message.name)
            return

        def described(_: tuple[int, ...], fields: list[Field] | None) -> None:
            self.out(protocol.NO_DATA if fields is None else self._row_description(portal))

        self._with_description(portal.statement, described)

    @staticmethod
    def _row_description(portal: Portal) -> bytes:
        """The RowDescription of a portal of a described statement that returns rows, in
        its result formats (made once per statement and formats)."""
        statement = portal.statement
        codes = portal.bind.result_formats
        found = statement.row_descriptions.get(codes)
        if found is None:
            assert statement.described is not None and statement.described[1] is not None
            fields = statement.described[1]
            formats = relay.result_formats(codes, len(fields))
            found = protocol.row_description(
                [f._replace(format=c) for f, c in zip(fields, formats, strict=True)]
            )
            statement.row_descriptions[codes] = found
        return found

    def _describe_backend_portal(self, name: bytes) -> None:
        """A portal the client did not bind here: a cursor it declared at the backend
        (``DECLARE c CURSOR FOR ...``, as psycopg's server-side cursors do), described there
        (where, if it does not exist either, the backend says so)."""
        if not name or self.session.link.if_open() is None:
            raise _Refusal("34000", f'portal "{_name(name)}" does not exist')
        pgconn = self._piped_backend()
        pgconn.send_describe_portal(name)
        self._expect_command(
            pgconn,
            lambda result: self.out(
                protocol.row_description(relay.fields_of(result))
                if result.nfields
                else protocol.NO_DATA
            ),
        )

    def _with_description(self, statement: Statement, then: _Described) -> None:
        """Call ``then`` with the statement's parameter types and columns, in its turn."""
        if statement.described is not None:
            found = statement.described
            self._queue.append(_Expect(lambda: _then(then, found)))
            return
        if not statement.passthrough and not isinstance(statement.route, CachedRead):
            # the cache's own statements: their columns are known without running them
            columns = inspect.result_columns(statement.route)
            found = (
                tuple(statement.param_types),
                None if columns is None else [_field(name, oid, -1, 0) for name, oid in columns],
            )
            statement.described = found
            self._queue.append(_Expect(lambda: _then(then, found)))
            return
        if not statement.passthrough:
            found = statement.rows_described(
                self._description(statement.backend_text, statement.param_types)
            )
            statement.described = found
            self._queue.append(_Expect(lambda: _then(then, found)))
            return
        pgconn = self._piped_backend()
        self._ensure_at_backend(statement)
        pgconn.send_describe_prepared(statement.backend_name or b"")

        def described(result: pq.abc.PGresult) -> None:
            params = tuple(result.param_type(i) for i in range(result.nparams))
            found = statement.rows_described(
                (params, relay.fields_of(result) if result.nfields else None)
            )
            statement.described = found
            then(*found)

        self._expect_command(pgconn, described)

    def _execute(self, message: protocol.Execute) -> None:
        portal = self.portals.get(message.portal)
        if portal is None:
            raise _Refusal("34000", f'portal "{_name(message.portal)}" does not exist')
        if portal.rows is not None:  # a row-limited portal, continued
            self._queue.append(_Ready(self._portal_rows(portal, message.max_rows)))
            return
        statement = portal.statement
        if statement.copies:
            self._execute_copy(portal)
            return
        if statement.passthrough:
            self._execute_at_backend(portal, message.max_rows)
            return
        self._drain()
        if self.ignoring:
            return
        self._check_not_failed()
        routed = statement.route
        try:
            params = self._engine_params(portal)
        except _Unreadable:
            if not isinstance(routed, CachedRead):
                raise
            # a read whose values the cache cannot take (a regclass, say): the backend
            # answers it, as it answers every read the cache does not
            self._execute_text_at_backend(portal, routed, message.max_rows)
            return
        if isinstance(routed, CachedRead):
            result = self._read_locally(routed, params)
            if result is None:
                self._execute_text_at_backend(portal, routed, message.max_rows)
                return
        else:
            result = self.session.execute(statement.engine_sql, params or None)
        self._send_local(portal, result, message.max_rows)

    def _send_local(self, portal: Portal, result: Result, max_rows: int) -> None:
        """The engine's answer to an Execute: in the portal's result formats, at most
        ``max_rows`` rows now (the rest kept in the portal)."""
        formats = relay.result_formats(portal.bind.result_formats, len(result.columns or ()))
        if max_rows > 0 and result.rows is not None:
            self._send_result(result, describe=False, formats=formats, into=self._holder(portal))
            self.out(self._portal_rows(portal, max_rows))
            return
        self._send_result(result, describe=False, formats=formats)

    def _execute_at_backend(self, portal: Portal, max_rows: int) -> None:
        statement = portal.statement
        pgconn = self._piped_backend()
        self._ensure_at_backend(statement)
        bind = portal.bind
        param_formats, result_format, mixed = _bind_formats(bind)
        pgconn.send_query_prepared(
            statement.backend_name or b"", list(bind.params), param_formats, result_format
        )
        self._expect_rows(portal, max_rows, mixed, statement.route)

    def _execute_copy(self, portal: Portal) -> None:
        """COPY sent by Parse, Bind and Execute. libpq runs no COPY in pipeline mode: what is
        queued is answered first and the pipeline left (with no Sync: the backend's implicit
        transaction goes on), then the COPY's data passes as in a Query message."""
        statement = portal.statement
        self._ensure_at_backend(statement)
        self._drain()
        if self.ignoring:
            return
        conn = self._backend()
        pgconn = conn.pgconn
        if self._piped:
            pgconn.exit_pipeline_mode()  # (every result read: nothing is pending)
            self._piped = False
        param_formats, result_format, mixed = _bind_formats(portal.bind)
        pgconn.send_query_prepared(
            statement.backend_name or b"", list(portal.bind.params), param_formats, result_format
        )
        relay.flush(pgconn)
        if not self._relay_results(conn, self.out, simple=False, mixed=mixed):
            self.ignoring = True
        elif not self._passed(statement, statement.route):
            self.session.caught_up()

    def _execute_text_at_backend(self, portal: Portal, routed: CachedRead, max_rows: int) -> None:
        """A cached read the backend answers: its text (clauses cut), the client's values."""
        pgconn = self._piped_backend()
        bind = portal.bind
        statement = portal.statement
        types = statement.described[0] if statement.described else statement.param_types
        param_formats, result_format, mixed = _bind_formats(bind)
        pgconn.send_query_params(
            statement.backend_text.encode(self.settings.codec),
            list(bind.params),
            list(types) or None,
            param_formats,
            result_format,
        )
        self._unnamed_owner = None
        self._expect_rows(portal, max_rows, mixed, None)
        self.session.answered_remotely(routed.query)

    def _expect_rows(
        self, portal: Portal, max_rows: int, mixed: list[int] | None, routed: Route | None
    ) -> None:
        conn = self._backend()

        def read() -> bool:
            held = max_rows > 0
            if not held:
                # refused (an aborted pipeline, whose results are only read past): no matter
                with contextlib.suppress(psycopg.OperationalError):
                    conn.pgconn.set_chunked_rows_mode(relay.CHUNK_ROWS)
            out = self._holder(portal) if held else self.out
            ok = self._relay_results(conn, out, simple=False, mixed=mixed)
            if ok and not self._passed(portal.statement, routed):
                self.session.caught_up()
            if held and ok:
                self.out(self._portal_rows(portal, max_rows))
            return ok

        self._queue.append(_Expect(read))

    def _passed(self, statement: Statement, routed: Route | None) -> bool:
        """A statement the backend answered: the bookkeeping of one passed through (None: a
        cached read it answered, counted apart), and the provenance NOTICE; False when what
        needs the backend's clock is left to `Session.caught_up`."""
        kept = routed is None or self._forwarded(
            statement.text, t.cast(Passthrough | Write, routed)
        )
        self._provenance_notice()
        return kept

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
        elif (
            self.portals.pop(message.name, None) is None
            and message.name
            and self.session.link.if_open() is not None
        ):
            pgconn = self._piped_backend()  # a cursor declared at the backend
            pgconn.send_close_portal(message.name)
            self._discard_result(pgconn)
        self._queue.append(_Ready(protocol.CLOSE_COMPLETE))

    def _close_at_backend(self, statement: Statement) -> None:
        name = statement.backend_name
        statement.backend_name = None
        if not name or self.session.link.pooled:
            return  # (a pooled connection's are shared: the oldest are closed, `_prepare_...`)
        pgconn = self._piped_backend()
        pgconn.send_close_prepared(name)
        self._discard_result(pgconn)

    def _ensure_at_backend(self, statement: Statement) -> None:
        """Parse the statement at the backend again if its unnamed statement was replaced."""
        if not self._at_backend(statement):
            self._prepare_at_backend(statement, statement.backend_name or b"")

    def _at_backend(self, statement: Statement, name: bytes | None = None) -> bool:
        """Whether the backend holds the statement parsed (under ``name``, else its own): its
        unnamed statement may have been replaced since, and a pooled connection may be
        another than the one it was parsed on."""
        name = statement.backend_name if name is None else name
        if name is None:
            return False
        if name == b"":
            return (
                self._unnamed_owner is statement
                and self._unnamed_at == self.session.link.statements
            )  # (the engine's took it)
        prepared = self.session.link.prepared
        if prepared is None:
            return not self.session.link.pooled  # (a session's own connection holds its own)
        if name not in prepared:
            return False
        prepared.move_to_end(name)
        return True

    def _sync(self) -> None:
        if self._piped:
            self._backend().pgconn.pipeline_sync()
        self._drain(leave_pipeline=True)
        self.ignoring = False
        if self.session.link.transaction_status() == pq.TransactionStatus.IDLE:
            self.portals.clear()  # portals end with their transaction, as PostgreSQL's
        self._ready()

    # -- backend pipeline ------------------------------------------------------------------------

    def _backend(self) -> psycopg.Connection[t.Any]:
        return self.session.link.connection()

    def _piped_backend(self) -> pq.abc.PGconn:
        conn = self._backend()
        pgconn = conn.pgconn
        if not self._piped:
            pgconn.enter_pipeline_mode()
            self._piped = True
        return pgconn

    def _expect_command(
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
                self._backend_error(relay.diagnostic_message(result))
                return False
            done(result)
            return True

        self._queue.append(_Expect(read))

    def _discard_result(self, pgconn: pq.abc.PGconn) -> None:
        """A piped command whose result the client does not see."""
        self._queue.append(_Expect(lambda: bool(self._command_result(pgconn)) or True))

    def _check_not_failed(self) -> None:
        """The cache answers nothing in a failed transaction block, as PostgreSQL."""
        if self.session.link.transaction_status() == pq.TransactionStatus.INERROR:
            raise _Refusal(
                "25P02",
                "current transaction is aborted, commands ignored until end of transaction block",
            )

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
                self._read_past(item)
            elif not item.read():
                self.ignoring = True
        if self._piped and leave_pipeline and pgconn is not None:
            # the Sync's own result, then out of pipeline mode
            while True:
                result = relay.wait_result(pgconn)
                if result is not None and result.status == ExecStatus.PIPELINE_SYNC:
                    break
                if result is None and pgconn.status == pq.ConnStatus.BAD:
                    self._piped = False  # (the connection is gone: the session ends)
                    raise psycopg.OperationalError("the backend connection was lost")
            pgconn.exit_pipeline_mode()
            self._piped = False
            self.session.settle()

    def _description(self, text: str, types: tuple[int, ...]) -> Description:
        """The backend's description of a cached read: shared by the sessions, or, when a
        shared connection cannot describe it (a temporary table of this session's), made on
        the session's own connection."""
        try:
            return self._describe(text, types)
        except relay.BackendRefused:
            self._drain()
            self._unnamed_owner = None  # (the description takes the backend's unnamed statement)
            return self._describe(text, types, self._backend())

    # -- the engine's answers ------------------------------------------------------------------

    def _route(self, sql: str, with_params: bool) -> Route:
        return self.session.route(sql, with_params)

    def _read_locally(self, routed: CachedRead, params: list[t.Any] | None) -> Result | None:
        """The cache's answer, if it gives one the server can encode."""
        if not self.settings.supported:
            return None
        result = self.session.read_locally(routed.query, params)
        return result if result is not None and _encodes(result) else None

    def _engine_params(self, portal: Portal) -> list[t.Any]:
        statement = portal.statement
        converted = statement.converted
        if not converted.order:
            return []
        bind = portal.bind
        types = self._param_types(portal)
        if len(bind.params) != len(types):
            raise _Refusal(
                "08P01",
                f"bind message supplies {len(bind.params)} parameters, "
                f"but prepared statement requires {len(types)}",
            )
        decoded: list[t.Any] = []
        for i, (value, decode) in enumerate(zip(bind.params, _decoders(bind, types), strict=True)):
            if value is None:
                decoded.append(None)
                continue
            if decode is None:
                raise _Unreadable(
                    "0A000", f"parameter ${i + 1} has a type (OID {types[i]}) the cache cannot read"
                )
            decoded.append(decode(value))
        return converted.params(decoded)

    def _param_types(self, portal: Portal) -> tuple[int, ...]:
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

    def _send_result(
        self, result: Result, *, describe: bool, formats: list[int] | None, into: Out | None = None
    ) -> None:
        out = into or self.out
        for notice in result.notices:
            if notice in self._noticed:  # the backend's, sent as it came
                self._noticed.remove(notice)
                continue
            self._cache_notice(notice)
        columns = result.columns
        if result.rows is None or columns is None:
            out(protocol.command_complete(result.status or ""))
            return
        if formats is None:
            formats = [0] * len(columns)
        if describe:
            out(protocol.row_description(result_fields(result, formats)))
        encoders = self._encoders(result, formats)
        limit = self.max_result_bytes
        if limit is None:
            for row in result.rows:
                out(protocol.data_row(row, encoders))
        else:  # (encoded whole first: a result past the limit sends none of its rows)
            rows, total = [], 0
            for row in result.rows:
                data = protocol.data_row(row, encoders)
                total += len(data)
                if total > limit:
                    raise _Refusal(
                        "54000",
                        f"the result is larger than the cache server's "
                        f"limit of {limit} bytes (--max-result-bytes): ask for "
                        "fewer rows (LIMIT), or read it in parts through a cursor",
                    )
                rows.append(data)
            for data in rows:
                out(data)
        out(protocol.command_complete(result.status or f"SELECT {len(result.rows)}"))

    def _encoders(self, result: Result, formats: list[int]) -> tuple[values.Encoder, ...]:
        """How each column of an engine's result is encoded, in these formats."""
        oids = tuple(c.type_oid or OID.text for c in result.columns or ())
        return values.encoders(oids, tuple(formats), self.settings)

    def _cache_notice(self, notice: str) -> None:
        """A NOTICE of the cache's own (with its JSON detail, if it has one)."""
        self.out(
            protocol.error_response(
                "00000",
                notice,
                severity="NOTICE",
                notice=True,
                detail=getattr(notice, "detail", None),
            )
        )

    def _provenance_notice(self) -> None:
        """After a statement the backend answered: its provenance NOTICE, if the session asks
        for one (``mtcache.provenance``)."""
        notice = self.session.statement_notice()
        if notice is not None:
            self._cache_notice(notice)

    # -- errors ----------------------------------------------------------------------------------

    def _error(self, exc: BaseException, sql: bytes | None = None) -> None:
        if self.told_lost:
            return  # (the session ends with the error the backend ended it with)
        self._drain()
        codec = self.settings.codec
        text = sql.decode(codec, errors="replace") if sql is not None else None
        if not isinstance(exc, psycopg.Error):
            self._fail_transaction()
        if isinstance(exc, QueryCanceledError) and self.cancel_reason is not None:
            exc = QueryCanceledError(f"canceling statement due to {self.cancel_reason}")
        if isinstance(exc, psycopg.Error) and self.session.link.lost:
            # (libpq's loss of the connection, which psycopg may class by the call that saw
            # it: the session ends with it, as PostgreSQL's would; with the error the backend
            # ended it by, when it sent one while the session was idle)
            self._backend_error(
                self.farewell
                or protocol.error_response(
                    "08006",
                    f"the backend connection was lost: {str(exc).strip()}",
                    severity="FATAL",
                )
            )
            return
        self._backend_error(protocol.diagnostic(diagnostics(exc, text), codec))
        self.ignoring = True

    def _backend_error(self, message: bytes) -> None:
        """An ErrorResponse for the client; when the backend connection is gone with it (or
        the backend ends the session by it: FATAL), the session ends after it with no
        second one and no ReadyForQuery (`told_lost`), as PostgreSQL's would."""
        self.out(message)
        self._failed = True
        if protocol.ends_session(message):
            self.session.link.lose()
        if self.session.link.lost:
            self.told_lost = True

    def _fail_transaction(self) -> None:
        """The cache failed a statement inside a transaction block: as PostgreSQL, the block
        is failed until ROLLBACK. The backend's transaction is made to fail, so it (and the
        client, through ReadyForQuery) sees exactly PostgreSQL's states from here on."""
        if self.session.link.transaction_status() != pq.TransactionStatus.INTRANS:
            return
        pgconn = self._backend().pgconn
        if not self._piped:
            self._own_statement(pgconn, _FAIL_TRANSACTION)
            return
        pgconn.send_query_params(_FAIL_TRANSACTION, None)
        self._unnamed_owner = None
        self._discard_result(pgconn)

    def _ready(self) -> None:
        if self.told_lost:
            return  # (the session ends with the error it was sent)
        status = self.session.link.transaction_status()
        self._notifications()
        self._parameter_changes()
        if self._output_changed:
            self._read_output_settings(status)
        self._noticed.clear()
        started = self._started
        if started is not None and self.statement_stats is not None:
            self._started = None
            self.statement_stats.record(
                self.session.last_route, not self._failed, time.perf_counter() - started
            )
        if self.session.report_position:
            self._report_position()
        self.out(protocol.ready_for_query(_STATUS.get(status, b"I")))
        if status == pq.TransactionStatus.IDLE and not self._piped and not self._queue:
            self.session.link.release()  # (transaction pooling: between transactions)

    def _report_position(self) -> None:
        """ParameterStatus mtcache.position when the session's position moved (asked for
        with mtcache.report_position): what a client gives another cache server as
        mtcache.min_position."""
        value = self.session.setting("mtcache.position")
        if value != self.reported.get(_POSITION):
            self.reported[_POSITION] = value
            self.out(protocol.parameter_status(_POSITION, value))

    def _parameter_changes(self) -> None:
        """ParameterStatus for every reported setting the backend session changed (SET
        TimeZone, ...)."""
        conn = self.session.link.if_open()
        if conn is None:
            return
        pgconn = conn.pgconn
        reported, seen = self.reported, self._reported_bytes
        for name, value in list(reported.items()):
            key = name.encode()
            found = pgconn.parameter_status(key)  # (libpq's bytes: compared undecoded)
            if found is None or found == seen.get(key):
                continue
            seen[key] = found
            now = found.decode("ascii", "replace") if name == "client_encoding" else None
            if now is not None and values.codec_of(now, self._server_encoding) is None:
                # set by other means than SET (a function's set_config): set back
                back = b"SELECT set_config('client_encoding', $1, false)"
                self._own_statement(pgconn, back, [value.encode()])
                self._cache_notice(values.unconvertible(now))
                continue
            now = conn.info.parameter_status(name)
            if now is not None and now != value:
                self._client_has(name, now)
                self.out(protocol.parameter_status(name, now))

    @property
    def _server_encoding(self) -> str:
        return self.reported.get("server_encoding", "UTF8")

    def _check_encoding(self, text: str) -> None:
        """A SET of a client encoding the server cannot convert is refused before it reaches
        the backend (the session goes on in its encoding)."""
        found = _SETS_ENCODING.match(text)
        named = found.group(1) if found is not None else "DEFAULT"
        if named.upper() != "DEFAULT" and values.codec_of(named, self._server_encoding) is None:
            raise _Refusal("0A000", values.unconvertible(named))

    def _client_has(self, name: str, value: str) -> None:
        """The client was told this value of a reported setting."""
        self.reported[name] = value
        if name == "client_encoding":
            codec = values.codec_of(value, self._server_encoding)
            if codec is not None:
                self.settings = dataclasses.replace(self.settings, codec=codec)
        if name == "DateStyle":
            self.settings = dataclasses.replace(self.settings, date_style=value)

    def _read_output_settings(self, status: pq.TransactionStatus) -> None:
        """After a statement that may have set extra_float_digits or bytea_output (which
        ParameterStatus does not report): read them. A SET LOCAL ends with its transaction,
        so they are read again at its end."""
        conn = self.session.link.if_open()
        if conn is None or status == pq.TransactionStatus.INERROR:
            return
        found = self._own_statement(
            conn.pgconn,
            b"SELECT current_setting('extra_float_digits'), current_setting('bytea_output')",
        )
        if found is not None and found.status == ExecStatus.TUPLES_OK:
            digits, output = (found.get_value(0, i) or b"" for i in range(2))
            self.settings = dataclasses.replace(
                self.settings, extra_float_digits=int(digits), bytea_output=output.decode()
            )
        self._output_changed = status == pq.TransactionStatus.INTRANS

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
        self._answer_ready()

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
        """The client sent nothing more for now: what its pipeline queued for the backend
        goes there, so that the backend runs it as PostgreSQL would (its answers wait for
        the client's Sync or Flush, but for an error: `notify`)."""
        if self._piped and any(isinstance(item, _Expect) for item in self._queue):
            relay.flush(self._backend().pgconn)

    def _answer_ready(self) -> None:
        """The queued answers whose backend results are all here, in order, until one that
        is not (nothing waits)."""
        if not self._piped:
            return
        pgconn = self._backend().pgconn
        queue = self._queue
        while queue:
            item = queue[0]
            if isinstance(item, _Expect) and pgconn.is_busy():
                return
            queue.popleft()
            if isinstance(item, _Ready):
                if not self.ignoring:
                    self.out(item.data)
            elif self.ignoring:
                self._read_past(item)
            elif not item.read():
                self.ignoring = True

    def _read_past(self, item: _Expect) -> None:
        """A queued command's results read and dropped (an earlier one failed: the client
        gets nothing more until its Sync)."""
        out = self.out
        self.out = lambda _: None
        try:
            item.read()
        finally:
            self.out = out

    def _notice(self, diag: psycopg.errors.Diagnostic) -> None:
        """A NoticeResponse for a notice the backend sent, with all of its fields. An error
        it sent outside any statement (libpq passes it as a notice) ends the backend session
        (pg_terminate_backend of an idle one): it is the client's farewell (`farewell`)."""
        if diag.severity_nonlocalized in ("FATAL", "PANIC"):
            self.farewell = protocol.diagnostic(diag_fields(diag), self.settings.codec)
            return
        self._noticed.append(diag.message_primary or "")
        self.out(protocol.diagnostic(diag_fields(diag), self.settings.codec, notice=True))

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

    def _copy_in(self, conn: psycopg.Connection[t.Any], result: pq.abc.PGresult) -> None:
        """COPY FROM STDIN: the client's CopyData to the backend until CopyDone (or
        CopyFail); Flush and Sync are ignored meanwhile, as PostgreSQL does."""
        pgconn = conn.pgconn
        self.out(protocol.copy_response(b"G", bool(result.binary_tuples), _formats(result)))
        while True:
            message = self._next_message()
            if isinstance(message, protocol.CopyData):
                while pgconn.put_copy_data(message.data) == 0:
                    relay.wait_writable(pgconn)
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


_IDLE = pq.TransactionStatus.IDLE
_COPY = re.compile(r"\s*COPY\b", re.IGNORECASE)
# SET client_encoding / SET NAMES, and the encoding it names
_SETS_ENCODING = re.compile(
    r"\s*SET\s+(?:SESSION\s+|LOCAL\s+)?(?:client_encoding\s*(?:TO|=)|NAMES)\s*['\"]?([\w-]+)",
    re.IGNORECASE,
)
# reported settings no statement sets (`Conversation.resync`)
_READ_ONLY_REPORTED = frozenset(
    ("server_version", "server_encoding", "integer_datetimes", "in_hot_standby", "is_superuser")
)

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


class _Refusal(Exception):
    """The server refuses a message: an ErrorResponse with this SQLSTATE."""

    def __init__(self, sqlstate: str, text: str) -> None:
        super().__init__(text)
        self.sqlstate = sqlstate


_Described = Callable[[tuple[int, ...], list[Field] | None], None]


class _Unreadable(_Refusal):
    """A parameter value of a type the cache does not decode."""


def _simple_kind(routed: Route) -> str:
    """How a Query message runs a statement: with its neighbours at the backend ("backend"),
    with its neighbours as one cache DDL script ("ddl"), or alone by the cache ("engine")."""
    if isinstance(routed, Passthrough | Write):
        return "backend"
    return "ddl" if isinstance(routed, CacheDdl) else "engine"


def _effects(sql: str) -> tuple[bool, bool]:
    """Whether a statement may change a setting local answers are encoded by
    (`_OUTPUT_SETTINGS`), and whether it may LISTEN."""
    upper = sql.upper()
    return any(name in upper for name in _OUTPUT_SETTINGS), "LISTEN" in upper


def _encodes(result: Result) -> bool:
    """Whether the server encodes every column of an engine's result."""
    return values.encodable(c.type_oid or 0 for c in result.columns or ())


def _decoders(bind: protocol.Bind, types: t.Sequence[int]) -> list[values.Decoder | None]:
    """How each parameter of a Bind is read, by its type and format (None: a type the cache
    cannot read)."""
    return [values.decoder(oid, bind.param_format(i) == 1) for i, oid in enumerate(types)]


def _lane_answer(
    run: protocol.RunShape,
    decoders: t.Sequence[values.Decoder],
    converted: Converted,
    made: Lane,
    encoders: t.Sequence[values.Encoder],
    head: bytes,
) -> Callable[[bytes], bytes | None]:
    """How a lane answers a run of its shape (``data``: its bytes): the parameter values read
    (``decoders``, as `_engine_params` reads them), the engine's lane asked for the rows, and
    the bytes of the answer after ``head``; None when the lane does not hold or a value is
    not one it takes (the full path answers, or says why not). The usual point lookup, one
    parameter that is the lookup's key, is read with nothing in between (`Lane.key_rows`)."""
    if run.params == 1 and converted.order == (0,) and made.one_key:
        value_of, decode, key_type, key_rows = run.value, decoders[0], made.types[0], made.key_rows

        def one_key(data: bytes) -> bytes | None:
            value = value_of(data)
            if value is None:
                return None
            try:
                key = decode(value)
            except Exception:  # a value it cannot read: the full path says why
                return None
            if type(key) is not key_type:
                return None
            rows = key_rows(key)
            return None if rows is None else _rows_answer(head, encoders, rows)

        return one_key

    def any_run(data: bytes) -> bytes | None:
        found = run.values(data)
        if found is None:
            return None
        try:
            decoded = [None if v is None else d(v) for d, v in zip(decoders, found, strict=True)]
        except Exception:  # a value it cannot read: the full path says why
            return None
        rows = made.rows(converted.params(decoded))
        return None if rows is None else _rows_answer(head, encoders, rows)

    return any_run


def _rows_answer(
    head: bytes, encoders: t.Sequence[values.Encoder], rows: t.Sequence[t.Sequence[t.Any]]
) -> bytes:
    """A lane's answer: ``head``, the rows, SELECT n and ReadyForQuery (idle)."""
    if len(rows) == 1:  # (the usual point lookup's)
        return b"".join((head, protocol.data_row(rows[0], encoders), _ONE_SELECTED))
    return b"".join(
        (
            head,
            *(protocol.data_row(row, encoders) for row in rows),
            protocol.select_complete(len(rows)),
            _READY_IDLE,
        )
    )


def _bind_formats(bind: protocol.Bind) -> tuple[list[int] | None, int, list[int] | None]:
    """(parameter formats, the one result format libpq asks for, the client's per-column
    formats when they differ: those columns are converted)."""
    params = [bind.param_format(i) for i in range(len(bind.params))] or None
    formats = list(bind.result_formats)
    if len(set(formats)) > 1:
        return params, 0, formats
    return params, formats[0] if formats else 0, None


def _then(then: _Described, found: Description) -> bool:
    then(*found)
    return True


def _formats(result: pq.abc.PGresult) -> list[int]:
    return [result.fformat(i) for i in range(result.nfields)]


def _pooled_name(statement: Statement) -> bytes:
    """A named statement's name on pooled connections: its text's and parameter types'."""
    digest = hashlib.blake2b(statement.sql, digest_size=12)
    digest.update(b"".join(oid.to_bytes(4, "big") for oid in statement.param_types))
    return b"mtcache_" + digest.hexdigest().encode()


def _name(name: bytes) -> str:
    return name.decode(errors="replace")


def result_fields(result: Result, formats: list[int]) -> list[Field]:
    """A result's RowDescription: PostgreSQL's own description of the statement where the
    engine has it (table and column numbers included), else name and type."""
    described = result.described
    if described is not None:
        return relay.fields_of(described, formats)
    columns = result.columns or ()
    return [
        _field(c.name, c.type_oid or OID.text, c.type_modifier, f)
        for c, f in zip(columns, formats, strict=True)
    ]


def _field(name: str, oid: int, type_modifier: int, format: int) -> Field:
    """A RowDescription field of a column no table holds."""
    return Field(name.encode(), 0, 0, oid, _SIZES.get(oid, -1), type_modifier, format)


__all__ = ["Conversation"]
