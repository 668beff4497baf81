"""What the backend sends, passed on as it came (`cache.wire.protocol`): `AnswerScan` finds the
whole messages of the backend's answer to a run passed through and notes what the server must
know of them (an error, reported settings, the transaction status); `ends_session` tells a
FATAL or PANIC ErrorResponse; `BackendViolation` for bytes that are not messages."""

from __future__ import annotations

import struct

_INT32 = struct.Struct("!i")


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
