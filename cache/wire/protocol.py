"""PostgreSQL's frontend/backend protocol, version 3, as the server side speaks it: a codec
without I/O (bytes in, messages out; messages in, bytes out), in the manner of h11.

`FrontendReader` is fed the bytes a client sent and hands back whole messages: first the
startup packet (`Startup`, `SSLRequest`, `GSSENCRequest`, `CancelRequest`), then typed
messages (`Query`, `Parse`, `Bind`, ...). A malformed message raises `ProtocolViolation`,
after which the connection is closed, as PostgreSQL closes it. The functions at the bottom
encode what the server sends (RowDescription, DataRow, ErrorResponse, ...).

No Python library speaks the server side of the protocol well enough to build on (psycopg and
asyncpg are clients; the server-side projects are unmaintained or tied to one engine): see
docs/decisions/the-protocol-codec-and-local-encoding.md. The codec is small and tested by
feeding it bytes, malformed ones too (tests/test_server_protocol.py).
"""

from __future__ import annotations

import functools
import struct
import typing as t
from collections.abc import Callable, Iterable, Sequence
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


def _parse_message(kind: bytes, data: bytes) -> Message:
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
        return _parse_message(kind, data)


def execution(data: bytes) -> tuple[Bind, bool] | None:
    """The run of messages a client sends to run a prepared statement once - Bind, Describe
    of its portal (or not), Execute of all its rows, Sync - when ``data`` is exactly that:
    (the Bind, whether its portal is described). None: anything else, or a malformed message
    (read message by message, where it gets its error)."""
    if len(data) < 5 or data[0] != 0x42:  # "B"
        return None
    end = _INT32.unpack_from(data, 1)[0] + 1
    if end > len(data) or end < 5:
        return None
    try:
        bind = _parse_message(b"B", data[5:end])
    except ProtocolViolation:
        return None
    assert isinstance(bind, Bind)
    portal = bind.portal
    tail = data[end:]
    run = _RUN_UNNAMED if not portal else _run_of(portal)
    if tail == run:
        return bind, False
    if tail == (_DESCRIBE_UNNAMED if not portal else _describe_of(portal)) + run:
        return bind, True
    return None


class RunShape(t.NamedTuple):
    """The bytes every run of one prepared statement (`execution`) shares when it differs from
    another only in its parameter values: what a client sends again and again, read again
    by comparing bytes (`values`) instead of parsing messages."""

    head: bytes  # the Bind's body up to its parameter count (portal, statement, formats)
    params: int  # how many parameters it has
    result_formats: bytes  # the Bind's rest
    tail: bytes  # Describe of the portal or not, Execute, Sync

    def renaming(self, statement: bytes) -> bytes:
        """The head of this shape's Bind naming ``statement`` instead (`rebound`)."""
        portal = self.head[: self.head.index(b"\0") + 1]
        return portal + statement + self.head[self.head.index(b"\0", len(portal)) :]

    def rebound(self, data: bytes, head: bytes) -> bytes:
        """A run of this shape (``data``) with another head for its Bind (`renaming`: the
        backend's name of the client's prepared statement); the rest as the client sent it."""
        size = _INT32.unpack_from(data, 1)[0] + len(head) - len(self.head)
        return b"B" + _INT32.pack(size) + head + data[5 + len(self.head) :]

    def values(self, data: bytes) -> list[bytes | None] | None:
        """The parameter values of a run of this shape; None when ``data`` is anything else
        (then read as usual, where it gets its answer or its error)."""
        found: list[bytes | None] = []
        return found if self._walk(data, found) else None

    def fits(self, data: bytes) -> bool:
        """Whether ``data`` is a run of this shape (`values`, without taking them out: a run
        passed through as it is needs only to be recognized)."""
        return self._walk(data, None)

    def _walk(self, data: bytes, found: list[bytes | None] | None) -> bool:
        head = self.head
        if data[:1] != b"B" or not data.startswith(head, 5):
            return False
        size = len(data)
        pos = 5 + len(head)
        unpack = _INT32.unpack_from
        for _ in range(self.params):
            if pos + 4 > size:
                return False
            length = unpack(data, pos)[0]
            pos += 4
            if length < 0:
                if length != -1:
                    return False
                if found is not None:
                    found.append(None)
                continue
            if found is not None:
                found.append(data[pos : pos + length])
            pos += length
        formats = self.result_formats
        end = pos + len(formats)
        return (
            pos <= size
            and unpack(data, 1)[0] + 1 == end
            and data.startswith(formats, pos)
            and data[end:] == self.tail
        )

    def value(self, data: bytes) -> bytes | None:
        """The one parameter value of a run of this shape (of one parameter), as `values`
        reads it; None also for a NULL."""
        head = self.head
        if data[:1] != b"B" or not data.startswith(head, 5):
            return None
        pos = 9 + len(head)
        if pos > len(data):
            return None
        end = pos + _INT32.unpack_from(data, pos - 4)[0]
        formats = self.result_formats
        rest = end + len(formats)
        if (
            end < pos
            or end > len(data)
            or _INT32.unpack_from(data, 1)[0] + 1 != rest
            or not data.startswith(formats, end)
            or data[rest:] != self.tail
        ):
            return None
        return data[pos:end]


