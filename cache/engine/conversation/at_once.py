"""A client's run of a prepared statement (Bind, Execute, Sync: the usual way to send one),
taken whole by the event loop when it came alone into a quiet session: `AtOnce.take` answers
it (a lane's answer handed back as bytes for the loop to send as they are: the hit path has
no writer in between), or sends it to the backend and hands the loop the relay of its
answer, or leaves it (None) to be answered message by message. The ways, cheapest first:

1. a raw lane: a run of a plain passed-through statement that differs from its last only in
   its values goes to the backend as bytes (`raw.RawRuns.lane`);
2. a lane: a cached read whose last run left one answered from what the engine kept
   (`cache.engine.lane`), checking only what could have changed;
3. a cached read answered at hand (`AtOnce.at_hand`), which may leave a lane;
4. a plain passed-through statement's run sent raw (`raw.RawRuns.run`);
5. another passed-through statement's run sent through libpq (`Passing`).

Messages that came apart are answered one by one by `AtOnce.message` when that needs no
waiting, else by a worker (`Conversation.handle`).
"""

from __future__ import annotations

import enum
import time
import typing as t
from dataclasses import dataclass

import psycopg
from psycopg import pq

from cache.engine.conversation.conversation import Conversation
from cache.engine.conversation.pipeline import Relaying
from cache.engine.conversation.raw import RawRun, RawRuns
from cache.engine.conversation.statements import (
    Portal,
    Refusal,
    Statement,
    SuspendedRead,
    bind_formats,
    decoders,
    encodes,
)
from cache.engine.conversation.statistics import FOLD
from cache.engine.lane import Lane, WireLane, wire_answer
from cache.engine.link import relay
from cache.engine.read import Suspended, at_hand
from cache.engine.result import Result
from cache.engine.route import CachedRead
from cache.wire import protocol, values
from sql_ext.errors import Error


class Answered(enum.Enum):
    """A run `AtOnce.take` answered otherwise than by a lane: its answer was written."""

    AT_HAND = "at hand"  # by a cached read answered at hand


@dataclass
class Passing:
    """A run of a passed-through statement sent through libpq by the event loop: its
    answer relayed as it comes (`readable`)."""

    owner: AtOnce
    portal: Portal
    relaying: Relaying
    fd: int  # the backend connection's socket (libpq's, which it drops if the connection ends)
    waiting: bool = False  # the loop waits for the backend's socket to take the rest

    raw: t.ClassVar[bool] = False

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

    def readable(self) -> bool:
        """Relay what the backend has sent (its socket is readable); True when the run is
        over and answered, ReadyForQuery included (or the connection failed under it: its
        error, then the Sync's answer)."""
        return self.owner.relay_ready(self)

    def finish(self) -> None:
        """The client has the answer (nothing is left to do)."""


Relay = RawRun | Passing
# bytes: a lane's whole answer, for the caller to send after what it has written
Taken = bytes | Answered | Relay | None


