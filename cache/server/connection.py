"""One client's socket, from its startup packet to its end: TLS and authentication, then the
client's bytes fed to its conversation (`cache.engine.conversation`) and the answers written
back. The event loop reads and parses what arrives and has the conversation answer at once
what needs no waiting (`AtOnce`); a worker thread of the server's pool takes the conversation
for the rest, one message after another, and writes to the socket itself (backpressure on
both paths). Cancels, timeouts and a client that goes away interrupt the statement running;
a session whose backend connection is lost ends, as PostgreSQL's would."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import ssl
import threading
import time
import typing as t
from collections import deque
from collections.abc import Callable

from cache.engine.conversation import Answered, AtOnce, Conversation, Relay
from cache.engine.conversation.opening import Conversations
from cache.engine.engine import Engine
from cache.engine.session import Session
from cache.server.auth import AUTH_SECONDS, LoginRefused, login_of, peer_address
from cache.server.counters import ServerCounter
from cache.server.limits import Admission, Limits
from cache.server.options import ServerOptions
from cache.server.output import write_all
from cache.server.running import Running
from cache.wire import protocol
from cache.wire.protocol import ProtocolViolation
from sql_ext.errors import Error, diagnostics

log = logging.getLogger("mtcache.server")

_SEND_BUFFER = 64 * 1024  # output collected before it is handed to the socket
_TLS_BUFFER = 256 * 1024  # output a TLS connection's transport holds before writers wait
_INBOX_LIMIT = 4096  # messages read ahead of a session's work before reading pauses
_LOST_BACKEND = (
    "08006",
    "the backend connection of this session was lost, and with it the "
    "session's prepared statements, settings, temporary tables and open "
    "transaction: connect again",
)


class Host(t.Protocol):
    """What a client connection uses of its server (`cache.server.server.Server`)."""

    engine: Engine
    options: ServerOptions
    admission: Admission
    conversations: Conversations
    loop: asyncio.AbstractEventLoop | None
    loop_thread: int | None
    # prepared runs taken whole (`ClientConnection._at_hand`), by the path that answered them
    counters: dict[ServerCounter, int]

    @property
    def stopping(self) -> bool: ...

    def run(self, job: Callable[[], None]) -> None: ...

    def opened(self, client: ClientConnection) -> None: ...

    def closed(self, client: ClientConnection) -> None: ...

    def register(self, client: ClientConnection, pid: int | None = None) -> tuple[int, bytes]: ...

    def unregister(self, key: tuple[int, bytes]) -> None: ...

    def cancel(self, pid: int, key: bytes) -> None: ...


class _Violation(t.NamedTuple):
    """A malformed message, answered in its turn (a FATAL ErrorResponse, the end)."""

    text: str


class ClientConnection(asyncio.Protocol):
    """One client socket: startup, then the conversation (see the module). The event loop
    reads, parses and answers what is at hand; a worker answers the rest (``working``: one
    has the conversation now, and takes the messages that arrive meanwhile)."""

    def __init__(self, server: Host) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.conversation: Conversation | None = None
        self.working = False  # a worker has the conversation (set and cleared by the loop)
        self.running = Running()  # the statement answered now
        self._key: tuple[int, bytes] | None = None
        self._reader = protocol.FrontendReader()
        self._started = False  # the startup packet came
        self._inbox: deque[protocol.Message | _Violation] = deque()
        self._arrived = threading.Condition()  # a message, or the end of input
        self._reading = True
        self._eof = False  # no more input: the session ends once its messages are answered
        self._lost = False  # the socket is gone
        self._ending = False  # the session ends (or has ended)
        self._ended = False
        self._out: list[bytes] = []
        self._out_size = 0
        self._paused = False  # the loop's output waits in the transport (the client is slow)
        self._deferred: tuple[Callable[[], bool] | None] | None = None  # work waiting for it
        self._watched: int | None = None  # the backend socket the loop watches (LISTEN)
        self._farewell = b""  # the last message of a session the server ends
        self._fd: int | None = None  # the client socket's descriptor the workers write to
        self._abandoned = False  # the server ends the session: a full socket is not waited on
        self.at_once: AtOnce | None = None  # the conversation's whole runs (`_at_hand`)
        self._passing: Relay | None = None  # a passed-through run the loop relays
        self.tls = False  # the connection is encrypted (then workers write through the loop)
        self._idle_since = time.monotonic()  # when the client last sent or got something
        self._admitted: str | None = None  # the role this session is counted as (`Admission`)
        self._handshake: asyncio.Task[None] | None = None  # TLS being set up
        self._early: list[bytes] = []  # what came through TLS before its transport did
        self._drained: list[threading.Event] = []  # workers waiting for the loop's output

    # -- the event loop's side -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = t.cast(asyncio.Transport, transport)
        # told of any output waiting (and of none left): a worker writes only after it
        self.transport.set_write_buffer_limits(high=0)
        self.server.opened(self)
        if self.server.stopping:
            self._write(
                protocol.error_response(
                    "57P03", "the cache server is shutting down", severity="FATAL"
                )
            )
            self._flush()
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._ending or self._eof:
            return
        self._idle_since = time.monotonic()
        if self._handshake is not None:  # (decrypted before `start_tls` hands its transport)
            self._early.append(data)
            return
        if self._at_hand(data):
            return
        reader = self._reader
        reader.feed(data)
        try:
            if not self._started and not self._startup():
                return
            arrived: list[protocol.Message | _Violation] = []
            while (message := reader.next_message()) is not None:
                arrived.append(message)
        except ProtocolViolation as exc:
            if not self._started:
                self._fatal_now("08P01", str(exc))
                return
            arrived.append(_Violation(str(exc)))
            self._ending_input()
        with self._arrived:
            self._inbox.extend(arrived)
            self._arrived.notify_all()
        if len(self._inbox) > _INBOX_LIMIT and self._reading and self.transport is not None:
            self.transport.pause_reading()
            self._reading = False
        if not self.working:
            self._pump()

    def _at_hand(self, data: bytes) -> bool:
        """A client's run of a prepared statement (the usual way to send one) taken whole
        when it came alone into a quiet session (`AtOnce.take`): answered, or sent to the
        backend with its answer relayed as it comes (`_relay`). False: nothing was done."""
        at_once = self.at_once
        if at_once is None or self.working or self._inbox or self._paused or self._reader.pending:
            return False
        try:
            taken = at_once.take(data)
        except Exception:
            self._failed()
            self._start_work(None)
            return True
        if taken is None:
            return False
        if isinstance(taken, bytes):  # (a lane's answer: the hit path)
            self._flush()
            self._send(taken)
            self.server.counters[ServerCounter.LANE] += 1
            return True
        if isinstance(taken, Answered):
            self._flush()
            self.server.counters[ServerCounter.AT_HAND] += 1
            return True
        self._relay(taken)
        return True

    def _relay(self, passing: Relay) -> None:
        """A passed-through run sent, its answer relayed as the backend's socket is readable
        (`_backend_readable`). The conversation is taken meanwhile, as by a worker
        (``working``)."""
        self.working = True
        self._passing = passing
        self._backend_writable()
        self.running.start()  # (a cancel before this finds nothing running, as before the send)
        if self._watched != passing.fd:
            self._watch_backend()
        self.server.counters[
            ServerCounter.RELAYED_RAW if passing.raw else ServerCounter.RELAYED
        ] += 1

    def _backend_writable(self) -> None:
        """What is not sent yet of a passed-through run, sent (waiting for the backend's
        socket when it is full)."""
        loop, passing = self.loop, self._passing
        assert loop is not None and passing is not None
        if passing.send_on():
            passing.waiting = True
            loop.add_writer(passing.fd, self._backend_writable)
        elif passing.waiting:
            passing.waiting = False
            loop.remove_writer(passing.fd)

    def _relayed(self, passing: Relay) -> None:
        """The backend's socket is readable under a passed-through run: what came, relayed."""
        try:
            over = passing.readable()
        except Exception:
            self._failed()
            over = True
        if not over:  # (its output goes out as it fills a buffer: `_write`)
            if self._paused:  # the client does not read: the backend waits
                self._unwatch_backend()
            return
        if passing.waiting and self.loop is not None:
            self.loop.remove_writer(passing.fd)
        self._passing = None
        conversation = self.conversation
        if conversation is not None and conversation.pooled:
            # its answer may have given the connection back to the pool (a COMMIT): the loop
            # stops watching it now, before another session's run can watch the same socket
            self._watch_backend()
        self._idle_since = time.monotonic()
        self._flush()
        self.running.stop()
        try:  # (once the client has its answer)
            passing.finish()
        except Exception:
            self._failed()
        if self._lost_backend():
            self._end_lost()
            self._start_work(None)  # (which ends the session)
            return
        at_once = self.at_once
        if at_once is not None and at_once.needs_resync:
            self._start_work(at_once.resync)
            return
        self.working = False
        if self._inbox or self._eof or self._ending or self._paused or not self._reading:
            self._pump()
        # (else nothing waits, and the backend's socket stays watched, as `_pump` would leave)

    def eof_received(self) -> bool:
        self._ending_input()
        if not self.working:
            self._pump()
        return not self.tls  # answers may still go out (TLS ends both ways at once)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        drained, self._drained = self._drained, []
        for event in drained:
            event.set()
        self._run_deferred()
        self._ending_input()
        if not self.working:
            self._pump()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        drained, self._drained = self._drained, []
        for event in drained:
            event.set()
        if self._passing is not None:
            self._watch_backend()
        elif self._deferred is not None:
            self._run_deferred()
        elif not self.working:
            self._pump()

    def _ending_input(self) -> None:
        """No more messages come: a statement running with none after it is cancelled (its
        client went away), as PostgreSQL's client_connection_check_interval does."""
        with self._arrived:
            self._eof = True
            self._arrived.notify_all()
            waiting = bool(self._inbox)
        if self.running.busy and not waiting:
            log.info("cancelling the statement of a client that went away")
            self.cancel()

    def _startup(self) -> bool:
        """Startup packets: True once the session's startup packet came (a worker opens the
        session)."""
        reader, transport = self._reader, self.transport
        assert transport is not None
        while (packet := reader.next_startup()) is not None:
            if isinstance(packet, protocol.SSLRequest | protocol.GSSENCRequest):
                if reader.pending:  # bytes sent before the answer: a man in the middle
                    raise ProtocolViolation("received unencrypted data after SSL request")
                context, loop = self.server.options.tls, self.loop
                if (
                    isinstance(packet, protocol.SSLRequest)
                    and context is not None
                    and loop is not None
                    and not self.tls
                ):
                    transport.write(b"S")
                    transport.pause_reading()  # (until TLS is up: `_start_tls`)
                    self._handshake = loop.create_task(self._start_tls(context))
                    return False
                transport.write(b"N")
                continue
            if isinstance(packet, protocol.CancelRequest):
                self._ending = True
                transport.close()
                self.server.run(functools.partial(self.server.cancel, packet.pid, packet.key))
                return False
            self._started = True
            self._start_work(functools.partial(self._open_session, packet))
            return True
        return False

    async def _start_tls(self, context: ssl.SSLContext) -> None:
        """TLS on the client's connection (after SSLRequest): the startup packet and all
        that follows come through it; the workers then write through the loop
        (`_send_through_loop`)."""
        transport = self.transport
        assert transport is not None and self.loop is not None
        try:
            secured = await self.loop.start_tls(
                transport, self, context, server_side=True, ssl_handshake_timeout=AUTH_SECONDS
            )
        except (TimeoutError, OSError) as exc:  # (ssl.SSLError and ConnectionError are OSErrors)
            log.info("a client's TLS handshake failed: %s", exc)
            self._ending = True
            transport.close()
            self.server.closed(self)
            return
        if secured is None or self._lost:
            self.server.closed(self)
            return
        self.transport = t.cast(asyncio.Transport, secured)
        # every write goes through this transport, in order: a worker waits only while much
        # waits in it (told by `pause_writing` / `resume_writing`)
        self.transport.set_write_buffer_limits(high=_TLS_BUFFER)
        self.tls = True
        self._handshake = None
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)

    def _pump(self) -> None:
        """Answer what is at hand, in order; hand the rest to a worker."""
        if self._ended or self.working:
            return
        if (
            not self._reading
            and len(self._inbox) < _INBOX_LIMIT // 2
            and not self._eof
            and self.transport is not None
        ):
            self.transport.resume_reading()
            self._reading = True
        at_once = self.at_once
        inbox = self._inbox
        if at_once is not None and not self._ending:
            try:
                while inbox and not self._paused:  # (a slow client: backpressure)
                    message = inbox[0]
                    if isinstance(message, _Violation) or not at_once.message(message):
                        break
                    inbox.popleft()
            except Exception:
                self._failed()
            self._flush()
        if inbox or (self._eof and self._started) or self._ending:
            self._start_work(None)
        elif self._eof and self.transport is not None:  # it never started a session
            self.transport.close()
            self.server.closed(self)
        elif at_once is not None:
            self._watch_backend()

    def _failed(self) -> None:
        """The loop failed answering the session (a bug, logged): what it wrote and what
        waits are dropped, and the session ends with an internal error, by a worker."""
        log.exception("session failed")
        self._out.clear()
        self._out_size = 0
        with self._arrived:
            self._inbox.clear()
            self._inbox.append(_Violation("internal error in the cache server (see its log)"))

    def _start_work(self, first: Callable[[], bool] | None) -> None:
        """Hand the conversation to a worker (``first``: its first job), once what the loop
        wrote has gone out: the worker writes to the socket itself, through a descriptor of
        its own (never one the loop closed and the system gave to another client)."""
        self.working = True
        self._unwatch_backend()
        transport = self.transport
        if (
            transport is not None
            and self._fd is None
            and not self.tls
            and not transport.is_closing()
        ):
            self._fd = os.dup(transport.get_extra_info("socket").fileno())
        self._deferred = (first,)
        if not self._paused or self._lost or self._abandoned:
            self._run_deferred()

    def _run_deferred(self) -> None:
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            self.server.run(functools.partial(self._work, deferred[0]))

    def _work_done(self) -> None:
        self.working = False
        self._idle_since = time.monotonic()
        if self._ended:
            if self.transport is not None:
                self.transport.close()
            self.server.closed(self)
            return
        self._flush()
        self._pump()

    def _watch_backend(self) -> None:
        """The loop watches the session's backend socket whenever the loop has the session
        (a worker does not watch it): the answers of runs the loop passes through; while the
        session is idle, notifications after a LISTEN (forwarded as they come) and the end
        of the backend session (the client's session then ends, as PostgreSQL ends it:
        `_lost_backend`)."""
        conversation = self.conversation
        fd = conversation.backend_socket() if conversation is not None else None
        if fd == self._watched:
            return
        self._unwatch_backend()
        if fd is not None and self.loop is not None:
            self.loop.add_reader(fd, self._backend_readable)
            self._watched = fd

    def _unwatch_backend(self) -> None:
        if self._watched is not None and self.loop is not None:
            self.loop.remove_reader(self._watched)
        self._watched = None

    def _backend_readable(self) -> None:
        passing = self._passing
        if passing is not None:
            self._relayed(passing)
        elif not self.working:  # (a notification, or the backend going away)
            self._start_work(self._notify)

    def stop_reading(self) -> None:
        """Shutdown: no more messages are read or answered once the running one is."""
        if self.transport is not None and self._reading:
            self.transport.pause_reading()
            self._reading = False
        with self._arrived:
            self._inbox.clear()

    def close(self, farewell: bytes = b"") -> None:
        """End the session with a last message, after what runs now (from the event loop)."""
        with self._arrived:
            self._inbox.clear()
            self._ending = True
            self._abandoned = True  # output the client does not read is given up
            self._arrived.notify_all()
        if self._started:
            self._farewell = farewell
        self._run_deferred()
        if not self.working:
            self._start_work(None)

    def _fatal_now(self, sqlstate: str, text: str) -> None:
        self._ending = True
        if self.transport is not None:
            self.transport.write(protocol.error_response(sqlstate, text, severity="FATAL"))
            self.transport.close()
        self.server.closed(self)

    def _send(self, data: bytes) -> None:
        """Into the transport (on the loop)."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    # -- a worker's side -----------------------------------------------------------------------

    def _work(self, first: Callable[[], bool] | None) -> None:
        """Answer the session's messages until none is waiting (a worker thread)."""
        try:
            if first is not None and not first():
                self._ending = True
            while not self._ending:
                if self._lost_backend():  # (by ``first`` or the last message)
                    self._end_lost()
                    break
                with self._arrived:
                    if not self._inbox:
                        if self._eof:
                            self._ending = True
                        break
                    message = self._inbox.popleft()
                if isinstance(message, _Violation):
                    raise ProtocolViolation(message.text)
                conversation = self.conversation
                assert conversation is not None
                self.running.start()
                conversation.cancel_reason = None
                if self._eof and not self._inbox:
                    # its client went away before it started: cancelled as if it had been
                    # running then (`_ending_input`)
                    self.cancel()
                try:
                    if not conversation.handle(message):
                        self._ending = True
                finally:
                    self.running.stop()
            if self._ending:
                self._flush()
            elif self.conversation is not None:
                self.conversation.pipeline_sent()
            # (else the loop sends the last of it once it has the conversation back,
            # `_work_done`: a client answered at once finds its next run taken at hand)
        except (ConnectionError, OSError):
            self._ending = True  # the client went away: its session ends
        except ProtocolViolation as exc:
            self._fatal("08P01", str(exc))
        except Exception:
            if self._lost_backend():
                self._end_lost()
            else:
                log.exception("session failed")
                self._fatal("XX000", "internal error in the cache server (see its log)")
        finally:
            if self._ending:
                self._end()
            with contextlib.suppress(RuntimeError):  # the loop has ended
                self._on_loop(self._work_done)

    def _lost_backend(self) -> bool:
        """Whether the session lost its backend connection: it then ends, as PostgreSQL ends
        a session whose backend is gone (its prepared statements, settings, temporary
        tables and transaction went with it: connecting again silently would run the
        client's next statements in another session)."""
        conversation = self.conversation
        return conversation is not None and conversation.lost

    def _on_loop(self, call: Callable[..., None], *args: t.Any) -> None:
        loop = self.loop
        assert loop is not None
        loop.call_soon_threadsafe(call, *args)

    def _notify(self) -> bool:
        """What the backend sent while the session was idle (LISTEN), to the client."""
        if self.conversation is not None:
            self.conversation.notify()
        return True

    def _open_session(self, startup: protocol.Startup) -> bool:
        server = self.server
        if server.stopping:
            self._fatal("57P03", "the cache server is shutting down")
            return False
        parameters = dict(startup.parameters)
        user = parameters.get("user")
        try:
            user, database = login_of(parameters, server.engine.backend)
            transport = self.transport
            credentials = server.options.login.check(
                self.tls,
                database,
                user,
                peer_address(transport.get_extra_info("peername") if transport else None),
                self._send_now,
                functools.partial(self._next_message, time.monotonic() + AUTH_SECONDS),
            )
            server.admission.admit(user)
            self._admitted = user
        except LoginRefused as exc:
            log.info("refused a login of role %r: %s", user, exc)
            self._fatal(exc.sqlstate, str(exc))
            return False
        try:
            opened = server.conversations.open(
                parameters, credentials, self._write, self._next_message
            )
        except Error as exc:
            self._write(protocol.diagnostic(diagnostics(exc), fatal=True))
            self._flush()
            return False
        reported = opened.reported
        self.conversation = conversation = opened.conversation
        self.session = conversation.session
        self.at_once = AtOnce(conversation)
        self._key = server.register(self, self.conversation.own_pid())
        self.conversation.told_pid = self._key[0]
        self.conversation.release_backend()  # (pooled: until a statement needs it)
        self._write(
            protocol.session_started(startup.version, list(parameters), reported.items(), self._key)
        )
        self._flush()
        return True

    def _send_now(self, data: bytes) -> None:
        self._write(data)
        self._flush()

    def _next_message(self, deadline: float | None = None) -> protocol.Message:
        """The client's next message, waiting for it (COPY FROM STDIN reads its data so;
        ``deadline``: a `time.monotonic` past which the session ends)."""
        self._flush()
        with self._arrived:
            while not self._inbox:
                if self._eof or self._ending:
                    raise ConnectionError("the client went away")
                if not self._reading:
                    self._on_loop(self._resume_reading)
                if deadline is None:
                    self._arrived.wait()
                elif (
                    not self._arrived.wait(max(0.0, deadline - time.monotonic()))
                    and time.monotonic() >= deadline
                ):
                    raise LoginRefused("08006", "canceling authentication due to timeout")
            message = self._inbox.popleft()
        if isinstance(message, _Violation):
            raise ProtocolViolation(message.text)
        return message

    def _resume_reading(self) -> None:
        if not self._reading and self.transport is not None and not self._ending:
            self.transport.resume_reading()
            self._reading = True

    # -- output (the loop's or a worker's, whichever has the conversation) ---------------------

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        self._out_size += len(data)
        if self._out_size >= _SEND_BUFFER:
            self._flush()

    def _flush(self) -> None:
        if not self._out:
            return
        out = self._out
        data = out[0] if len(out) == 1 else b"".join(out)  # (a hit's answer: one piece)
        out.clear()
        self._out_size = 0
        if threading.get_ident() == self.server.loop_thread:
            self._send(data)
        elif self.tls:
            self._send_through_loop(data)
        elif self._fd is None:
            raise ConnectionError("the client went away")
        else:
            write_all(self._fd, data, lambda: self._lost or self._abandoned)

    def _send_through_loop(self, data: bytes) -> None:
        """A worker's output on a TLS connection: written by the loop into the TLS
        transport, the worker waiting until it has gone out (backpressure)."""
        drained = threading.Event()

        def write() -> None:
            self._send(data)
            if self._paused and not self._lost:
                self._drained.append(drained)  # (set by `resume_writing`)
            else:
                drained.set()

        self._on_loop(write)
        while not drained.wait(1.0):
            if self._lost or self._abandoned:
                raise ConnectionError("the client went away")
        if self._lost:
            raise ConnectionError("the client went away")

    def _end_lost(self) -> None:
        """The session's backend connection was lost: it ends, with FATAL 08006 unless the
        client was already sent its statement's error (`Conversation.told_lost`)."""
        conversation = self.conversation
        if conversation is not None and conversation.told_lost:
            self._ending = True
            with contextlib.suppress(OSError):
                self._flush()
            return
        farewell = conversation.farewell if conversation is not None else None
        if farewell is not None:  # (the backend's own, as PostgreSQL ends an idle session)
            self._ending = True
            with contextlib.suppress(OSError):
                self._flush()
                self._write(farewell)
                self._flush()
            return
        self._fatal(*_LOST_BACKEND)

    def _fatal(self, sqlstate: str, text: str) -> None:
        self._ending = True
        with contextlib.suppress(OSError):
            self._flush()
            self._write(protocol.error_response(sqlstate, text, severity="FATAL"))
            self._flush()

    # -- from other threads ----------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether a statement of the session runs now."""
        return self.running.busy

    def cancel(self) -> None:
        """Cancel the statement running now (none: nothing happens, as PostgreSQL ignores a
        cancel that arrives between statements)."""
        session = self.session
        if session is not None:
            self.running.cancel(session, lambda: self._eof)

    def check_time(self, now: float, limits: Limits) -> None:
        """A statement past the statement timeout is interrupted; a session idle inside a
        transaction past the idle timeout is ended (from the event loop's tick)."""
        timeout = limits.statement_timeout
        if timeout is not None and self.running.past(now, timeout):
            self._time_out()
        idle = limits.idle_in_transaction_timeout
        session = self.session
        if (
            idle is None
            or session is None
            or self.working
            or self.running.busy
            or self._ending
            or now - self._idle_since <= idle
        ):
            return
        if self.conversation is not None and self.conversation.in_transaction():
            log.info("ending a session idle in a transaction for over %gs", idle)
            self.close(
                protocol.error_response(
                    "25P03",
                    "terminating connection due to idle-in-transaction timeout",
                    severity="FATAL",
                )
            )

    def _time_out(self) -> None:
        """Interrupt the cache's own work of the statement running now, which then fails as
        PostgreSQL's statement timeout does (the backend times its own part out)."""
        session, conversation = self.session, self.conversation
        if session is None or conversation is None or not self.running.busy:
            return
        conversation.cancel_reason = "statement timeout"
        self.running.time_out(session)

    def _end(self) -> None:
        """The session's end (on its worker)."""
        if self._ended:
            return
        if self._farewell:
            with contextlib.suppress(OSError):
                self._write(self._farewell)
                self._flush()
        self._ended = True
        self._ending = True
        if self._admitted is not None:
            self.server.admission.release(self._admitted)
            self._admitted = None
        if self._key is not None:
            self.server.unregister(self._key)
        if self.session is not None:
            with contextlib.suppress(Exception):
                self.session.close()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


__all__ = ["ClientConnection", "Host"]
