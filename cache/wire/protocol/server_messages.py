"""What the server sends (`cache.wire.protocol`), encoded: `message` and `cstring` for any,
the authentication requests, the fixed messages (ParseComplete, NoData, ...), ReadyForQuery,
ParameterStatus, RowDescription (`Field`), DataRow, CommandComplete, the COPY responses,
notifications, and ErrorResponse / NoticeResponse (`error_response`, `diagnostic`)."""

from __future__ import annotations

import functools
import struct
import typing as t
from collections.abc import Callable, Iterable, Sequence

_INT32 = struct.Struct("!i")
_INT16 = struct.Struct("!h")


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + _INT32.pack(len(body) + 4) + body


def cstring(value: str | bytes) -> bytes:
    return (value.encode() if isinstance(value, str) else value) + b"\0"


AUTHENTICATION_OK = message(b"R", _INT32.pack(0))


def authentication(code: int, data: bytes = b"") -> bytes:
    """An Authentication request: 3 cleartext password, 10 SASL (the mechanisms), 11 SASL
    continue, 12 SASL final (the data)."""
    return message(b"R", _INT32.pack(code) + data)


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


def session_started(
    version: int,
    parameters: Sequence[str],
    reported: Iterable[tuple[str, str]],
    key: tuple[int, bytes],
) -> bytes:
    """What a client is sent once its session is open: AuthenticationOk, the protocol
    version the server speaks when the client asked for a newer minor one (with the
    ``_pq_.`` options of ``parameters`` it does not know), ParameterStatus of each reported
    setting, BackendKeyData and ReadyForQuery."""
    out = [AUTHENTICATION_OK]
    if version & 0xFFFF:
        out.append(negotiate_protocol_version(0, [n for n in parameters if n.startswith("_pq_.")]))
    out += [parameter_status(n, v) for n, v in reported]
    out.append(backend_key_data(*key))
    out.append(ready_for_query(b"I"))
    return b"".join(out)


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