class AtOnce:
    """The event loop's whole runs of one conversation (see the module)."""

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self.raw = RawRuns(conversation)
        self._hot: Statement | None = None  # the statement of the last raw lane's run

    def take(self, data: bytes) -> Taken:
        """Answer or send a run (``data``: all the client sent, whatever it is); None:
        nothing was done."""
        raw_runs = self.raw
        hot = self._hot  # (the statement of the last raw run: most often the next one's)
        raw = raw_runs.lane(hot, data) if hot is not None else None
        statement = self._bound_statement(data) if raw is None else None
        if statement is not None and statement.raw_shape is not None:
            raw = raw_runs.lane(statement, data)
        if raw is not None:
            self._hot = raw.statement
            return raw
        answer = self.lane(statement, data) if statement is not None else None
        if answer is not None:
            return answer
        run = protocol.execution(data)
        if run is None:
            return None
        if self.at_hand(*run):
            return Answered.AT_HAND
        return raw_runs.run(data, *run) or self.at_backend(*run)

    def _bound_statement(self, data: bytes) -> Statement | None:
        """The prepared statement ``data`` binds to the unnamed portal, if it starts with such
        a Bind (the runs of lanes are read no further)."""
        if data[5:6] != b"\0" or data[:1] != b"B":
            return None
        return self.conversation.statements.get(data[6 : data.find(b"\0", 6)])

    @property
    def needs_resync(self) -> bool:
        return self.raw.needs_resync

    def resync(self) -> bool:
        return self.raw.resync()

    # -- cached reads ----------------------------------------------------------------------------

    def message(self, message: protocol.Message) -> bool:
        """Answer one message now if that needs no waiting: no backend, no DuckDB statement,
        no planning (the event loop answers cached point lookups of prepared statements
        sent message by message so). False: nothing was done; `Conversation.handle` it where
        waiting is allowed."""
        conversation = self.conversation
        if not conversation.idle():
            return False
        link = conversation.session.link
        if isinstance(message, protocol.Sync) and link.pooled and link.if_open() is not None:
            return False  # (a worker gives the connection back: that may ask the backend)
        if isinstance(message, protocol.Sync | protocol.Flush | protocol.Bind):
            return conversation.handle(message)
        if not isinstance(message, protocol.Describe | protocol.Execute | protocol.Close):
            return False
        if conversation.state.ignoring:
            return conversation.handle(message)  # dropped until Sync
        if isinstance(message, protocol.Execute):
            return self._execute(message)
        if message.kind == b"S":
            statement = conversation.statements.get(message.name)
        else:
            portal = conversation.portals.get(message.name)
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
        return conversation.handle(message)

    def _execute(self, message: protocol.Execute) -> bool:
        """`message` of an Execute."""
        conversation = self.conversation
        portal = conversation.portals.get(message.portal)
        if portal is None or portal.rows is not None or message.max_rows > 0:
            return False
        suspended = conversation.suspended
        if suspended is not None and suspended.of(portal):
            return False  # (begun at hand already: a worker drives it on)
        conversation.statement_starts()
        found = self._answer(portal)
        if found is None:
            return False
        conversation.state.receive(message)
        conversation.pipeline.drain()
        try:
            conversation.answers.execute(portal, found[0], 0)
        except Refusal as exc:  # (past --max-result-bytes: as `handle` refuses it)
            conversation.error(exc)
        return True

    def _answer(self, portal: Portal, lane: bool = False) -> tuple[Result, Lane | None] | None:
        """The answer of a bound cached read of a described statement from what the cache
        holds in memory (`Session.read` as far as it goes without waiting), and with ``lane``
        the lane it leaves; None: nothing was done."""
        conversation = self.conversation
        statement = portal.statement
        routed, described = statement.route, statement.described
        # (columns the server cannot encode: known before the engine counts an answer)
        if (
            not isinstance(routed, CachedRead)
            or described is None
            or described[1] is None
            or not statement.encodable
            or not conversation.client.settings.supported
        ):
            return None
        if len(portal.bind.result_formats) not in (0, 1, len(described[1])):
            return None  # (refused where errors are made)
        try:
            params = conversation.engine_params(portal)
            reading = at_hand(conversation.session.read(routed.query, params, lane=lane))
        except (Refusal, Error):
            return None  # (nothing was done: an error is made where it is handled)
        if isinstance(reading, Suspended):
            # (nothing that counts was done: the worker that answers the run drives it on)
            conversation.suspended = SuspendedRead(statement, portal.bind, reading)
            return None
        if reading.result is None:
            return None  # (the backend answers it: the full path sends it there)
        result = reading.result
        return (result, reading.lane) if encodes(result) else None

    def at_hand(self, bind: protocol.Bind, describe: bool) -> bool:
        """A whole run of a prepared statement (Bind, Describe of its portal or not, Execute,
        Sync) answered at once if it is a cached read whose answer is at hand: the bytes its
        messages get one by one (`message`), with none of their turns. False:
        nothing was done."""
        conversation = self.conversation
        if (
            conversation.portals
            or not conversation.pipeline.quiet
            or conversation.state.ignoring
            or not conversation.idle()
        ):
            return False
        statement = conversation.statements.get(bind.statement)
        if statement is None or not isinstance(statement.route, CachedRead):
            return False
        conversation.statement_starts()
        portal = Portal(statement, bind)
        lane = statement.lane
        run = protocol.run_shape(bind, describe)
        epoch = conversation.epoch
        stale = lane is None or lane.epoch != epoch or lane.run != run
        # a lane is made at the second such run of an epoch (a session that writes between
        # its reads does not pay for lanes it would not use), for the unnamed portal
        found = self._answer(
            portal,
            lane=stale
            and statement.answered_at == epoch
            and not bind.portal
            and not conversation.listening,
        )
        if found is None:
            return False
        result, made = found
        conversation.state.extended()
        head = portal.bound(describe)
        conversation.out(head)
        try:
            conversation.answers.execute(portal, result, 0)
        except Refusal as exc:  # (past --max-result-bytes: then the Sync's answer)
            conversation.error(exc)
            conversation.ready()
            return True
        conversation.ready()  # (the portal ends with the Sync: it was never kept)
        if stale:
            if made is not None:
                statement.lane = self._lane(portal, run, head, result, made)
            statement.answered_at = epoch
        return True

    def lane(self, statement: Statement, data: bytes) -> bytes | None:
        """The answer to a run of a prepared statement (as `at_hand` takes them;
        ``statement``: the one it binds, `_bound_statement`) by the lane its last
        run made, when ``data`` differs from that run only in its parameter values and the
        session did nothing but read at hand since (``epoch``): the same bytes as
        `at_hand`'s, with only what could have changed checked (`cache.engine.lane`). None:
        nothing was done."""
        # (the backend's transaction status is not asked: it changes only by a statement,
        # which ends the lanes; a named portal is not a lane's)
        lane = statement.lane
        conversation = self.conversation
        if (
            lane is None
            or lane.epoch != conversation.epoch
            or conversation.portals
            or not conversation.pipeline.quiet
            or conversation.state.ignoring
            or conversation.client.output_changed
        ):
            return None
        stats = conversation.statement_stats
        started = time.perf_counter() if stats is not None else 0.0
        answer = lane.answer(data)
        if answer is None:  # (it no longer holds, or not for this run: the full path answers,
            statement.lane = None  # and makes it again, `at_hand`)
        elif stats is not None:  # (the hit path: no call, no lock; `StatementStats.fold_hits`)
            hits = stats.hits
            hits.append(time.perf_counter() - started)
            if len(hits) >= FOLD:
                stats.fold_hits()
        return answer

    def _lane(
        self, portal: Portal, run: protocol.RunShape, head: bytes, result: Result, made: Lane
    ) -> WireLane | None:
        """The wire's side of the lane the engine made for a run `at_hand` just answered
        (``head``: its BindComplete and RowDescription), if it can have one."""
        rows = result.rows
        if result.notices or rows is None or result.status != f"SELECT {len(rows)}":
            return None
        conversation = self.conversation
        bind = portal.bind
        readers = decoders(bind, conversation.param_types(portal))
        if None in readers:
            return None
        formats = relay.result_formats(bind.result_formats, len(result.columns or ()))
        return WireLane(
            conversation.epoch,
            run,
            wire_answer(
                run,
                t.cast(list[values.Decoder], readers),
                portal.statement.converted,
                made,
                conversation.answers.encoders(result, formats),
                head,
            ),
        )

    # -- passed through by libpq -----------------------------------------------------------------

    def at_backend(self, bind: protocol.Bind, describe: bool) -> Passing | None:
        """Send a whole run of a passed-through prepared statement to the backend without
        waiting for its answer, which `relay_ready` relays as it comes: the event loop passes
        statements through so, with no hand-off to a worker. None: nothing was done (the
        run is answered message by message)."""
        conversation = self.conversation
        session = conversation.session
        if (
            (bind.portal and bind.portal in conversation.portals)
            or not conversation.pipeline.quiet
            or conversation.state.ignoring
            or conversation.client.output_changed
            or session.report_position
        ):
            return None
        statement = conversation.statements.get(bind.statement)
        if (
            statement is None
            or not statement.passthrough
            or not statement.relayed_as_is
            or statement.copies
            or (describe and statement.described is None)
        ):
            return None
        conn = session.link.if_open()
        if conn is None or not conversation.pipeline.holds(statement):
            return None  # (the connection is opened, or the statement parsed, by a worker)
        param_formats, result_format, mixed = bind_formats(bind)
        if mixed is not None:
            return None
        conversation.epoch += 1  # (as in `Conversation.handle`)
        conversation.handled += 1
        conversation.statement_starts()
        conversation.state.extended()
        session.last_route = "remote"
        portal = Portal(statement, bind)
        bound = portal.bound(describe)
        pgconn = conn.pgconn
        pgconn.send_query_prepared(
            statement.backend_name or b"", list(bind.params), param_formats, result_format
        )
        pgconn.set_chunked_rows_mode(relay.CHUNK_ROWS)
        conversation.out(bound)
        return Passing(self, portal, Relaying(conn, conversation.out, False, None), pgconn.socket)

    def relay_ready(self, passing: Passing) -> bool:
        """`Passing.readable`."""
        conversation = self.conversation
        pgconn = passing.pgconn
        try:
            pgconn.consume_input()
            while not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    self._relay_over(passing)
                    return True
                conversation.pipeline.relay_result(passing.relaying, result)
        except psycopg.Error as exc:
            # the backend connection failed under the run: its error, then the Sync's answer
            conversation.error(exc)
            conversation.sync()
            return True
        return False

    def _relay_over(self, passing: Passing) -> None:
        """A run relayed whole: what its Execute and Sync do after the backend's answer
        (on the event loop: what needs the backend's clock measured is left to `resync`)."""
        conversation = self.conversation
        portal = passing.portal
        statement = portal.statement
        if passing.relaying.ok and not conversation.passed(statement, statement.route):
            self.raw.clock_unsynced = True
        if not conversation.session.settle_at_hand():  # (as when a pipeline ends)
            self.raw.clock_unsynced = True
        conversation.portals[portal.bind.portal] = portal  # (the Sync ends it with its block)
        conversation.sync()


__all__ = ["Answered", "AtOnce", "Passing", "Relay", "Taken"]
