"""`mtcache serve`: the cache as a server that speaks PostgreSQL's protocol to every client.

One `Server` owns one engine (`cache.engine.Engine`: the cache file, its scheduler, stream
consumer and heartbeat) and a listening socket. Each client connection gets a thread of its
own and an engine session (`cache.engine.session.Session`), whose backend connection opens
only when the session first needs the backend; `cache.server.client.Conversation` answers its
messages. A thread per session, not an event loop: the engine's work is blocking (DuckDB, and
libpq waited on off the GIL), so statements of different sessions run in parallel wherever
DuckDB and the backend allow, and a slow remote statement never holds up another session's
hit (docs/decisions.md).

Startup: SSLRequest and GSSENCRequest are answered "N" (TLS arrives with authentication);
loopback clients are trusted (AuthenticationOk). ParameterStatus reports the backend's
settings as the backend reports them to a session with the client's parameters; BackendKeyData
gives the key a CancelRequest presents, which cancels the session's running statement, local
or remote (the DuckDB interrupt repeated while that statement runs, see `ClientConnection`);
a watcher cancels the statement of a client that went away while it ran. SIGTERM/SIGINT: stop
accepting, let running statements finish for a grace period, cancel what still runs, close the
sessions and the cache file.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import secrets
import selectors
import signal
import socket
import threading
import time
import typing as t
from dataclasses import dataclass

import psycopg
from psycopg import pq

from cache.backend.describe import describe_statement
from cache.backend.pool import pooled
from cache.backend.reflect import redact
from cache.engine.engine import Engine, SessionOptions
from cache.engine.session import Session
from cache.server import protocol, values
from cache.server.client import Conversation, Description
from cache.server.protocol import ProtocolViolation
from cache.server.relay import BackendRefused, diagnostic_message, fields_of
from sql_ext.errors import Error, ProgrammingError, diagnostics

log = logging.getLogger("mtcache.server")

DEFAULT_LISTEN = "127.0.0.1:6432"
GRACE_SECONDS = 10.0
_RECV = 256 * 1024
_SEND_BUFFER = 64 * 1024  # client bytes collected before a send
WATCH_SECONDS = 1.0  # how often running statements' clients are checked for being gone
CANCEL_SECONDS = 30.0  # how long a cancel keeps interrupting its statement's DuckDB work
CANCEL_REPEAT = 0.01
SESSION_STACK = 512 * 1024  # a session thread's stack (idle sessions stay cheap)

# the parameters PostgreSQL reports at startup (GUC_REPORT), in its order
_REPORTED = ("in_hot_standby", "integer_datetimes", "TimeZone", "IntervalStyle",
             "is_superuser", "application_name", "default_transaction_read_only",
             "scram_iterations", "DateStyle", "standard_conforming_strings",
             "session_authorization", "client_encoding", "server_version",
             "server_encoding", "search_path")  # fmt: skip


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) of ``--listen``."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536 or not host:
        raise ProgrammingError(f"--listen {text!r}: write HOST:PORT, e.g. {DEFAULT_LISTEN}")
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


def listen_socket(listen: str) -> socket.socket:
    """The listening socket of ``--listen`` (refused beyond loopback, or when the port is
    taken: before anything else is started)."""
    host, port = parse_listen(listen)
    if not is_loopback(host):
        raise ProgrammingError(
            f"--listen {listen}: listening beyond loopback needs client authentication, "
            "which this server does not have yet; listen on 127.0.0.1 (or ::1) and reach it "
            "through a tunnel")  # fmt: skip
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ProgrammingError(f"cannot listen on {host}:{port}: {exc.strerror} (is another "
                               "server using that port? choose another with --listen)") \
            from None  # fmt: skip
    sock.listen(512)
    return sock


class Server:
    """Listens and serves until `shutdown` (see the module)."""

    def __init__(self, engine: Engine, options: ServerOptions | None = None,
                 sock: socket.socket | None = None) -> None:  # fmt: skip
        self.engine = engine
        self.options = options or ServerOptions()
        self._socket = sock if sock is not None else listen_socket(self.options.listen)
        self.address = self._socket.getsockname()[:2]
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._lock = threading.Lock()
        self._clients: dict[tuple[int, bytes], ClientConnection] = {}
        self._threads: set[threading.Thread] = set()
        self._next_pid = 1
        self.defaults = _backend_defaults(engine.backend)
        self._describes: dict[tuple[str, tuple[int, ...], int], Description] = {}

    # -- serving -----------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Accept clients until `shutdown` (or SIGTERM/SIGINT, see `install_signals`)."""
        selector = selectors.DefaultSelector()
        selector.register(self._socket, selectors.EVENT_READ)
        selector.register(self._wake_r, selectors.EVENT_READ)
        log.info("mtcache serving %s on %s:%d (backend %s)", self.engine.cache_path,
                 self.address[0], self.address[1], redact(self.engine.backend))  # fmt: skip
        threading.Thread(target=self._watch, name="mtcache-watch", daemon=True).start()
        try:
            while not self._stop.is_set():
                for key, _ in selector.select():
                    if key.fileobj is self._wake_r:
                        continue
                    with contextlib.suppress(OSError):
                        sock, peer = self._socket.accept()
                        self._start(sock, peer)
        finally:
            selector.close()
            self._socket.close()
            self._finish()
            self._wake_r.close()
            self._wake_w.close()

    def _start(self, sock: socket.socket, peer: t.Any) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = ClientConnection(self, sock, peer)
        size = threading.stack_size(SESSION_STACK)
        try:
            thread = threading.Thread(target=client.run, name=f"mtcache-client-{peer}",
                                      daemon=True)  # fmt: skip
            thread.start()
        finally:
            threading.stack_size(size)
        with self._lock:
            self._threads.add(thread)
            self._threads = {t_ for t_ in self._threads if t_.is_alive()}

    def _watch(self) -> None:
        """Cancel the statement of a client that went away while it ran (as PostgreSQL's
        client_connection_check_interval): its session ends when the statement does."""
        while not self._stop.wait(WATCH_SECONDS):
            with self._lock:
                clients = list(self._clients.values())
            for client in clients:
                if client.busy and client.gone():
                    log.info("cancelling the statement of a client that went away")
                    client.cancel()

    def shutdown(self) -> None:
        """Refuse new sessions; `serve_forever` then finishes the running ones and returns."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.shutdown())

    def _finish(self) -> None:
        """Let running statements finish within the grace period, cancel the rest, close."""
        deadline = time.monotonic() + self.options.grace_seconds
        with self._lock:
            clients = list(self._clients.values())
        for client in clients:
            client.stop_when_idle()
        while time.monotonic() < deadline and any(c.busy for c in clients):
            time.sleep(0.05)
        for client in clients:
            if client.busy:
                log.info("cancelling a statement still running at shutdown")
                client.cancel()
        for client in clients:
            client.close(protocol.error_response(
                "57P01", "terminating connection due to administrator command",
                severity="FATAL"))  # fmt: skip
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()) + 5)
        log.info("mtcache server stopped")

    # -- sessions ----------------------------------------------------------------------------------

    def register(self, client: ClientConnection) -> tuple[int, bytes]:
        with self._lock:
            pid = self._next_pid
            self._next_pid += 1
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

    def sessions(self) -> int:
        """How many client sessions are open."""
        with self._lock:
            return len(self._clients)

    def running(self) -> int:
        """How many sessions are answering a message now."""
        with self._lock:
            return sum(1 for client in self._clients.values() if client.busy)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def describe(self, sql: str, types: tuple[int, ...],
                 conn: psycopg.Connection[t.Any] | None = None) -> Description:  # fmt: skip
        """The backend's description of a statement: parameter types and result columns
        (None: it returns no rows), kept while the cache schema stands; on ``conn`` (a
        session's own connection, which sees its temporary tables) when given, not kept."""
        key = (sql, types, self.engine.store.schema_version)
        found = self._describes.get(key) if conn is None else None
        if found is None:
            if conn is None:
                with pooled(self.engine.backend) as shared:
                    result = describe_statement(shared, sql.encode(), types)
            else:
                result = describe_statement(conn, sql.encode(), types)
            if result.status != pq.ExecStatus.COMMAND_OK:
                raise BackendRefused(diagnostic_message(result))
            found = (tuple(result.param_type(i) for i in range(result.nparams)),
                     fields_of(result) if result.nfields else None)  # fmt: skip
            if conn is not None:
                return found
            if len(self._describes) > 4096:
                self._describes.clear()
            self._describes[key] = found
        return found


def _backend_defaults(dsn: str) -> dict[str, str]:
    """The parameters the backend reports to a new session (for sessions that have not
    needed a backend connection yet)."""
    with pooled(dsn) as conn:
        return _reported_by(conn.info)


def _reported_by(info: psycopg.ConnectionInfo) -> dict[str, str]:
    """What a backend session reports in ParameterStatus, by name."""
    return {name: value for name in _REPORTED
            if (value := info.parameter_status(name)) is not None}  # fmt: skip


class ClientConnection:
    """One client socket: startup, then the conversation (see the module)."""

    def __init__(self, server: Server, sock: socket.socket, peer: t.Any) -> None:
        self.server = server
        self.sock = sock
        self.peer = peer
        self.session: Session | None = None
        self.conversation: Conversation | None = None
        self.busy = False  # a message is being answered (statement number `_serial`)
        self._serial = 0
        self._cancelled = 0  # the statement last cancelled
        self._state = threading.Lock()
        self._key: tuple[int, bytes] | None = None
        self._reader = protocol.FrontendReader()
        self._out: list[bytes] = []
        self._out_size = 0
        self._stop_when_idle = False
        self._closed = False
        self._send_lock = threading.Lock()

    # -- the thread ------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            if self._startup():
                self._converse()
        except (ConnectionError, OSError):
            pass  # the client went away: its session ends
        except ProtocolViolation as exc:
            self._fatal("08P01", str(exc))
        except Exception:
            log.exception("session failed")
            self._fatal("XX000", "internal error in the cache server (see its log)")
        finally:
            self._end()

    def _recv(self) -> bool:
        data = self.sock.recv(_RECV)
        if not data:
            return False
        self._reader.feed(data)
        return True

    def _startup(self) -> bool:
        reader = self._reader
        while True:
            packet = reader.next_startup()
            if packet is None:
                if not self._recv():
                    return False
                continue
            if isinstance(packet, protocol.SSLRequest | protocol.GSSENCRequest):
                if reader.pending:  # bytes sent before the answer: a man in the middle
                    raise ProtocolViolation("received unencrypted data after SSL request")
                self.sock.sendall(b"N")
                continue
            if isinstance(packet, protocol.CancelRequest):
                self.server.cancel(packet.pid, packet.key)
                return False
            return self._open_session(packet)

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
        backend_db = _dsn_database(server.engine.backend)
        if backend_db is not None and database != backend_db:
            self._fatal("3D000", f'database "{database}" is not served here: this cache '
                        f'server fronts database "{backend_db}"')  # fmt: skip
            return False
        session = None
        try:
            options = SessionOptions.of(autocommit=True,
                                        currency_bound=server.options.currency_bound)
            defaults = server.defaults
            session = Session(server.engine, options, backend_parameters=backend_parameters,
                              connect=_needs_backend_at_start(backend_parameters, defaults),
                              time_zone=defaults.get("TimeZone"))  # fmt: skip
            # the client's DEALLOCATE ALL / DISCARD ALL reach this connection past psycopg,
            # which must then hold no prepared statements of its own (it prepares what the
            # engine asks five times)
            session.set_backend_setting("prepare_threshold", None)
            for name, value in ours.items():  # the cache's settings given at startup
                session.set_setting(name, value, default=True)
        except Error as exc:
            if session is not None:
                session.close()
            with contextlib.suppress(OSError):
                self.sock.sendall(protocol.diagnostic(diagnostics(exc), fatal=True))
            return False
        self.session = session
        reported = _reported(session, defaults, backend_parameters)
        codec = values.codec_of(reported.get("client_encoding", "UTF8"),
                                reported.get("server_encoding", "UTF8"))  # fmt: skip
        settings = values.OutputSettings(
            codec=codec, extra_float_digits=_int(backend_parameters.get(
                "extra_float_digits"), 1),
            date_style=reported.get("DateStyle", "ISO, MDY"))  # fmt: skip
        self.conversation = Conversation(session, self._write, settings, server.describe,
                                         self._next_message, reported)  # fmt: skip
        self._key = server.register(self)
        out = [protocol.AUTHENTICATION_OK]
        if startup.version & 0xFFFF:
            out.append(protocol.negotiate_protocol_version(0, [
                n for n in parameters if n.startswith("_pq_.")]))  # fmt: skip
        out += [protocol.parameter_status(n, v) for n, v in reported.items()]
        out.append(protocol.backend_key_data(*self._key))
        out.append(protocol.ready_for_query(b"I"))
        self.sock.sendall(b"".join(out))
        return True

    def _converse(self) -> None:
        conversation = self.conversation
        session = self.session
        assert conversation is not None and session is not None
        reader = self._reader
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ)
        watched: int | None = None
        try:
            while True:
                message = reader.next_message()
                if message is None:
                    self._flush()
                    if self._stop_when_idle:
                        return
                    backend = session.backend_connection_if_open()
                    fd = backend.pgconn.socket if backend is not None else None
                    if fd != watched:
                        if watched is not None:
                            selector.unregister(watched)
                        if fd is not None:
                            selector.register(fd, selectors.EVENT_READ)
                        watched = fd
                    ready = selector.select()
                    if any(key.fileobj == fd for key, _ in ready) and backend is not None:
                        backend.pgconn.consume_input()
                        conversation.notify()  # LISTEN: what arrived while idle
                    if any(key.fileobj is self.sock for key, _ in ready) and not self._recv():
                        return
                    continue
                with self._state:
                    self.busy = True
                    self._serial += 1
                try:
                    if not conversation.handle(message):
                        return
                finally:
                    with self._state:
                        self.busy = False
        finally:
            selector.close()

    def _next_message(self) -> protocol.Message:
        """The client's next message, waiting for it (COPY FROM STDIN reads its data so)."""
        while True:
            message = self._reader.next_message()
            if message is not None:
                return message
            self._flush()
            if not self._recv():
                raise ConnectionError("the client went away")

    # -- output ----------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        self._out_size += len(data)
        if self._out_size >= _SEND_BUFFER:
            self._flush()

    def _flush(self) -> None:
        if self._out:
            data = b"".join(self._out)
            self._out.clear()
            self._out_size = 0
            with self._send_lock:
                self.sock.sendall(data)

    def _fatal(self, sqlstate: str, text: str) -> None:
        with contextlib.suppress(OSError):
            self._flush()
            self.sock.sendall(protocol.error_response(sqlstate, text, severity="FATAL"))

    # -- from other threads ----------------------------------------------------------------------

    def cancel(self) -> None:
        """Cancel the statement running now (none: nothing happens, as PostgreSQL ignores a
        cancel that arrives between statements)."""
        session = self.session
        with self._state:
            if session is None or not self.busy or self._cancelled == self._serial:
                return  # nothing runs, or its cancel is under way
            serial = self._cancelled = self._serial
            session.cancel()
        threading.Thread(target=self._keep_interrupting, args=(session, serial),
                         daemon=True).start()  # fmt: skip

    def _keep_interrupting(self, session: Session, serial: int) -> None:
        """Repeat the local interrupt while the cancelled statement runs: DuckDB forgets one
        that comes before its statement starts (the cancel may arrive while the statement is
        still parsed or planned)."""
        deadline = time.monotonic() + CANCEL_SECONDS
        while time.monotonic() < deadline:
            time.sleep(CANCEL_REPEAT)
            with self._state:
                if not self.busy or self._serial != serial:
                    return
                session.interrupt_local()

    def gone(self) -> bool:
        """Whether the client closed or reset its connection (bytes it sent and the session
        has not read yet stay where they are)."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def stop_when_idle(self) -> None:
        self._stop_when_idle = True
        if not self.busy:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RD)

    def close(self, farewell: bytes = b"") -> None:
        if self._closed:
            return
        with contextlib.suppress(OSError), self._send_lock:
            if farewell:
                self.sock.sendall(farewell)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def _end(self) -> None:
        self._closed = True
        if self._key is not None:
            self.server.unregister(self._key)
        if self.session is not None:
            with contextlib.suppress(Exception):
                self.session.close()
        with contextlib.suppress(OSError):
            self.sock.close()


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


def _reported(session: Session, defaults: dict[str, str],
              parameters: dict[str, str]) -> dict[str, str]:  # fmt: skip
    """The ParameterStatus values of a new session: its backend connection's, or (none open
    yet) the backend's defaults with the client's application name."""
    conn = session.backend_connection_if_open()
    if conn is not None:
        return _reported_by(conn.info)
    reported = dict(defaults)
    reported["application_name"] = parameters.get("application_name", "")
    return reported


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


def _dsn_database(dsn: str) -> str | None:
    try:
        return psycopg.conninfo.conninfo_to_dict(dsn).get("dbname")  # type: ignore[return-value]
    except psycopg.ProgrammingError:
        return None


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


__all__ = ["DEFAULT_LISTEN", "Server", "ServerOptions", "listen_socket"]