def run_shape(bind: Bind, describe: bool) -> RunShape:
    """The shape of a run `execution` recognized (its Bind and whether it described the
    portal)."""
    head = (
        cstring(bind.portal)
        + cstring(bind.statement)
        + _INT16.pack(len(bind.param_formats))
        + b"".join(_INT16.pack(f) for f in bind.param_formats)
        + _INT16.pack(len(bind.params))
    )
    formats = _INT16.pack(len(bind.result_formats)) + b"".join(
        _INT16.pack(f) for f in bind.result_formats
    )
    portal = bind.portal
    tail = (_describe_of(portal) if describe else b"") + _run_of(portal)
    return RunShape(head, len(bind.params), formats, tail)


def _run_of(portal: bytes) -> bytes:
    """Execute of all the portal's rows, then Sync."""
    return message(b"E", portal + b"\0\0\0\0\0") + message(b"S")


def _describe_of(portal: bytes) -> bytes:
    return message(b"D", b"P" + portal + b"\0")


def _text(value: bytes) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise ProtocolViolation(
            "invalid byte sequence in startup packet (expected UTF-8)"
        ) from None


# -- what the backend sends, passed on as it came ----------------------------------------------


class BackendViolation(Exception):
    """The backend's bytes are not messages of the protocol: its connection is unusable."""


def ends_session(message: bytes) -> bool:
    """Whether an ErrorResponse is FATAL or PANIC: the backend session ends with it."""
    for field in message[5:].split(b"\0"):
        if field[:1] == b"V":  # (the severity, never localized)
            return field[1:] in (b"FATAL", b"PANIC")
    return False


class AnswerScan:
    """The backend's answer to a run passed through byte for byte (a statement's Bind to
    Sync): fed what the backend sent, it hands back the whole messages among them, to be
    forwarded as they are, and notes what the server must know of them - whether the
    statement failed (ErrorResponse), the settings the backend reported changed
    (ParameterStatus) and the transaction status of its ReadyForQuery, which ends the
    answer. Only message headers are read: a row's bytes are never looked at."""

    __slots__ = ("_rest", "failed", "fatal", "reported", "status")

    def __init__(self) -> None:
        self._rest = b""  # the start of a message not whole yet
        self.failed = False
        self.fatal = False  # an ErrorResponse ended the backend session (FATAL, PANIC)
        self.reported: list[tuple[bytes, bytes]] = []  # ParameterStatus (name, value)
        self.status: bytes | None = None  # ReadyForQuery's, once it came

    @property
    def done(self) -> bool:
        """ReadyForQuery came, and nothing after it is left half."""
        return self.status is not None and not self._rest

    def feed(self, data: bytes) -> bytes:
        """The whole messages ``data`` completes (the rest kept for the next feed)."""
        if self._rest:
            data = self._rest + data
        size = len(data)
        pos = 0
        unpack = _INT32.unpack_from
        while pos + 5 <= size:
            length = unpack(data, pos + 1)[0]
            if length < 4:
                raise BackendViolation(f"a backend message of length {length}")
            end = pos + 1 + length
            if end > size:
                break
            kind = data[pos]
            if kind == 0x5A:  # "Z" ReadyForQuery
                self.status = data[pos + 5 : end]
            elif kind == 0x45:  # "E" ErrorResponse
                self.failed = True
                self.fatal = self.fatal or ends_session(data[pos:end])
            elif kind == 0x53:  # "S" ParameterStatus
                name, value = data[pos + 5 : end].split(b"\0")[:2]
                self.reported.append((name, value))
            pos = end
        self._rest = data[pos:]
        return data[:pos] if pos < size else data


