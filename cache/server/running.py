"""The statement a client's session is running now, and what interrupts it: the client's
cancel (a CancelRequest with the session's key), the statement timeout, a client that went
away. Statements are numbered as they start, so an interrupt meant for one never reaches the
next; the interrupt is repeated while its statement runs, as DuckDB forgets one that comes
before its statement starts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from cache.engine.session import Session

CANCEL_SECONDS = 30.0  # how long a cancel keeps interrupting its statement's DuckDB work
CANCEL_REPEAT = 0.01
BACKEND_CANCEL_REPEAT = 0.2  # a gone client's statement: how often its backend part is cancelled


class Running:
    """One session's running statement (see the module); its methods are called from the
    event loop, the session's worker and a cancel's thread alike."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.busy = False  # a statement runs (number `_serial`)
        self._serial = 0
        self._cancelled = 0  # the statement last cancelled
        self._timed_out = 0  # the statement last interrupted for its time
        self.since = 0.0  # when the statement running now began (`time.monotonic`)

    def start(self) -> None:
        """A statement starts (a cancel before this finds nothing running)."""
        with self._lock:
            self.busy = True
            self._serial += 1
            self.since = time.monotonic()

    def stop(self) -> None:
        with self._lock:
            self.busy = False

    def cancel(self, session: Session, gone: Callable[[], bool]) -> None:
        """Cancel the statement running now (none: nothing happens, as PostgreSQL ignores a
        cancel that arrives between statements); ``gone``: whether its client went away."""
        with self._lock:
            if not self.busy or self._cancelled == self._serial:
                return  # nothing runs, or its cancel is under way
            serial = self._cancelled = self._serial
        threading.Thread(
            target=self._keep_interrupting, args=(session, serial, gone), daemon=True
        ).start()

    def past(self, now: float, timeout: float) -> bool:
        """Whether the statement running now has run past ``timeout`` seconds and is not
        interrupted for its time yet (then it is, from now: `time_out`)."""
        with self._lock:
            if not self.busy or now - self.since <= timeout or self._timed_out == self._serial:
                return False
            self._timed_out = self._serial
            return True

    def time_out(self, session: Session) -> bool:
        """Interrupt the cache's own work of the statement running now (the backend times
        its own part out); False: none runs."""
        with self._lock:
            if not self.busy:
                return False
            serial = self._serial
        threading.Thread(
            target=self._keep_interrupting, args=(session, serial, None), daemon=True
        ).start()
        return True

    def _keep_interrupting(
        self, session: Session, serial: int, gone: Callable[[], bool] | None
    ) -> None:
        """Cancel the session's statement (its backend part by a cancel request, unless
        ``gone`` is None: a timeout), and repeat the local interrupt while it runs: DuckDB
        forgets one that comes before its statement starts (the cancel may arrive while the
        statement is still parsed or planned). So does the backend: when the client is gone,
        the cancel request is repeated too (spaced: each is a connection to the backend), as
        no later statement of the client's can be the one it reaches; a client's own cancel
        is sent once, as PostgreSQL takes it."""
        if gone is not None:
            session.cancel()
        else:
            session.interrupt_local()
        now = time.monotonic()
        deadline, again = now + CANCEL_SECONDS, now + BACKEND_CANCEL_REPEAT
        while time.monotonic() < deadline:
            time.sleep(CANCEL_REPEAT)
            with self._lock:
                if not self.busy or self._serial != serial:
                    return
                session.interrupt_local()
                left = gone is not None and gone()
            if left and time.monotonic() >= again:
                session.cancel_backend()
                again = time.monotonic() + BACKEND_CANCEL_REPEAT


__all__ = ["Running"]
