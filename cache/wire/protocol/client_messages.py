"""What a client sends (`cache.wire.protocol`): the startup packets (`Startup`, `SSLRequest`,
`GSSENCRequest`, `CancelRequest`) and the messages after them (`Query`, `Parse`, `Bind`, ...),
read from its bytes by `FrontendReader` (`parse_message` reads one message's body); a
SASLInitialResponse's body; `ProtocolViolation` for anything malformed."""

from __future__ import annotations

import struct
from dataclasses import dataclass

PROTOCOL_3_0 = 3 << 16
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102

# PostgreSQL's limits: a startup packet is at most 10,000 bytes, any other message at most
# 1 GiB (PQ_LARGE_MESSAGE_LIMIT); bigger lengths are a client out of step.
MAX_STARTUP = 10_000
MAX_MESSAGE = (1 << 30) - 1

_INT32 = struct.Struct("!i")
_INT16 = struct.Struct("!h")
_HEADER = struct.Struct("!ci")


class ProtocolViolation(Exception):
    """The client broke the protocol: answered with an ErrorResponse (SQLSTATE 08P01), then
    the connection is closed."""

    sqlstate = "08P01"


# -- startup packets -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Startup:
    """A StartupMessage: protocol version and the parameters (user, database, options, ...)."""

    version: int
    parameters: dict[str, str]


@dataclass(frozen=True)
class SSLRequest:
    pass


@dataclass(frozen=True)
class GSSENCRequest:
    pass


@dataclass(frozen=True)
class CancelRequest:
    pid: int
    key: bytes


# -- messages after startup ----------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    sql: bytes


@dataclass(frozen=True)
class Parse:
    name: bytes
    sql: bytes
    param_types: tuple[int, ...]


@dataclass(frozen=True)
class Bind:
    portal: bytes
    statement: bytes
    param_formats: tuple[int, ...]
    params: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]

    def param_format(self, index: int) -> int:
        """The format of parameter ``index`` (one code: all; none: text)."""
        formats = self.param_formats
        if not formats:
            return 0
        return formats[0] if len(formats) == 1 else formats[index]


@dataclass(frozen=True)
class Describe:
    kind: bytes  # b"S": a prepared statement, b"P": a portal
    name: bytes


@dataclass(frozen=True)
class Execute:
    portal: bytes
    max_rows: int  # 0: all


@dataclass(frozen=True)
class Close:
    kind: bytes  # b"S" or b"P"
    name: bytes


@dataclass(frozen=True)
class Sync:
    pass


@dataclass(frozen=True)
class Flush:
    pass


@dataclass(frozen=True)
class Terminate:
    pass


@dataclass(frozen=True)
class CopyData:
    data: bytes


@dataclass(frozen=True)
class CopyDone:
    pass


@dataclass(frozen=True)
class CopyFail:
    message: bytes


@dataclass(frozen=True)
class FunctionCall:
    function_oid: int


@dataclass(frozen=True)
class Password:
    """A PasswordMessage (also SASL responses): its body, read by whoever asked for it."""

    data: bytes


StartupPacket = Startup | SSLRequest | GSSENCRequest | CancelRequest
Message = (
    Query
    | Parse
    | Bind
    | Describe
    | Execute
    | Close
    | Sync
    | Flush
    | Terminate
    | CopyData
    | CopyDone
    | CopyFail
    | FunctionCall
    | Password
)


class _Body:
    """Reads the fields of one message body, raising ProtocolViolation past its end."""

    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def int32(self) -> int:
        pos = self.pos
        if pos + 4 > len(self.data):
            raise self._short()
        self.pos = pos + 4
        return int(_INT32.unpack_from(self.data, pos)[0])

    def int16(self) -> int:
        pos = self.pos
        if pos + 2 > len(self.data):
            raise self._short()
        self.pos = pos + 2
        return int(_INT16.unpack_from(self.data, pos)[0])

    def uint32(self) -> int:
        return self.int32() & 0xFFFFFFFF

    def cstring(self) -> bytes:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise ProtocolViolation(f"invalid string in message {self.what}: no terminator")
        found = self.data[self.pos : end]
        self.pos = end + 1
        return found

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise self._short()
        found = self.data[self.pos : self.pos + n]
        self.pos += n
        return found

    def rest(self) -> bytes:
        found = self.data[self.pos :]
        self.pos = len(self.data)
        return found

    def count(self) -> int:
        n = self.int16()
        if n < 0:
            raise ProtocolViolation(f"negative count in message {self.what}")
        return n

    def end(self) -> None:
        if self.pos != len(self.data):
            raise ProtocolViolation(
                f"invalid message format: {len(self.data) - self.pos} "
                f"bytes left over in message {self.what}"
            )

    def _short(self) -> ProtocolViolation:
        return ProtocolViolation(f"insufficient data left in message {self.what}")


