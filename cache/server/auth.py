"""Who may connect to `mtcache serve`, and how a client proves which role it is.

Rules (`Rules`, ``--hba FILE``, in the spirit of pg_hba.conf): the first line that matches a
connection (TLS or not, database, role, client address) gives its method: ``trust``,
``reject``, ``scram-sha-256``, or ``password`` (cleartext, so over TLS only). Without a file,
loopback clients are trusted, the embedded default, and the server listens on loopback only.
``trust`` is for loopback addresses only: anyone who reaches the port could claim any role.

Secrets (`Verifiers`): a role's SCRAM verifier as PostgreSQL stores it, from an auth file in
pgbouncer's format (``--auth-file``) or from the backend by an auth query run as the server's
own backend role (``--auth-query``; by default pg_authid, which needs a superuser: a
SECURITY DEFINER function serves a role that is not). A client's SCRAM proof yields the keys
that log its session's backend connection in as that role, so the backend checks the same
secret; a cleartext password is checked against the verifier and is the backend login's
password (`Login.credentials`). Nothing secret is logged, shown or kept beyond the session.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import secrets
import typing as t
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cache.backend.reflect import database_of
from cache.backend.roles import is_member, role_secret
from cache.server.scram import Exchange, ScramError, Verifier
from cache.wire import protocol
from sql_ext.errors import BackendUnavailableError, Error, ProgrammingError, first_line

log = logging.getLogger("mtcache.server")

KINDS = ("host", "hostssl", "hostnossl")
METHODS = ("trust", "reject", "scram-sha-256", "password")
AUTH_SECONDS = 60.0  # to finish authenticating (PostgreSQL's authentication_timeout)
DEFAULT_AUTH_QUERY = (
    "SELECT rolpassword FROM pg_catalog.pg_authid WHERE rolname = %s AND rolcanlogin "
    "AND (rolvaliduntil IS NULL OR rolvaliduntil > now())"
)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


class LoginRefused(Exception):
    """A client may not log in: a FATAL ErrorResponse with this SQLSTATE and text."""

    def __init__(self, sqlstate: str, text: str) -> None:
        super().__init__(text)
        self.sqlstate = sqlstate


# -- rules ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One line of the rules: None for ``all``; ``groups``: the ``+role`` entries."""

    line: int
    kind: str
    databases: frozenset[str] | None
    roles: frozenset[str] | None
    groups: frozenset[str]
    network: Network | None
    method: str

    def admits(
        self,
        tls: bool,
        database: str,
        role: str,
        address: Address | None,
        member: Callable[[str, str], bool],
    ) -> bool:
        if (self.kind == "hostssl" and not tls) or (self.kind == "hostnossl" and tls):
            return False
        if self.databases is not None and database not in self.databases:
            return False
        network = self.network
        if network is not None and (
            address is None or address.version != network.version or address not in network
        ):
            return False
        if self.roles is None or role in self.roles:
            return True
        return any(member(role, group) for group in self.groups)


@dataclass(frozen=True)
class Rules:
    rules: tuple[Rule, ...]
    source: str

    @classmethod
    def load(cls, path: Path) -> Rules:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ProgrammingError(f"--hba {path}: cannot read it ({exc.strerror})") from None
        return cls.parse(text, f"--hba {path}")

    @classmethod
    def parse(cls, text: str, source: str) -> Rules:
        rules = [
            _rule(number, line, source)
            for number, line in enumerate(text.splitlines(), 1)
            if line.split("#", 1)[0].strip()
        ]
        if not rules:
            raise ProgrammingError(
                f"{source}: no rules (write lines such as 'hostssl all all "
                "0.0.0.0/0 scram-sha-256')"
            )
        return cls(tuple(rules), source)

    @property
    def needs_tls(self) -> bool:
        return any(rule.kind == "hostssl" for rule in self.rules)

    @property
    def challenges(self) -> bool:
        """Whether some rule asks for a secret (then the server needs verifiers)."""
        return any(rule.method in ("scram-sha-256", "password") for rule in self.rules)

    def rule_for(
        self,
        tls: bool,
        database: str,
        role: str,
        address: Address | None,
        member: Callable[[str, str], bool],
    ) -> Rule:
        for rule in self.rules:
            if rule.admits(tls, database, role, address, member):
                return rule
        where = "no encryption" if not tls else "TLS"
        raise LoginRefused(
            "28000",
            f'no rule of the cache server for host "{address}", user '
            f'"{role}", database "{database}", {where}',
        )


