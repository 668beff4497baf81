"""The protocol state of one client connection after startup, as PostgreSQL keeps it
(``PostgresMain`` in src/backend/tcop/postgres.c, and COPY's in copyfromparse.c): which of the
client's messages are answered, which are read and dropped, and whether the server may still
send a ReadyForQuery. Every transition is here, named; the conversation asks what to do with
each message (`ProtocolState.receive`) and tells what it sent (`error`, `fatal`, `ready`,
`copy_in`, `copy_over`). Fed messages and events alone, it is tested without a session or a
socket, as h11 keeps HTTP's in ``h11/_state.py``.

    IDLE --Query--> SIMPLE --ReadyForQuery--> IDLE
    IDLE --Parse, Bind, Describe, Execute, Close, Flush--> EXTENDED
    EXTENDED --Sync, then ReadyForQuery--> IDLE
    EXTENDED --ErrorResponse--> FAILED (all but Sync and Terminate dropped)
    FAILED --Sync, then ReadyForQuery--> IDLE
    SIMPLE or EXTENDED --CopyInResponse--> COPY_IN --CopyDone, CopyFail--> back
    any --Terminate, or a FATAL ErrorResponse--> ENDED (nothing more is sent)
"""

from __future__ import annotations

import enum

from cache.wire import protocol


class Phase(enum.Enum):
    IDLE = "idle"  # ReadyForQuery was sent: a cycle may begin
    SIMPLE = "simple"  # a Query message is being answered
    EXTENDED = "extended"  # extended-protocol messages since the last Sync
    FAILED = "failed"  # one of them failed: what follows is dropped until Sync
    COPY_IN = "copy in"  # COPY FROM STDIN: the client's data until CopyDone or CopyFail
    ENDED = "ended"  # Terminate came, or a FATAL error was sent: the session ends


class Step(enum.Enum):
    """What the conversation does with a message (`ProtocolState.receive`)."""

    ANSWER = "answer"  # answer it
    IGNORE = "ignore"  # read and drop it
    SYNC = "sync"  # answer what the cycle queued, then ReadyForQuery
    COPY = "copy"  # the data of the COPY under way, or its end
    END = "end"  # the client ends the session


class StateError(Exception):
    """A transition the protocol does not have (a bug of the conversation's, not the
    client's: a client's message never raises it)."""


_EXTENDED = (
    protocol.Parse,
    protocol.Bind,
    protocol.Describe,
    protocol.Execute,
    protocol.Close,
    protocol.Flush,
)
_COPY_MESSAGES = (protocol.CopyData, protocol.CopyDone, protocol.CopyFail)


class ProtocolState:
    """The state of one client's conversation (see the module)."""

    def __init__(self) -> None:
        self.phase = Phase.IDLE
        self._before_copy = Phase.IDLE  # where COPY_IN goes back to

    @property
    def ignoring(self) -> bool:
        """Messages are dropped until Sync (an extended cycle failed)."""
        return self.phase is Phase.FAILED

    @property
    def ended(self) -> bool:
        """The session ends: nothing more is sent (after a FATAL error, the client expects
        none)."""
        return self.phase is Phase.ENDED

    # -- the client's messages ----------------------------------------------------------------

    def receive(self, message: protocol.Message) -> Step:
        """What to do with the client's next message, the state moved as PostgreSQL moves
        it."""
        phase = self.phase
        if phase is Phase.ENDED:
            return Step.IGNORE
        if isinstance(message, protocol.Terminate):
            self.phase = Phase.ENDED
            return Step.END
        if phase is Phase.COPY_IN:
            if isinstance(message, _COPY_MESSAGES):
                return Step.COPY
            # (Flush and Sync are dropped during COPY for client libraries' convenience;
            # anything else fails the COPY: the conversation's COPY says so)
            return Step.IGNORE if isinstance(message, protocol.Flush | protocol.Sync) else Step.COPY
        if isinstance(message, protocol.Sync):
            return Step.SYNC  # (a failed cycle drops its queued answers until `ready`)
        if phase is Phase.FAILED:
            return Step.IGNORE
        if isinstance(message, _COPY_MESSAGES):
            return Step.IGNORE  # (outside COPY: the rest of a COPY that failed, say)
        if isinstance(message, protocol.Query):
            self.phase = Phase.SIMPLE
        elif isinstance(message, _EXTENDED):
            self.phase = Phase.EXTENDED
        return Step.ANSWER

    def extended(self) -> None:
        """Extended messages taken whole (a run answered at once, Bind to Sync): the cycle
        they begin or go on."""
        if self.phase not in (Phase.IDLE, Phase.EXTENDED):
            raise StateError(f"a run cannot be taken whole in phase {self.phase.value}")
        self.phase = Phase.EXTENDED

    # -- what the server sent -------------------------------------------------------------------

    def error(self) -> None:
        """An ErrorResponse was sent: an extended cycle drops what follows until Sync; a
        Query's ends with its ReadyForQuery; a COPY's data stops."""
        phase = self.phase
        if phase is Phase.COPY_IN:
            phase = self._before_copy
        self.phase = Phase.FAILED if phase in (Phase.EXTENDED, Phase.FAILED) else phase

    def fatal(self) -> None:
        """A FATAL error was sent (or the backend's session ended): the session ends."""
        self.phase = Phase.ENDED

    def copy_in(self) -> None:
        """CopyInResponse was sent: the client's data comes."""
        if self.phase not in (Phase.SIMPLE, Phase.EXTENDED):
            raise StateError(f"COPY FROM STDIN cannot start in phase {self.phase.value}")
        self._before_copy = self.phase
        self.phase = Phase.COPY_IN

    def copy_over(self) -> None:
        """The client's CopyDone or CopyFail came (the backend's answer follows)."""
        if self.phase is Phase.COPY_IN:
            self.phase = self._before_copy

    def ready(self) -> bool:
        """ReadyForQuery may be sent (and then the state is IDLE); False: the session has
        ended, nothing is sent."""
        phase = self.phase
        if phase is Phase.ENDED:
            return False
        if phase is Phase.COPY_IN:
            raise StateError("ReadyForQuery cannot be sent during COPY")
        self.phase = Phase.IDLE
        return True


__all__ = ["Phase", "ProtocolState", "StateError", "Step"]