# -- what the server sends -----------------------------------------------------------------------


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + _INT32.pack(len(body) + 4) + body


def cstring(value: str | bytes) -> bytes:
    return (value.encode() if isinstance(value, str) else value) + b"\0"


_RUN_UNNAMED = _run_of(b"")
_DESCRIBE_UNNAMED = _describe_of(b"")


AUTHENTICATION_OK = message(b"R", _INT32.pack(0))


def authentication(code: int, data: bytes = b"") -> bytes:
    """An Authentication request: 3 cleartext password, 10 SASL (the mechanisms), 11 SASL
    continue, 12 SASL final (the data)."""
    return message(b"R", _INT32.pack(code) + data)


def sasl_initial_response(data: bytes) -> tuple[str, bytes]:
    """The mechanism and the client-first-message of a SASLInitialResponse body."""
    body = _Body(data, "SASLInitialResponse")
    mechanism = body.cstring()
    size = body.int32()
    first = body.take(size) if size >= 0 else b""
    body.end()
    return mechanism.decode("utf-8", "replace"), first


PARSE_COMPLETE = message(b"1")
BIND_COMPLETE = message(b"2")
CLOSE_COMPLETE = message(b"3")
NO_DATA = message(b"n")
PORTAL_SUSPENDED = message(b"s")
EMPTY_QUERY = message(b"I")
COPY_DONE = message(b"c")


def ready_for_query(status: bytes) -> bytes:
    """ReadyForQuery with b"I" (idle), b"T" (in a transaction) or b"E" (a failed one)."""
    return message(b"Z", status)


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", cstring(name) + cstring(value))


def backend_key_data(pid: int, key: bytes) -> bytes:
    return message(b"K", _INT32.pack(pid) + key)


def negotiate_protocol_version(newest_minor: int, unknown_options: Sequence[str]) -> bytes:
    body = _INT32.pack(newest_minor) + _INT32.pack(len(unknown_options))
    return message(b"v", body + b"".join(cstring(o) for o in unknown_options))


class Field(t.NamedTuple):
    """One column of a RowDescription."""

    name: bytes
    table_oid: int = 0
    column: int = 0
    type_oid: int = 0
    type_size: int = -1
    type_modifier: int = -1
    format: int = 0


def row_description(fields: Iterable[Field]) -> bytes:
    parts = []
    count = 0
    pack = _FIELD.pack
    for f in fields:
        parts.append(
            f.name
            + b"\0"
            + pack(
                f.table_oid & 0xFFFFFFFF,
                f.column,
                f.type_oid,
                f.type_size,
                f.type_modifier,
                f.format,
            )
        )
        count += 1
    return message(b"T", _INT16.pack(count) + b"".join(parts))


_FIELD = struct.Struct("!IhIhih")