# loopback clients trusted: the embedded default (the server then listens on loopback only)
LOOPBACK_TRUST = Rules(
    tuple(Rule(0, "host", None, None, frozenset(), network, "trust") for network in _LOOPBACK),
    "the default: loopback clients trusted",
)


def _rule(number: int, line: str, source: str) -> Rule:
    words = line.split("#", 1)[0].split()
    where = f"{source} line {number}"
    if words[0] not in KINDS:
        raise ProgrammingError(
            f"{where}: type {words[0]!r} is not one of {', '.join(KINDS)} "
            "(the server listens on TCP only)"
        )
    if len(words) != 5:
        raise ProgrammingError(
            f"{where}: write TYPE DATABASE USER ADDRESS METHOD, e.g. "
            f"'hostssl all all 0.0.0.0/0 scram-sha-256', not "
            f"{line.strip()!r}"
        )
    kind, databases, users, address, method = words
    if method == "md5":
        raise ProgrammingError(
            f"{where}: md5 is not offered: use scram-sha-256 (the server "
            "checks SCRAM verifiers, as PostgreSQL stores passwords)"
        )
    if method not in METHODS:
        raise ProgrammingError(f"{where}: method {method!r} is not one of {', '.join(METHODS)}")
    network: Network | None = None
    if address != "all":
        try:
            network = ipaddress.ip_network(address, strict=False)
        except ValueError:
            raise ProgrammingError(
                f"{where}: address {address!r} is not 'all' or an address "
                "with its mask, e.g. 10.0.0.0/8"
            ) from None
    if method == "password" and kind != "hostssl":
        raise ProgrammingError(
            f"{where}: password sends it in clear: only on a hostssl line (or use scram-sha-256)"
        )
    if method == "trust" and not _loopback_only(network):
        raise ProgrammingError(
            f"{where}: trust beyond loopback lets anyone who reaches the "
            "port in as any role: give a loopback address, or use "
            "scram-sha-256"
        )
    roles: set[str] | None = set()
    groups = set()
    for name in users.split(","):
        if name == "all":
            roles = None
        elif name.startswith("+") and len(name) > 1:
            groups.add(name[1:])
        elif name and roles is not None:
            roles.add(name)
    names = databases.split(",")
    return Rule(
        number,
        kind,
        None if "all" in names else frozenset(names),
        None if roles is None else frozenset(roles),
        frozenset(groups),
        network,
        method,
    )


def _loopback_only(network: Network | None) -> bool:
    return network is not None and any(
        network.version == loop.version and network.subnet_of(loop)  # type: ignore[arg-type]
        for loop in _LOOPBACK
    )


# -- secrets --------------------------------------------------------------------------------------


class Verifiers(t.Protocol):
    def verifier(self, role: str) -> Verifier | None:
        """The role's SCRAM verifier; None: no such role, or it has none (no login, no
        password, an MD5 one, expired)."""


