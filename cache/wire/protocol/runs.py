"""A prepared statement's run in one piece (`cache.wire.protocol`): `execution` recognizes the
messages a client sends to run it once (Bind, Describe of its portal or not, Execute, Sync), and
its `RunShape` reads the next runs that differ only in their parameter values by comparing
bytes instead of parsing messages."""

from __future__ import annotations

import struct
import typing as t

from cache.wire.protocol.client_messages import Bind, ProtocolViolation, parse_message
from cache.wire.protocol.server_messages import cstring, message

_INT32 = struct.Struct("!i")
_INT16 = struct.Struct("!h")


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
        bind = parse_message(b"B", data[5:end])
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


_RUN_UNNAMED = _run_of(b"")
_DESCRIBE_UNNAMED = _describe_of(b"")
