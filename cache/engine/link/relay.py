"""Statements passed through to the backend, over the engine session's own backend connection,
with libpq (psycopg's ``pq`` wrapper): what PostgreSQL answers goes back to the client as
PostgreSQL sent it (rows as the bytes it sent, every field of an error or notice, command tags,
transaction status).

Between two Syncs of the extended protocol the connection is in libpq's pipeline mode, so a
client's pipeline costs one round trip to the backend, as without the server. A wait for the
backend never holds the GIL (libpq is called only when data is there), so other sessions run
meanwhile.
"""

from __future__ import annotations

import select
import typing as t
from collections.abc import Callable

import psycopg
from psycopg import pq
from psycopg.pq import ExecStatus, Format

from cache.wire import protocol
from cache.wire.protocol import Field

Out = Callable[[bytes], None]  # where the client's bytes go (buffered by the caller)

CHUNK_ROWS = 1000  # rows per result read from the backend at a time: memory stays bounded

# every field PostgreSQL's errors carry, as libpq names them (its codes are the protocol's)
_DIAGNOSTICS = [(code, pq.DiagnosticField(code[0])) for code in protocol.FIELD_CODES.values()]

ROWS = (ExecStatus.TUPLES_OK, ExecStatus.SINGLE_TUPLE, ExecStatus.TUPLES_CHUNK)


def diagnostic_message(result: pq.abc.PGresult, notice: bool = False) -> bytes:
    """An ErrorResponse (NoticeResponse) with every field PostgreSQL sent."""
    fields = []
    for code, field in _DIAGNOSTICS:
        value = result.error_field(field)
        if value is not None:
            fields.append((code, value))
    if not fields:  # a client-side failure of libpq (the connection was lost)
        text = result.error_message or b"the backend connection was lost"
        fields = [(b"S", b"FATAL"), (b"V", b"FATAL"), (b"C", b"08006"), (b"M", text.strip())]
    return protocol.error_fields(fields, notice)


def fields_of(result: pq.abc.PGresult, formats: t.Sequence[int] | None = None) -> list[Field]:
    """A result's columns as RowDescription gives them (``formats``: the client's, per
    column, instead of the result's own)."""
    return [
        Field(
            result.fname(i) or b"",
            result.ftable(i),
            result.ftablecol(i),
            result.ftype(i),
            result.fsize(i),
            result.fmod(i),
            formats[i] if formats is not None else result.fformat(i),
        )
        for i in range(result.nfields)
    ]


def result_formats(codes: t.Sequence[int], count: int) -> list[int]:
    """The client's format per result column (Bind's codes: none, one for all, or one each)."""
    if not codes:
        return [0] * count
    if len(codes) == 1:
        return [codes[0]] * count
    if len(codes) != count:
        raise psycopg.ProgrammingError(
            f"bind message has {len(codes)} result formats but query has {count} columns"
        )
    return list(codes)


class Transcoder:
    """Rows the backend sent in text, for a client that asked for some columns in binary
    (libpq asks for one format for all): each such value is read with psycopg's loader and
    written with its binary dumper, which write PostgreSQL's binary format."""

    def __init__(
        self, conn: psycopg.Connection[t.Any], result: pq.abc.PGresult, formats: t.Sequence[int]
    ) -> None:
        self.binary: list[tuple[int, Callable[[bytes], t.Any], Callable[[t.Any], t.Any]]] = []
        adapters = conn.adapters
        for i, code in enumerate(formats):
            if code != 1:
                continue
            oid = result.ftype(i)
            loader = adapters.get_loader(oid, Format.TEXT)
            try:
                dumper = adapters.get_dumper_by_oid(oid, Format.BINARY)
            except psycopg.ProgrammingError:
                dumper = None
            if loader is None or dumper is None:
                raise psycopg.NotSupportedError(
                    f"column {i + 1} (type OID {oid}) was asked for in binary among text "
                    "columns; ask for one format for every column"
                )
            self.binary.append((i, loader(oid, conn).load, dumper(object, conn).dump))

    def row(self, values: list[bytes | None]) -> list[bytes | None]:
        for i, load, dump in self.binary:
            value = values[i]
            if value is not None:
                values[i] = bytes(dump(load(value)))
        return values


class BackendRefused(Exception):
    """The backend refused a statement the server asked it about: ``message`` is its
    ErrorResponse, for the client."""

    def __init__(self, message: bytes) -> None:
        super().__init__("the backend refused the statement")
        self.message = message


def wait_readable(pgconn: pq.abc.PGconn) -> None:
    wait_ready(pgconn.socket, select.POLLIN)


def wait_writable(pgconn: pq.abc.PGconn) -> None:
    wait_ready(pgconn.socket, select.POLLOUT)


def wait_ready(fd: int, event: int, timeout: float | None = None) -> None:
    """Until ``fd`` is ready for ``event`` (or ``timeout`` seconds pass); poll, not select:
    a server with hundreds of sessions has descriptors past select's 1024."""
    poller = select.poll()
    poller.register(fd, event | select.POLLERR | select.POLLHUP)
    poller.poll(None if timeout is None else timeout * 1000)


def wait_result(pgconn: pq.abc.PGconn) -> pq.abc.PGresult | None:
    """The next result, waiting for it off the GIL."""
    while pgconn.is_busy():
        wait_readable(pgconn)
        pgconn.consume_input()
    return pgconn.get_result()


def flush(pgconn: pq.abc.PGconn) -> None:
    while pgconn.flush():
        wait_writable(pgconn)


def send_rows(result: pq.abc.PGresult, out: Out, transcoder: Transcoder | None = None) -> None:
    """The result's rows as DataRow messages."""
    ncols = result.nfields
    get = result.get_value
    data_row = protocol.data_row
    for r in range(result.ntuples):
        values = [get(r, c) for c in range(ncols)]
        if transcoder is not None:
            values = transcoder.row(values)
        out(data_row(values))


class Tag:
    """A statement's command tag across the results libpq gives in chunked mode: the chunk
    that arrived with the CommandComplete carries it, the zero-row result ending the
    statement does not."""

    __slots__ = ("_tag",)

    def __init__(self) -> None:
        self._tag = b""

    def seen(self, result: pq.abc.PGresult) -> bool:
        """Note the result's tag; True when the statement's rows are over."""
        found = result.command_status
        if found:
            self._tag = found
        return result.status == ExecStatus.TUPLES_OK

    def take(self) -> bytes:
        tag, self._tag = self._tag, b""
        return tag