class AuthFile:
    """pgbouncer's auth_file: ``"role" "SCRAM-SHA-256$..."`` a line, read again when it
    changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._verifiers: dict[str, Verifier] = {}
        self._read()

    def verifier(self, role: str) -> Verifier | None:
        try:
            self._read()
        except ProgrammingError as exc:  # (a bad edit: the last good file stays in force)
            log.warning("%s", exc)
        return self._verifiers.get(role)

    def _read(self) -> None:
        try:
            stat = self.path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
            if stamp == self._stamp:
                return
            text = self.path.read_text()
        except OSError as exc:
            raise ProgrammingError(
                f"--auth-file {self.path}: cannot read it ({exc.strerror})"
            ) from None
        verifiers = {}
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith(";") or line.lstrip().startswith("#"):
                continue
            found = re.fullmatch(r'\s*"((?:[^"]|"")*)"\s+"((?:[^"]|"")*)"\s*', line)
            where = f"--auth-file {self.path} line {number}"
            if found is None:
                raise ProgrammingError(
                    f'{where}: write "role" "SCRAM-SHA-256$..." (as pg_authid.rolpassword holds it)'
                )
            role, secret = (g.replace('""', '"') for g in found.groups())
            verifier = Verifier.parse(secret)
            if verifier is None:
                raise ProgrammingError(
                    f"{where}: role {role!r} has no SCRAM-SHA-256 verifier "
                    "(plain and MD5 passwords are not accepted: copy "
                    "pg_authid.rolpassword after setting the password with "
                    "password_encryption = scram-sha-256)"
                )
            verifiers[role] = verifier
        self._verifiers, self._stamp = verifiers, stamp


class AuthQuery:
    """The backend's own verifiers, by a query of one parameter (the role) that returns the
    verifier, run on the server's backend connections."""

    def __init__(self, backend: str, query: str | None = None) -> None:
        self.backend = backend
        self.query = query or DEFAULT_AUTH_QUERY

    def check(self) -> None:
        """Run the query once (at start: a query the backend refuses fails there; while the
        backend is unreachable, the first login runs it)."""
        try:
            self._secret("mtcache")
        except BackendUnavailableError:
            return
        except Error as exc:
            raise ProgrammingError(
                f"--auth-query fails on the backend: {first_line(exc)} "
                "(the default reads pg_authid, which needs a superuser; "
                "give a query calling a SECURITY DEFINER function, or "
                "--auth-file)"
            ) from None

    def verifier(self, role: str) -> Verifier | None:
        try:
            secret = self._secret(role)
        except BackendUnavailableError as exc:
            raise LoginRefused(
                "08006",
                f"the cache server cannot check credentials while the "
                f"backend is unreachable: {exc}",
            ) from None
        except Error as exc:
            log.warning("the auth query failed for a login: %s", first_line(exc))
            raise LoginRefused(
                "08006",
                "the cache server could not look up the role's "
                "credentials on the backend (see its log)",
            ) from None
        if secret is not None and Verifier.parse(secret) is None:
            log.warning(
                "role %r has no SCRAM-SHA-256 verifier on the backend (an MD5 or no "
                "password): it cannot log in through the cache server",
                role,
            )
        return Verifier.parse(secret)

    def _secret(self, role: str) -> str | None:
        return role_secret(self.backend, self.query, role)


def backend_membership(backend: str) -> Callable[[str, str], bool]:
    """Whether a role is a member of a group role, as the backend says (for ``+group``)."""

    def member(role: str, group: str) -> bool:
        try:
            return is_member(backend, role, group)
        except Error as exc:
            raise LoginRefused(
                "08006",
                f"the cache server could not check role membership "
                f"on the backend: {first_line(exc)}",
            ) from None

    return member


# -- a client's login -----------------------------------------------------------------------------


