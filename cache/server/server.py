"""`mtcache serve`: the cache as a server that speaks PostgreSQL's protocol to every client.

One `Server` owns one engine (`cache.engine.Engine`: the cache file, its scheduler, stream
consumer and heartbeat) and a listening socket. An event loop (asyncio on uvloop) owns every
client socket: it reads and parses their messages and answers on the spot what needs no
waiting - the cached point lookups of prepared statements, from the result memo or a lookup
index (`Conversation.at_hand`). Everything else a session asks (planning, DuckDB statements,
the backend) is answered by a worker thread of a pool, one message after another, the
session's messages kept in order; a session holds a thread only while it has work, so idle
sessions are cheap, a slow remote statement never holds up another session, and statements of
different sessions run in parallel wherever DuckDB and the backend allow
(docs/decisions/the-server-loop-and-workers.md).
A worker writes to the client's socket itself, once what the loop wrote has gone out, and
waits while the client does not read; the loop answers nothing more while its own output
waits (backpressure on both paths).

Startup: SSLRequest is answered "S" and TLS set up on the connection when the server has a
certificate (`ServerOptions.tls`; the workers then write through the loop, which owns the TLS
transport), else "N", as is GSSENCRequest; the client then authenticates as its rules say
(`cache.server.auth`: loopback clients trusted by default, SCRAM or a password over TLS), and
its backend connection logs in as that role. ParameterStatus reports the backend's
settings as the backend reports them to a session with the client's parameters; BackendKeyData
gives the key a CancelRequest presents, which cancels the session's running statement, local
or remote (the DuckDB interrupt repeated while that statement runs); a client that goes away
while its statement runs has it cancelled. SIGTERM/SIGINT: stop accepting, let running
statements finish for a grace period, cancel what still runs, close the sessions and the
cache file.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import os
import secrets
import select
import signal
import socket
import ssl
import threading
import time
import typing as t
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import uvloop

from cache.backend.reflect import database_of, redact
from cache.backend.session_pool import DEFAULT_TIMEOUT as POOL_TIMEOUT
from cache.backend.session_pool import SessionPool
from cache.engine.admin import Admin
from cache.engine.conversation import Answered, AtOnce, Conversation, Relay
from cache.engine.conversation.reported import Describer, backend_defaults, reported_to
from cache.engine.conversation.statistics import StatementStats
from cache.engine.engine import Engine, SessionOptions
from cache.engine.session import Session
from cache.engine.stats import Sample
from cache.server.auth import AUTH_SECONDS, LOOPBACK_TRUST, Login, LoginRefused, Rules
from cache.server.limits import TICK_SECONDS, Admission, Limits
from cache.server.metrics import MetricsEndpoint, server_samples
from cache.wire import protocol, values
from cache.wire.protocol import ProtocolViolation
from sql_ext.errors import Error, ProgrammingError, diagnostics

log = logging.getLogger("mtcache.server")

DEFAULT_LISTEN = "127.0.0.1:6432"
# Linux's PID_MAX_LIMIT: no process has a pid past it; a session told none of its own gets one
# from here (to the protocol's last) as its pid
PID_MAX_LIMIT = 1 << 22
_LAST_PID = (1 << 31) - 1
GRACE_SECONDS = 10.0
_SEND_BUFFER = 64 * 1024  # output collected before it is handed to the socket
_TLS_BUFFER = 256 * 1024  # output a TLS connection's transport holds before writers wait
_INBOX_LIMIT = 4096  # messages read ahead of a session's work before reading pauses
_LOST_BACKEND = (
    "08006",
    "the backend connection of this session was lost, and with it the "
    "session's prepared statements, settings, temporary tables and open "
    "transaction: connect again",
)
CANCEL_SECONDS = 30.0  # how long a cancel keeps interrupting its statement's DuckDB work
CANCEL_REPEAT = 0.01
BACKEND_CANCEL_REPEAT = 0.2  # a gone client's statement: how often its backend part is cancelled
WORKERS = 1024  # threads answering sessions' work at once, at most (made when needed)
WORKER_STACK = 512 * 1024  # a worker thread's stack


def parse_listen(text: str, option: str = "--listen") -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) of ``--listen`` (or ``option``)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536 or not host:
        raise ProgrammingError(f"{option} {text!r}: write HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerOptions:
    listen: str = DEFAULT_LISTEN
    grace_seconds: float = GRACE_SECONDS
    currency_bound: float | None = None  # every session's default bound (None: strict)
    login: Login = field(default_factory=Login)  # who may connect, and how they prove it
    limits: Limits = field(default_factory=Limits)  # sessions at once, statements' time
    metrics: str | None = None  # HOST:PORT of the Prometheus endpoint (`cache.server.metrics`)
    tls: ssl.SSLContext | None = None  # TLS offered to clients (SSLRequest answered "S")
    # transaction pooling: backend connections per role shared by the sessions (0: each
    # session has its own, as PostgreSQL's), and how long a statement waits for one
    pool_size: int = 0
    pool_timeout: float = POOL_TIMEOUT
    max_result_bytes: int | None = None  # a local answer's rows as sent, at most (None: any)


def listen_socket(listen: str, rules: Rules = LOOPBACK_TRUST) -> socket.socket:
    """The listening socket of ``--listen`` (refused beyond loopback unless ``rules`` ask
    clients for a secret, or when the port is taken: before anything else is started)."""
    host, port = parse_listen(listen)
    if not is_loopback(host) and not rules.challenges:
        raise ProgrammingError(
            f"--listen {listen}: listening beyond loopback needs client authentication: give "
            "--hba FILE with scram-sha-256 (or hostssl password) rules, or listen on "
            "127.0.0.1 (or ::1)"
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ProgrammingError(
            f"cannot listen on {host}:{port}: {exc.strerror} (is another "
            "server using that port? choose another with --listen)"
        ) from None
    sock.listen(512)
    return sock


class Server:
    """Listens and serves until `shutdown` (see the module)."""

    def __init__(
        self,
        engine: Engine,
        options: ServerOptions | None = None,
        sock: socket.socket | None = None,
    ) -> None:
        self.engine = engine
        self.options = options or ServerOptions()
        self._socket = sock if sock is not None else listen_socket(self.options.listen)
        self.address = self._socket.getsockname()[:2]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._clients: dict[tuple[int, bytes], ClientConnection] = {}
        self._connections: set[ClientConnection] = set()  # the event loop's own
        self._next_pid = PID_MAX_LIMIT  # (`register`)
        self._signals = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread: int | None = None
        self._stopping: asyncio.Event | None = None
        self.workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="mtcache-session")
        self.admission = Admission(self.options.limits)
        self.pool = (
            SessionPool(self.options.pool_size, self.options.pool_timeout)
            if self.options.pool_size
            else None
        )
        # statements by route and outcome, and their latency: kept while metrics are served
        self.statement_stats = StatementStats() if self.options.metrics is not None else None
        self._own_stats = functools.partial(server_samples, self)
        engine.stats_sources.append(self._own_stats)  # (SHOW CACHE STATS over the wire too)
        self.metrics: MetricsEndpoint | None = None
        if self.options.metrics is not None:
            self.metrics = _metrics_endpoint(self, self.options.metrics)
        self.defaults = backend_defaults(engine.backend)
        self.describe = Describer(engine.backend, engine.store)
        # prepared runs answered in one step (`ClientConnection._at_hand`): by a statement's
        # lane (`Conversation.lane_at_hand`), and by `Conversation.execution_at_hand`
        self.lane_hits = 0
        self.runs_at_once = 0
        self.relayed_at_once = 0  # passed through by the loop (`ClientConnection._relay`)
        self.relayed_raw = 0  # of them, byte for byte (`cache.engine.conversation.raw`)

    # -- serving -----------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Accept clients until `shutdown` (or SIGTERM/SIGINT, see `install_signals`)."""
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(self._serve())

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self.loop, self.loop_thread = loop, threading.get_ident()
        if self._signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.shutdown)
        listening = await loop.create_server(
            lambda: ClientConnection(self), sock=self._socket, backlog=512
        )
        log.info(
            "mtcache serving %s on %s:%d (backend %s)",
            self.engine.cache_path,
            self.address[0],
            self.address[1],
            redact(self.engine.backend),
        )
        limits = self.options.limits
        if limits.statement_timeout is not None or limits.idle_in_transaction_timeout is not None:
            loop.call_later(TICK_SECONDS, self._tick)
        try:
            if not self._stop.is_set():
                await self._stopping.wait()
        finally:
            listening.close()
            await self._finish()

    def shutdown(self) -> None:
        """Refuse new sessions; `serve_forever` then finishes the running ones and returns
        (from any thread)."""
        self._stop.set()
        loop, stopping = self.loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended
                loop.call_soon_threadsafe(stopping.set)

    def install_signals(self) -> None:
        """SIGTERM and SIGINT shut the server down (call before `serve_forever`, in the main
        thread)."""
        self._signals = True
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.shutdown())

    async def _finish(self) -> None:
        """Let running statements finish within the grace period, cancel the rest, close."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.grace_seconds
        connections = list(self._connections)
        for client in connections:
            client.stop_reading()
        while loop.time() < deadline and any(c.working for c in connections):
            await asyncio.sleep(0.05)
        for client in connections:
            if client.busy:
                log.info("cancelling a statement still running at shutdown")
                client.cancel()
        farewell = protocol.error_response(
            "57P01", "terminating connection due to administrator command", severity="FATAL"
        )
        for client in connections:
            client.close(farewell)
        end = loop.time() + 15
        while self._connections and loop.time() < end:  # sessions close in the workers
            await asyncio.sleep(0.02)
        await loop.run_in_executor(None, self.workers.shutdown)
        if self.pool is not None:
            self.pool.close()
        if self.metrics is not None:
            self.metrics.close()
        with contextlib.suppress(ValueError):
            self.engine.stats_sources.remove(self._own_stats)
        log.info("mtcache server stopped")

    def _tick(self) -> None:
        """Statements and idle transactions past their time (`cache.server.limits`)."""
        if self._stop.is_set():
            return
        now, limits = time.monotonic(), self.options.limits
        for client in list(self._connections):
            client.check_time(now, limits)
        assert self.loop is not None
        self.loop.call_later(TICK_SECONDS, self._tick)

    def stats(self) -> list[Sample]:
        """The cache's figures and the server's (`cache.engine.stats`), read now through a
        DuckDB handle of their own (the Prometheus endpoint's scrape)."""
        engine = self.engine
        store = engine.store.for_thread()
        try:
            document = Admin(
                store, lambda: engine.backend, counters=lambda: engine.counters(store)
            ).status()
        finally:
            store.close()
        return engine.stats(document)

    def responsive(self, timeout: float) -> bool:
        """Whether the event loop runs a callback within ``timeout`` seconds (from another
        thread)."""
        loop, answered = self.loop, threading.Event()
        if loop is None or self._stop.is_set():
            return False
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # the loop has ended
            return False
        return answered.wait(timeout)

    def run(self, job: Callable[[], None]) -> None:
        """Run ``job`` on a worker thread (from the event loop)."""
        size = threading.stack_size(WORKER_STACK)  # (a thread made now gets this stack)
        try:
            self.workers.submit(job)
        finally:
            threading.stack_size(size)

    # -- sessions ----------------------------------------------------------------------------------

    def opened(self, client: ClientConnection) -> None:
        self._connections.add(client)

    def closed(self, client: ClientConnection) -> None:
        self._connections.discard(client)

    def register(self, client: ClientConnection, pid: int | None = None) -> tuple[int, bytes]:
        """The key a client's CancelRequest presents (BackendKeyData): ``pid``, the process of
        the session's own backend connection, as PostgreSQL tells it; None (a session without
        one yet, or a pooled one) a pid no process can have, never another's."""
        with self._lock:
            if pid is None:
                pid = self._next_pid
                self._next_pid = pid + 1 if pid < _LAST_PID else PID_MAX_LIMIT
            key = secrets.token_bytes(4)
            self._clients[(pid, key)] = client
        return pid, key

    def unregister(self, key: tuple[int, bytes]) -> None:
        with self._lock:
            self._clients.pop(key, None)

    def cancel(self, pid: int, key: bytes) -> None:
        with self._lock:
            client = self._clients.get((pid, key))
        if client is not None:
            client.cancel()

    def session_of(self, pid: int) -> Session | None:
        """The session of the client whose BackendKeyData gave this process id."""
        with self._lock:
            found = [client for (key_pid, _), client in self._clients.items() if key_pid == pid]
        return found[0].session if found else None

    def sessions(self) -> int:
        """How many client sessions are open."""
        with self._lock:
            return len(self._clients)

    def running(self) -> int:
        """How many sessions are answering a message now."""
        with self._lock:
            return sum(1 for client in self._clients.values() if client.busy)

    def quiet(self) -> bool:
        """Whether no session's messages are being answered by a worker or relayed now (a
        session's answer may reach its client a moment before its worker lets go of it)."""
        return not any(client.working for client in list(self._connections))

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()


class _Violation(t.NamedTuple):
    """A malformed message, answered in its turn (a FATAL ErrorResponse, the end)."""

    text: str


class ClientConnection(asyncio.Protocol):
    """One client socket: startup, then the conversation (see the module). The event loop
    reads, parses and answers what is at hand; a worker answers the rest (``working``: one
    has the conversation now, and takes the messages that arrive meanwhile)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.conversation: Conversation | None = None
        self.working = False  # a worker has the conversation (set and cleared by the loop)
        self.busy = False  # a message is being answered (statement number `_serial`)
        self._serial = 0
        self._cancelled = 0  # the statement last cancelled
        self._state = threading.Lock()
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
        self._busy_since = 0.0  # when the statement running now began (`time.monotonic`)
        self._idle_since = time.monotonic()  # when the client last sent or got something
        self._timed_out = 0  # the statement last interrupted for its time
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
        if isinstance(taken, Answered):
            self._flush()
            if taken is Answered.LANE:
                self.server.lane_hits += 1
            else:
                self.server.runs_at_once += 1
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
        with self._state:  # (a cancel before this finds nothing running, as before the send)
            self.busy = True
            self._serial += 1
            self._busy_since = time.monotonic()
        if self._watched != passing.fd:
            self._watch_backend()
        self.server.relayed_at_once += 1
        if passing.raw:
            self.server.relayed_raw += 1

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
        with self._state:
            self.busy = False
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
        if self.busy and not waiting:
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
                with self._state:
                    self.busy = True
                    self._serial += 1
                    self._busy_since = time.monotonic()
                conversation.cancel_reason = None
                if self._eof and not self._inbox:
                    # its client went away before it started: cancelled as if it had been
                    # running then (`_ending_input`)
                    self.cancel()
                try:
                    if not conversation.handle(message):
                        self._ending = True
                finally:
                    with self._state:
                        self.busy = False
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
        ours, backend_parameters = _split_parameters(parameters)
        user = parameters.get("user")
        if not user:
            self._fatal("28000", "no PostgreSQL user name specified in startup packet")
            return False
        database = parameters.get("database") or user
        backend_db = database_of(server.engine.backend)
        if backend_db is not None and database != backend_db:
            self._fatal(
                "3D000",
                f'database "{database}" is not served here: this cache '
                f'server fronts database "{backend_db}"',
            )
            return False
        try:
            credentials = server.options.login.check(
                self.tls,
                database,
                user,
                self._address(),
                self._send_now,
                functools.partial(self._next_message, time.monotonic() + AUTH_SECONDS),
            )
            server.admission.admit(user)
            self._admitted = user
        except LoginRefused as exc:
            log.info("refused a login of role %r: %s", user, exc)
            self._fatal(exc.sqlstate, str(exc))
            return False
        session = None
        try:
            options = SessionOptions.of(
                autocommit=True, currency_bound=server.options.currency_bound
            )
            defaults = server.defaults
            connect = _needs_backend_at_start(backend_parameters, defaults)
            for name, value in server.options.limits.backend_settings().items():
                backend_parameters.setdefault(name, value)  # (the client's own come first)
            session = Session(
                server.engine,
                options,
                backend_parameters=backend_parameters,
                backend_credentials=credentials,
                connect=connect,
                time_zone=defaults.get("TimeZone"),
                pool=server.pool,
            )
            # the client's DEALLOCATE ALL / DISCARD ALL reach this connection past psycopg,
            # which must then hold no prepared statements of its own (it prepares what the
            # engine asks five times)
            session.set_backend_setting("prepare_threshold", None)
            for name, value in ours.items():  # the cache's settings given at startup
                session.set_setting(name, value, default=True)
        except Error as exc:
            if session is not None:
                session.close()
            self._write(protocol.diagnostic(diagnostics(exc), fatal=True))
            self._flush()
            return False
        reported = reported_to(session, defaults, backend_parameters)
        encoding = reported.get("client_encoding", "UTF8")
        codec = values.codec_of(encoding, reported.get("server_encoding", "UTF8"))
        if codec is None:
            session.close()
            self._fatal("0A000", values.unconvertible(encoding))
            return False
        self.session = session
        settings = values.OutputSettings(
            codec=codec,
            extra_float_digits=_int(backend_parameters.get("extra_float_digits"), 1),
            date_style=reported.get("DateStyle", "ISO, MDY"),
        )
        self.conversation = Conversation(
            session,
            self._write,
            settings,
            server.describe,
            self._next_message,
            reported,
            max_result_bytes=server.options.max_result_bytes,
            statement_stats=server.statement_stats,
        )
        self.at_once = AtOnce(self.conversation)
        self._key = server.register(self, self.conversation.own_pid())
        self.conversation.told_pid = self._key[0]
        self.conversation.release_backend()  # (pooled: until a statement needs it)
        out = [protocol.AUTHENTICATION_OK]
        if startup.version & 0xFFFF:
            out.append(
                protocol.negotiate_protocol_version(
                    0, [n for n in parameters if n.startswith("_pq_.")]
                )
            )
        out += [protocol.parameter_status(n, v) for n, v in reported.items()]
        out.append(protocol.backend_key_data(*self._key))
        out.append(protocol.ready_for_query(b"I"))
        self._write(b"".join(out))
        self._flush()
        return True

    def _address(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        """The client's address (an IPv4 client of an IPv6 socket as IPv4)."""
        transport = self.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        try:
            address = ipaddress.ip_address(peer[0]) if peer else None
        except ValueError:
            return None
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            return address.ipv4_mapped
        return address

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
        data = b"".join(self._out)
        self._out.clear()
        self._out_size = 0
        if threading.get_ident() == self.server.loop_thread:
            self._send(data)
        elif self.tls:
            self._send_through_loop(data)
        elif self._fd is None:
            raise ConnectionError("the client went away")
        else:
            self._send_direct(self._fd, data)

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

    def _send_direct(self, fd: int, data: bytes) -> None:
        """A worker's output written to the socket (waiting while the client does not read:
        backpressure)."""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                _wait_writable(fd, 1.0)
                if self._lost or self._abandoned:
                    raise ConnectionError("the client went away") from None

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

    def cancel(self) -> None:
        """Cancel the statement running now (none: nothing happens, as PostgreSQL ignores a
        cancel that arrives between statements)."""
        session = self.session
        with self._state:
            if session is None or not self.busy or self._cancelled == self._serial:
                return  # nothing runs, or its cancel is under way
            serial = self._cancelled = self._serial
        threading.Thread(
            target=self._keep_interrupting, args=(session, serial), daemon=True
        ).start()

    def check_time(self, now: float, limits: Limits) -> None:
        """A statement past the statement timeout is interrupted; a session idle inside a
        transaction past the idle timeout is ended (from the event loop's tick)."""
        timeout = limits.statement_timeout
        if (
            timeout is not None
            and self.busy
            and now - self._busy_since > timeout
            and self._timed_out != self._serial
        ):
            self._timed_out = self._serial
            self._time_out()
        idle = limits.idle_in_transaction_timeout
        session = self.session
        if (
            idle is None
            or session is None
            or self.working
            or self.busy
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
        with self._state:
            if session is None or conversation is None or not self.busy:
                return
            serial = self._serial
        conversation.cancel_reason = "statement timeout"
        threading.Thread(
            target=self._keep_interrupting, args=(session, serial, False), daemon=True
        ).start()

    def _keep_interrupting(self, session: Session, serial: int, backend: bool = True) -> None:
        """Cancel the session's statement (its backend part by a cancel request), and repeat
        the local interrupt while it runs: DuckDB forgets one that comes before its statement
        starts (the cancel may arrive while the statement is still parsed or planned). So does
        the backend: when the client is gone, the cancel request is repeated too (spaced:
        each is a connection to the backend), as no later statement of the client's can be
        the one it reaches; a client's own cancel is sent once, as PostgreSQL takes it."""
        if backend:
            session.cancel()
        else:
            session.interrupt_local()
        now = time.monotonic()
        deadline, again = now + CANCEL_SECONDS, now + BACKEND_CANCEL_REPEAT
        while time.monotonic() < deadline:
            time.sleep(CANCEL_REPEAT)
            with self._state:
                if not self.busy or self._serial != serial:
                    return
                session.interrupt_local()
                gone = self._eof
            if backend and gone and time.monotonic() >= again:
                session.cancel_backend()
                again = time.monotonic() + BACKEND_CANCEL_REPEAT

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


def _wait_writable(fd: int, timeout: float) -> None:
    """Until the socket ``fd`` takes more output (or ``timeout`` seconds pass); poll, not
    select: a server with hundreds of sessions has descriptors past select's 1024."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT | select.POLLERR | select.POLLHUP)
    poller.poll(timeout * 1000)


def metrics_address(address: str) -> tuple[str, int]:
    """HOST:PORT of ``--metrics``, checked free (a bad or busy one: one clear error, before
    anything starts)."""
    host, port = parse_listen(address, "--metrics")
    try:
        socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET
        ).close()
    except OSError as exc:
        raise ProgrammingError(
            f"--metrics {address}: cannot listen there: {exc.strerror} (is "
            "another server using that port?)"
        ) from None
    return host, port


def _metrics_endpoint(server: Server, address: str) -> MetricsEndpoint:
    """The Prometheus endpoint of ``--metrics HOST:PORT``."""
    host, port = metrics_address(address)
    return MetricsEndpoint(server, host, port)


def _split_parameters(parameters: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(settings of ours, parameters for the backend session): ``mtcache.*`` settings come as
    startup parameters or as ``-c mtcache.x=y`` in ``options``."""
    ours: dict[str, str] = {}
    backend: dict[str, str] = {}
    for name, value in parameters.items():
        if name in ("user", "database", "replication") or name.startswith("_pq_."):
            continue
        if name.startswith("mtcache."):
            ours[name] = value
        elif name == "options":
            kept = []
            words = value.split()
            i = 0
            while i < len(words):
                word = words[i]
                setting = None
                if word == "-c" and i + 1 < len(words):
                    setting, i = words[i + 1], i + 2
                elif (word.startswith("-c") and len(word) > 2) or word.startswith("--"):
                    setting, i = word[2:], i + 1
                else:
                    kept.append(word)
                    i += 1
                    continue
                key, _, val = setting.partition("=")
                if key.startswith("mtcache."):
                    ours[key] = val
                else:
                    kept += ["-c", setting]
            if kept:
                backend["options"] = " ".join(kept)
        else:
            backend[name] = value
    backend["user"] = parameters.get("user", "")
    return ours, backend


def _needs_backend_at_start(parameters: dict[str, str], defaults: dict[str, str]) -> bool:
    """Whether the session must open its backend connection now: its parameters change what
    the backend reports (anything but the application name and a client encoding the
    defaults already have)."""
    for name, value in parameters.items():
        if name in {"application_name", "user"}:
            continue
        same = (defaults.get("client_encoding", "UTF8").replace("-", ""), "UTF8", "UNICODE")
        if name == "client_encoding" and value.upper().replace("-", "") in same:
            continue
        return True
    return parameters.get("user") != defaults.get("session_authorization")


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


__all__ = ["DEFAULT_LISTEN", "Server", "ServerOptions", "listen_socket", "metrics_address"]
