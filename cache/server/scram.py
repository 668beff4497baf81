"""The server's side of a SCRAM-SHA-256 exchange (RFC 5802, RFC 7677), as PostgreSQL runs it:
the role is the startup packet's (the SCRAM user name, which libpq leaves empty, is ignored),
no authorization identity, channel binding ``tls-server-end-point`` (RFC 5929) for the
``-PLUS`` mechanism over TLS.

`Verifier` is a role's secret as PostgreSQL stores it (``pg_authid.rolpassword``); `Exchange`
checks a client's proof against it and yields the ClientKey the proof carries, with which the
server logs in to the backend as that role (libpq's ``scram_client_key``): the backend checks
the same verifier. scramp, the maintained Python SCRAM library, refuses the empty user name
every libpq client sends, so the exchange is ours (docs/decisions/authentication-and-tls.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
import stringprep
import unicodedata
from dataclasses import dataclass

MECHANISM = "SCRAM-SHA-256"
MECHANISM_PLUS = "SCRAM-SHA-256-PLUS"
BINDING = "tls-server-end-point"
ITERATIONS = 4096  # PostgreSQL's scram_iterations default (a mock verifier's)
_NONCE_BYTES = 18
_B64 = r"([A-Za-z0-9+/=]+)"
_VERIFIER = re.compile(rf"SCRAM-SHA-256\$(\d+):{_B64}\${_B64}:{_B64}")


class ScramError(Exception):
    """The exchange failed: ``malformed`` when the client broke the protocol (08P01), else
    its proof did not verify (28P01)."""

    def __init__(self, text: str, malformed: bool = False) -> None:
        super().__init__(text)
        self.malformed = malformed


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ScramError("malformed SCRAM message (invalid base64)", malformed=True) from None


@dataclass(frozen=True)
class Verifier:
    """A role's SCRAM-SHA-256 secret: what the server needs to check a proof, never the
    password."""

    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    @classmethod
    def parse(cls, text: str | None) -> Verifier | None:
        """PostgreSQL's ``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``; None
        for anything else (no password, an MD5 hash, a plain password)."""
        found = _VERIFIER.fullmatch(text or "")
        if found is None:
            return None
        try:
            salt, stored, server = (base64.b64decode(found[i], validate=True) for i in (2, 3, 4))
        except (binascii.Error, ValueError):
            return None
        if len(stored) != 32 or len(server) != 32 or not salt or int(found[1]) < 1:
            return None
        return cls(int(found[1]), salt, stored, server)

    @classmethod
    def of_password(cls, password: str, salt: bytes, iterations: int) -> Verifier:
        """The verifier a password makes with this salt and iteration count."""
        salted = hashlib.pbkdf2_hmac("sha256", _saslprep(password).encode(), salt, iterations)
        client_key = _hmac(salted, b"Client Key")
        return cls(
            iterations, salt, hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key")
        )

    def checks(self, password: str) -> bool:
        """Whether a cleartext password is the one this verifier was made from."""
        made = Verifier.of_password(password, self.salt, self.iterations)
        return hmac.compare_digest(made.stored_key, self.stored_key)

    @classmethod
    def mock(cls, secret: bytes, role: str) -> Verifier:
        """A verifier no proof matches, the same for a role every time (an unknown role's
        exchange looks like a known one's, as PostgreSQL's mock authentication)."""
        salt = _hmac(secret, b"salt " + role.encode())[:16]
        return cls(ITERATIONS, salt, secrets.token_bytes(32), secrets.token_bytes(32))


@dataclass(frozen=True)
class BackendKeys:
    """What logs the backend connection in as the role the client proved to be (libpq's
    ``scram_client_key`` and ``scram_server_key``): secrets, never shown."""

    client_key: bytes
    server_key: bytes

    def conninfo(self) -> dict[str, str]:
        return {
            "scram_client_key": _b64(self.client_key),
            "scram_server_key": _b64(self.server_key),
        }

    def __repr__(self) -> str:
        return "BackendKeys(***)"


class Exchange:
    """One exchange: `first` answers the client's first message, `final` its last (raising
    `ScramError`), then `BackendKeys`. ``binding``: the hash of the server's certificate when
    the connection is TLS (the ``-PLUS`` mechanism is then offered and a client that supports
    channel binding must use it)."""

    def __init__(
        self, verifier: Verifier, binding: bytes | None = None, server_nonce: str | None = None
    ) -> None:
        self.verifier = verifier
        self.binding = binding
        self._server_nonce = server_nonce or _b64(secrets.token_bytes(_NONCE_BYTES))
        self._mechanism = ""
        self._header = ""
        self._first_bare = ""
        self._server_first = ""
        self._nonce = ""

    @property
    def mechanisms(self) -> list[str]:
        return [MECHANISM_PLUS, MECHANISM] if self.binding is not None else [MECHANISM]

    def first(self, mechanism: str, message: str) -> str:
        """The server-first-message answering a client-first-message."""
        if mechanism not in self.mechanisms:
            raise ScramError(
                f"client selected an invalid SASL authentication mechanism {mechanism!r}",
                malformed=True,
            )
        self._mechanism = mechanism
        parts = message.split(",", 2)
        if len(parts) != 3:
            raise ScramError("malformed SCRAM message (no GS2 header)", malformed=True)
        flag, authzid, bare = parts
        if flag.startswith("p="):
            if mechanism != MECHANISM_PLUS:
                raise ScramError(
                    "malformed SCRAM message (channel binding asked without the -PLUS mechanism)",
                    malformed=True,
                )
            if flag[2:] != BINDING:
                raise ScramError(
                    f"unsupported SCRAM channel-binding type {flag[2:]!r}", malformed=True
                )
        elif flag == "y":
            if self.binding is not None:
                raise ScramError(
                    "SCRAM channel binding negotiation error: the client "
                    "supports channel binding but thinks the server does not; "
                    "this server does",
                    malformed=True,
                )
        elif flag != "n" or mechanism == MECHANISM_PLUS:
            raise ScramError(
                "malformed SCRAM message (unexpected channel-binding flag)", malformed=True
            )
        if authzid:
            raise ScramError(
                "client uses authorization identity, but it is not supported", malformed=True
            )
        attributes = _attributes(bare)
        if [name for name, _ in attributes[:2]] != ["n", "r"] or len(attributes) != 2:
            raise ScramError("malformed SCRAM message (expected n= and r=)", malformed=True)
        client_nonce = attributes[1][1]
        if not client_nonce or not all(0x21 <= ord(c) <= 0x7E and c != "," for c in client_nonce):
            raise ScramError("malformed SCRAM message (invalid nonce)", malformed=True)
        self._header = f"{flag},{authzid},"
        self._first_bare = bare
        self._nonce = client_nonce + self._server_nonce
        verifier = self.verifier
        self._server_first = f"r={self._nonce},s={_b64(verifier.salt)},i={verifier.iterations}"
        return self._server_first

    def final(self, message: str) -> tuple[str, BackendKeys]:
        """The server-final-message for a client-final-message whose proof verifies, and the
        keys for the backend login."""
        if not self._server_first:
            raise ScramError("malformed SCRAM message (no first message)", malformed=True)
        attributes = _attributes(message)
        if [name for name, _ in attributes[:2]] != ["c", "r"] or attributes[-1][0] != "p":
            raise ScramError("malformed SCRAM message (expected c=, r= ... p=)", malformed=True)
        binding = self._header.encode()
        if self._header.startswith("p="):
            assert self.binding is not None
            binding += self.binding
        if not hmac.compare_digest(_unb64(attributes[0][1]), binding):
            raise ScramError("SCRAM channel binding check failed")
        if not hmac.compare_digest(attributes[1][1].encode(), self._nonce.encode()):
            raise ScramError("malformed SCRAM message (nonce mismatch)", malformed=True)
        proof = _unb64(attributes[-1][1])
        without_proof = message[: message.rindex(",p=")]
        auth = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        verifier = self.verifier
        signature = _hmac(verifier.stored_key, auth)
        if len(proof) != len(signature):
            raise ScramError("malformed SCRAM message (invalid proof length)", malformed=True)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), verifier.stored_key):
            raise ScramError("the proof did not verify")
        server_final = f"v={_b64(_hmac(verifier.server_key, auth))}"
        return server_final, BackendKeys(client_key, verifier.server_key)


def _saslprep(password: str) -> str:
    """A password as PostgreSQL prepares it before hashing (SASLprep, RFC 4013): non-ASCII
    spaces mapped to a space, what maps to nothing dropped, NFKC; a password SASLprep
    prohibits is used as it is, as PostgreSQL does."""
    if password.isascii():
        return password
    mapped = "".join(
        " " if stringprep.in_table_c12(c) else "" if stringprep.in_table_b1(c) else c
        for c in password
    )
    prepared = unicodedata.normalize("NFKC", mapped)
    prohibited = (
        stringprep.in_table_c12,
        stringprep.in_table_c21_c22,
        stringprep.in_table_c3,
        stringprep.in_table_c4,
        stringprep.in_table_c5,
        stringprep.in_table_c6,
        stringprep.in_table_c7,
        stringprep.in_table_c8,
        stringprep.in_table_c9,
        stringprep.in_table_a1,
    )
    if any(check(c) for c in prepared for check in prohibited):
        return password
    if any(stringprep.in_table_d1(c) for c in prepared) and (
        any(stringprep.in_table_d2(c) for c in prepared)
        or not stringprep.in_table_d1(prepared[0])
        or not stringprep.in_table_d1(prepared[-1])
    ):
        return password  # (bidirectional rules)
    return prepared


def _attributes(message: str) -> list[tuple[str, str]]:
    """The ``name=value`` attributes of a SCRAM message, in order."""
    found: list[tuple[str, str]] = []
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=" or not part[0].isalpha():
            raise ScramError("malformed SCRAM message (invalid attribute)", malformed=True)
        found.append((part[0], part[2:]))
    return found


def certificate_hash(der: bytes) -> bytes:
    """``tls-server-end-point`` channel-binding data of a certificate (RFC 5929): its hash by
    the certificate's signature hash algorithm, SHA-256 for MD5 and SHA-1."""
    from cryptography import x509

    algorithm = x509.load_der_x509_certificate(der).signature_hash_algorithm
    name = algorithm.name if algorithm is not None else "sha256"
    if name in ("md5", "sha1"):
        name = "sha256"
    return hashlib.new(name, der).digest()


__all__ = ["BackendKeys", "Exchange", "ScramError", "Verifier", "certificate_hash"]
