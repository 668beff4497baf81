"""How `mtcache serve` is configured and where it listens: the server's options, and the
``--listen`` and ``--metrics`` addresses checked before anything starts."""

from __future__ import annotations

import ipaddress
import socket
import ssl
from dataclasses import dataclass, field

from cache.backend.session_pool import DEFAULT_TIMEOUT as POOL_TIMEOUT
from cache.server.auth import LOOPBACK_TRUST, Login, Rules
from cache.server.limits import Limits
from sql_ext.errors import ProgrammingError

DEFAULT_LISTEN = "127.0.0.1:6432"
GRACE_SECONDS = 10.0


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


__all__ = [
    "DEFAULT_LISTEN",
    "POOL_TIMEOUT",
    "ServerOptions",
    "is_loopback",
    "listen_socket",
    "metrics_address",
    "parse_listen",
]