def _formats(body: _Body) -> tuple[int, ...]:
    codes = tuple(body.int16() for _ in range(body.count()))
    for code in codes:
        if code not in (0, 1):
            raise ProtocolViolation(f"unsupported format code: {code}")
    return codes


def parse_message(kind: bytes, data: bytes) -> Message:
    body = _Body(data, repr(kind.decode("latin-1")))
    message: Message
    if kind == b"Q":
        message = Query(body.cstring())
    elif kind == b"P":
        name, sql = body.cstring(), body.cstring()
        message = Parse(name, sql, tuple(body.uint32() for _ in range(body.count())))
    elif kind == b"B":
        portal, statement = body.cstring(), body.cstring()
        param_formats = _formats(body)
        params: list[bytes | None] = []
        for _ in range(body.count()):
            length = body.int32()
            if length < -1:
                raise ProtocolViolation(f"invalid parameter length {length} in message 'B'")
            params.append(None if length == -1 else body.take(length))
        if len(param_formats) > 1 and len(param_formats) != len(params):
            raise ProtocolViolation(
                f"bind message has {len(param_formats)} parameter formats "
                f"but {len(params)} parameters"
            )
        message = Bind(portal, statement, param_formats, tuple(params), _formats(body))
    elif kind in (b"D", b"C"):
        which = body.take(1)
        if which not in (b"S", b"P"):
            raise ProtocolViolation(
                f"invalid {'DESCRIBE' if kind == b'D' else 'CLOSE'} "
                f"message subtype {which[0] if which else 0}"
            )
        name = body.cstring()
        message = Describe(which, name) if kind == b"D" else Close(which, name)
    elif kind == b"E":
        message = Execute(body.cstring(), body.int32())
    elif kind == b"S":
        message = Sync()
    elif kind == b"H":
        message = Flush()
    elif kind == b"X":
        message = Terminate()
    elif kind == b"d":
        message = CopyData(body.rest())
    elif kind == b"c":
        message = CopyDone()
    elif kind == b"f":
        message = CopyFail(body.cstring())
    elif kind == b"F":
        message = FunctionCall(body.uint32())
        body.rest()
    elif kind == b"p":
        message = Password(body.rest())
    else:
        raise ProtocolViolation(f"invalid frontend message type {kind[0]}")
    body.end()
    return message


class FrontendReader:
    """Feed it the bytes a client sends (`feed`), take whole messages out (`next_startup`,
    then `next_message`); None: more bytes are needed."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def next_startup(self) -> StartupPacket | None:
        buffer = self._buffer
        if len(buffer) < 4:
            return None
        length = _INT32.unpack_from(buffer, 0)[0]
        if length < 8 or length > MAX_STARTUP:
            raise ProtocolViolation(f"invalid length of startup packet: {length}")
        if len(buffer) < length:
            return None
        data = bytes(buffer[4:length])
        del buffer[:length]
        body = _Body(data, "startup")
        code = body.int32()
        if code == SSL_REQUEST:
            body.end()
            return SSLRequest()
        if code == GSSENC_REQUEST:
            body.end()
            return GSSENCRequest()
        if code == CANCEL_REQUEST:
            pid = body.int32()
            key = body.rest()
            if not 4 <= len(key) <= 256:
                raise ProtocolViolation("invalid length of cancel request packet")
            return CancelRequest(pid, key)
        if code >> 16 != 3:
            raise ProtocolViolation(
                f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: server supports "
                "3.0 to 3.0"
            )
        parameters: dict[str, str] = {}
        while True:
            name = body.cstring()
            if not name:
                break
            parameters[_text(name)] = _text(body.cstring())
        body.end()
        return Startup(code, parameters)

    def next_message(self) -> Message | None:
        buffer = self._buffer
        if len(buffer) < 5:
            return None
        kind, length = _HEADER.unpack_from(buffer, 0)
        if length < 4 or length > MAX_MESSAGE:
            raise ProtocolViolation(f"invalid message length {length} for message type {kind[0]}")
        if len(buffer) < length + 1:
            return None
        data = bytes(buffer[5 : length + 1])
        del buffer[: length + 1]
        return parse_message(kind, data)


def _text(value: bytes) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise ProtocolViolation(
            "invalid byte sequence in startup packet (expected UTF-8)"
        ) from None


def sasl_initial_response(data: bytes) -> tuple[str, bytes]:
    """The mechanism and the client-first-message of a SASLInitialResponse body."""
    body = _Body(data, "SASLInitialResponse")
    mechanism = body.cstring()
    size = body.int32()
    first = body.take(size) if size >= 0 else b""
    body.end()
    return mechanism.decode("utf-8", "replace"), first