@dataclass
class Login:
    """How the server checks its clients (see the module)."""

    rules: Rules = LOOPBACK_TRUST
    verifiers: Verifiers | None = None
    binding: bytes | None = None  # the certificate's channel-binding hash, with TLS
    member: Callable[[str, str], bool] = lambda role, group: False
    _secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    def check(
        self,
        tls: bool,
        database: str,
        role: str,
        address: Address | None,
        send: Callable[[bytes], None],
        receive: Callable[[], protocol.Message],
    ) -> dict[str, str]:
        """Authenticate a client (``send`` a message to it, ``receive`` its next one): the
        backend login's credentials (libpq keywords, secret), or `LoginRefused`."""
        rule = self.rules.rule_for(tls, database, role, address, self.member)
        if rule.method == "trust":
            return {}
        if rule.method == "reject":
            raise LoginRefused(
                "28000",
                f"the cache server's rules reject connection for host "
                f'"{address}", user "{role}", database "{database}"',
            )
        failed = LoginRefused("28P01", f'password authentication failed for user "{role}"')
        verifier = self.verifiers.verifier(role) if self.verifiers is not None else None
        if rule.method == "password":
            send(protocol.authentication(3))
            password = _password(receive()).rstrip(b"\0").decode("utf-8", "replace")
            if verifier is None or not verifier.checks(password):
                raise failed
            return {"password": password}
        exchange = Exchange(
            verifier or Verifier.mock(self._secret, role), self.binding if tls else None
        )
        send(
            protocol.authentication(
                10, b"".join(protocol.cstring(m) for m in exchange.mechanisms) + b"\0"
            )
        )
        try:
            mechanism, first = protocol.sasl_initial_response(_password(receive()))
            send(protocol.authentication(11, exchange.first(mechanism, _text(first)).encode()))
            final, keys = exchange.final(_text(_password(receive())))
        except ScramError as exc:
            if exc.malformed:
                raise LoginRefused("08P01", str(exc)) from None
            raise failed from None
        if verifier is None:
            raise failed
        send(protocol.authentication(12, final.encode()))
        return keys.conninfo()


def login_of(parameters: dict[str, str], backend: str) -> tuple[str, str]:
    """The role and database a startup packet asks for, or `LoginRefused`: a role is named,
    and the database is the one the backend (``backend``, its DSN) serves."""
    user = parameters.get("user")
    if not user:
        raise LoginRefused("28000", "no PostgreSQL user name specified in startup packet")
    database = parameters.get("database") or user
    served = database_of(backend)
    if served is not None and database != served:
        raise LoginRefused(
            "3D000",
            f'database "{database}" is not served here: this cache '
            f'server fronts database "{served}"',
        )
    return user, database


def peer_address(peer: t.Any) -> Address | None:
    """A client's address from its socket's peer name (an IPv4 client of an IPv6 socket as
    IPv4; None: not an IP client)."""
    try:
        address = ipaddress.ip_address(peer[0]) if peer else None
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _password(message: protocol.Message) -> bytes:
    if not isinstance(message, protocol.Password):
        raise LoginRefused(
            "08P01", f"expected a password or SASL response, got {type(message).__name__}"
        )
    return message.data


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("malformed SCRAM message (not UTF-8)", malformed=True) from None


def tls_context(cert: Path, key: Path) -> tuple[t.Any, bytes]:
    """The server's TLS context (TLS 1.2 or later, ALPN ``postgresql``) and its certificate's
    channel-binding hash."""
    import ssl

    from cache.server.scram import certificate_hash

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
        pem = cert.read_text()
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
        raise ProgrammingError(
            f"--tls-cert {cert} / --tls-key {key}: cannot load them ({reason})"
        ) from None
    if os.name == "posix" and key.stat().st_mode & 0o037:
        raise ProgrammingError(
            f"--tls-key {key}: others may read it; chmod 600 it (as "
            "PostgreSQL requires of its ssl_key_file)"
        )
    context.set_alpn_protocols(["postgresql"])
    first = re.search(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", pem, re.S)
    assert first is not None  # (load_cert_chain read one)
    der = ssl.PEM_cert_to_DER_cert(first[0])
    return context, certificate_hash(der)


__all__ = [
    "AUTH_SECONDS",
    "LOOPBACK_TRUST",
    "AuthFile",
    "AuthQuery",
    "Login",
    "LoginRefused",
    "Rules",
    "backend_membership",
    "tls_context",
]
