"""Runs of plain passed-through statements relayed byte for byte: the client's Bind, Execute
and Sync sent to the backend as they came (the Bind renamed to the backend's statement), and
the backend's answer given back as it comes, with no libpq between, so the event loop only
moves bytes, as a pooler does. What libpq keeps of the backend session (its reported settings
and transaction status) and such an answer changed unseen is made true again afterwards by a
worker (`RawRuns.resync`)."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import typing as t
from dataclasses import dataclass

from psycopg import pq
from psycopg.pq import ExecStatus

from cache.engine.conversation.conversation import Conversation
from cache.engine.conversation.statements import Statement
from cache.engine.route import Passthrough, Write
from cache.wire import protocol

log = logging.getLogger("mtcache.server")

_READ = 256 * 1024  # bytes of an answer read from the backend's socket at a time
# reported settings no statement sets (`RawRuns.resync`)
_READ_ONLY_REPORTED = frozenset(
    ("server_version", "server_encoding", "integer_datetimes", "in_hot_standby", "is_superuser")
)


@dataclass(slots=True)
class RawRun:
    """A run of a plain statement passed through byte for byte (`RawRuns.run`): what the
    backend is sent, and its answer read as it comes. The event loop sends it while the
    backend's socket takes it (`send_on`), reads the answer when the socket is readable
    (`readable`) and ends it once the client has the answer (`finish`)."""

    owner: RawRuns
    statement: Statement
    send: bytes  # what is still to be written to the backend
    fd: int  # the backend connection's socket
    scan: protocol.AnswerScan = dataclasses.field(default_factory=protocol.AnswerScan)
    waiting: bool = False  # the loop waits for the backend's socket to take the rest of send
    lost: bool = False  # the backend connection ended under it (`RawRuns.lost`)
    started: float = 0.0  # `time.perf_counter` when it was sent (with statement stats)

    raw: t.ClassVar[bool] = True

    def send_on(self) -> bool:
        """Send more of the run; True while some is left (the caller waits for the backend's
        socket to take it)."""
        try:
            self.send = self.send[os.write(self.fd, self.send) :]
        except BlockingIOError:
            pass
        except OSError:
            self.send = b""  # (the failure is read with the answer)
        return bool(self.send)

    def readable(self) -> bool:
        """What the backend's socket holds of the answer, to the client; True when the answer
        is over (or the connection was lost under it)."""
        owner = self.owner
        try:
            data = os.read(self.fd, _READ)
        except BlockingIOError:
            return False
        except OSError as exc:
            owner.lost(self, exc.strerror or str(exc))
            return True
        if not data:
            owner.lost(self, "it closed")
            return True
        whole = owner.received(self, data)
        if whole:
            owner.conversation.out(whole)
        return whole is None or self.scan.done

    def finish(self) -> None:
        """The answer is over and the client has it (`RawRuns.over`)."""
        self.owner.over(self)


class RawRuns:
    """A conversation's raw runs, and what they left libpq not knowing (see the module)."""

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation
        # what a raw answer changed that libpq did not see (`received`, `resync`): reported
        # settings by name, and whether its transaction status moved
        self._unsynced: dict[str, str] = {}
        self._status_unsynced = False
        self.clock_unsynced = False  # a write's commit time waits for the backend's clock
        self._fd = -1  # the backend socket of the raw lanes (`lane`)

    def run(self, data: bytes, bind: protocol.Bind, describe: bool) -> RawRun | None:
        """A run of a passed-through plain read or write (``data``, as `protocol.execution`
        recognized it) to be sent to the backend as the client sent it, its Bind naming the
        backend's statement. Only where libpq's view of the backend session stays true:
        outside a transaction block, with nothing of the session's under way or asynchronous
        (LISTEN), over a connection without TLS or GSSAPI; what such a run may still change
        unseen (a function calling set_config) is settled after it (`resync`). The statement
        keeps the run's shape: its next runs are recognized by their bytes (`lane`). None:
        nothing was done."""
        conversation = self.conversation
        statement = conversation.statements.get(bind.statement)
        if statement is None or not statement.raw:
            return None
        session = conversation.session
        link = session.link
        if (link.pooled and link.pinned is None) or session.report_position:
            return None  # (its connection may be another session's by its next run)
        conn = link.if_open()
        if (
            conn is None
            or not conversation.pipeline.holds(statement)
            or conversation.portals
            or not conversation.pipeline.quiet
            or conversation.state.ignoring
            or conversation.listening
            or self.needs_resync
            or session.provenance_notices
            or not conversation.idle()
        ):
            return None
        pgconn = conn.pgconn
        if pgconn.ssl_in_use or pgconn.used_gssapi:
            return None
        shape = protocol.run_shape(bind, describe)
        head = shape.renaming(statement.backend_name or b"")
        if not bind.portal:
            statement.raw_shape, statement.raw_head = shape, head
            statement.raw_handled = conversation.handled
            self._fd = pgconn.socket
        conversation.epoch += 1  # (as in `Conversation.handle`)
        return RawRun(
            self,
            statement,
            shape.rebound(data, head),
            pgconn.socket,
            started=time.perf_counter() if conversation.statement_stats else 0.0,
        )

    def lane(self, statement: Statement, data: bytes) -> RawRun | None:
        """`run` of a run that differs from the last of ``statement`` passed through raw only
        in its parameter values (compared as bytes, not parsed: `protocol.RunShape`) when the
        conversation has done nothing since but such runs and reads at hand (``handled``):
        nothing the conversation would have checked can have changed. None: nothing was
        done."""
        conversation = self.conversation
        shape = statement.raw_shape
        if statement.raw_handled != conversation.handled or shape is None or not shape.fits(data):
            return None
        conversation.epoch += 1  # (as in `Conversation.handle`)
        return RawRun(
            self,
            statement,
            shape.rebound(data, statement.raw_head),
            self._fd,
            started=time.perf_counter() if conversation.statement_stats else 0.0,
        )

    def received(self, run: RawRun, data: bytes) -> bytes | None:
        """The whole messages of what the backend sent of a raw run, for the client;
        ``run.scan.done`` when its answer is over (then `over`). None: the backend broke the
        protocol (the run is lost: `lost`)."""
        try:
            return run.scan.feed(data)
        except protocol.BackendViolation as exc:
            self.lost(run, str(exc))
            return None

    def over(self, run: RawRun) -> None:
        """The session's bookkeeping of a raw run whose answer is over, done once the client
        has the answer (its own next statement waits for it, but not its reading of this
        one); `resync` is then due if ``needs_resync``."""
        conversation = self.conversation
        scan = run.scan
        if conversation.statement_stats is not None:
            conversation.statement_stats.record(
                "remote", not scan.failed and not run.lost, time.perf_counter() - run.started
            )
        if scan.fatal:  # (the backend ended the session: the client has its error)
            conversation.state.fatal()
        if run.lost:
            return
        if not scan.failed:  # (`Conversation.forwarded`, its effects known to be none)
            route = t.cast(Passthrough | Write, run.statement.route)
            if not conversation.session.forwarded_at_hand(route):
                self.clock_unsynced = True  # (`resync` settles it)
        if scan.reported or scan.status != b"I" or self.clock_unsynced:
            conversation.handled += 1  # (a worker must settle what the loop could not)
            client = conversation.client
            codec = client.codec
            for name, value in scan.reported:  # (the client has them: they were answered)
                key, text = name.decode(codec, "replace"), value.decode(codec, "replace")
                client.client_has(key, text)
                self._unsynced[key] = text
                client.reported_bytes[name] = value  # (as libpq will hold it: `resync`)
            self._status_unsynced = scan.status != b"I"

    def lost(self, run: RawRun, why: str) -> None:
        """The backend connection ended (or sent what is not the protocol) under a raw run:
        the connection is given up (`BackendLink.lose`: the server then ends the session,
        as PostgreSQL ends it); the client has what came whole before."""
        run.lost = True
        self.conversation.handled += 1
        self.conversation.session.link.lose()
        log.warning("a session's backend connection was lost under a statement: %s", why)

    @property
    def needs_resync(self) -> bool:
        return bool(self._unsynced) or self._status_unsynced or self.clock_unsynced

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
        conversation = self.conversation
        pipeline = conversation.pipeline
        unsynced, self._unsynced = self._unsynced, {}
        status_moved, self._status_unsynced = self._status_unsynced, False
        conn = conversation.session.link.if_open()
        pgconn = conn.pgconn if conn is not None else None
        if status_moved and pgconn is not None:
            pipeline.own_statement(pgconn, b"")
        if self.clock_unsynced:
            self.clock_unsynced = False
            conversation.session.caught_up()
        if pgconn is None:
            return True
        names = [
            n
            for n in unsynced
            if n not in _READ_ONLY_REPORTED and pgconn.parameter_status(n.encode()) is not None
        ]
        if not names or pgconn.transaction_status != pq.TransactionStatus.IDLE:
            return True
        sets = b"SELECT " + b", ".join(
            b"set_config($%d, $%d, false)" % (2 * i + 1, 2 * i + 2) for i in range(len(names))
        )
        before = [pgconn.parameter_status(n.encode()) for n in names]
        codec = conversation.client.codec
        for values_ in (before, [unsynced[n].encode(codec) for n in names]):
            params = [p for n, v in zip(names, values_, strict=True) for p in (n.encode(), v)]
            result = pipeline.own_statement(pgconn, sets, params)
            if result is None or result.status != ExecStatus.TUPLES_OK:
                log.warning(
                    "the server could not bring libpq's copy of %s up to date: %s",
                    ", ".join(names),
                    result and result.error_message,
                )
                break
        return True


__all__ = ["RawRun", "RawRuns"]