def data_row(
    values: Sequence[t.Any], encoders: Sequence[Callable[[t.Any], bytes]] | None = None
) -> bytes:
    """A DataRow of encoded values, or of values each encoded by its column's encoder."""
    if encoders is not None and len(encoders) != len(values):
        raise ValueError(f"a row of {len(values)} values for {len(encoders)} columns")
    parts = [_INT16.pack(len(values))]
    append = parts.append
    for i, value in enumerate(values):
        if value is None:
            append(b"\xff\xff\xff\xff")
        else:
            encoded = value if encoders is None else encoders[i](value)
            append(_INT32.pack(len(encoded)))
            append(encoded)
    body = b"".join(parts)
    return b"D" + _INT32.pack(len(body) + 4) + body


def command_complete(tag: str | bytes) -> bytes:
    return message(b"C", cstring(tag))


@functools.lru_cache(maxsize=256)
def select_complete(rows: int) -> bytes:
    """CommandComplete of a SELECT of ``rows`` rows (made once per count)."""
    return command_complete(f"SELECT {rows}")


def parameter_description(type_oids: Sequence[int]) -> bytes:
    return message(
        b"t",
        _INT16.pack(len(type_oids))
        + b"".join(struct.pack("!I", o & 0xFFFFFFFF) for o in type_oids),
    )


def copy_response(kind: bytes, binary: bool, column_formats: Sequence[int]) -> bytes:
    """CopyInResponse (b"G"), CopyOutResponse (b"H") or CopyBothResponse (b"W")."""
    body = bytes([1 if binary else 0]) + _INT16.pack(len(column_formats))
    return message(kind, body + b"".join(_INT16.pack(f) for f in column_formats))


def copy_data(data: bytes) -> bytes:
    return message(b"d", data)


def notification(pid: int, channel: bytes, payload: bytes) -> bytes:
    return message(b"A", _INT32.pack(pid) + channel + b"\0" + payload + b"\0")


# The fields of an ErrorResponse or NoticeResponse, by their one-byte codes.
FIELD_CODES = {
    "severity": b"S",
    "severity_nonlocalized": b"V",
    "sqlstate": b"C",
    "message": b"M",
    "detail": b"D",
    "hint": b"H",
    "position": b"P",
    "internal_position": b"p",
    "internal_query": b"q",
    "context": b"W",
    "schema": b"s",
    "table": b"t",
    "column": b"c",
    "datatype": b"d",
    "constraint": b"n",
    "file": b"F",
    "line": b"L",
    "routine": b"R",
}


def error_fields(fields: Iterable[tuple[bytes, bytes]], notice: bool = False) -> bytes:
    """An ErrorResponse (or NoticeResponse) of (code, value) pairs, in order."""
    body = b"".join(code + value.replace(b"\0", b"") + b"\0" for code, value in fields)
    return message(b"N" if notice else b"E", body + b"\0")


def diagnostic(
    fields: Iterable[tuple[str, str]],
    codec: str = "utf-8",
    *,
    notice: bool = False,
    fatal: bool = False,
) -> bytes:
    """An ErrorResponse (NoticeResponse) of named fields (`sql_ext.errors.diagnostics`),
    in the client's encoding; ``fatal``: the severity of an error that ends the session."""
    severity = ("severity", "severity_nonlocalized") if fatal else ()
    return error_fields(
        [
            (
                FIELD_CODES[name],
                ("FATAL" if name in severity else value).encode(codec, errors="replace"),
            )
            for name, value in fields
        ],
        notice,
    )


def error_response(
    sqlstate: str,
    text: str,
    *,
    severity: str = "ERROR",
    detail: str | None = None,
    hint: str | None = None,
    position: int | None = None,
    notice: bool = False,
) -> bytes:
    """An ErrorResponse the server itself raises."""
    fields = [
        (b"S", severity.encode()),
        (b"V", severity.encode()),
        (b"C", sqlstate.encode()),
        (b"M", text.encode()),
    ]
    if detail:
        fields.append((b"D", detail.encode()))
    if hint:
        fields.append((b"H", hint.encode()))
    if position is not None:
        fields.append((b"P", str(position).encode()))
    return error_fields(fields, notice)
