"""The server's limits, each refusal PostgreSQL's own ErrorResponse:

- sessions at once, in all and per role (`Admission`): a login past either gets FATAL 53300
  ("sorry, too many clients already", "too many connections for role ...");
- a statement's time (``statement_timeout``): the cache's own work is interrupted when it
  passes (57014, "canceling statement due to statement timeout"; the server looks every
  `TICK_SECONDS`), and
  the backend applies the same timeout to the session's remote statements (its own
  ``statement_timeout``, set when the session's backend connection opens; a session may
  change that one with SET);
- a transaction's idle time (``idle_in_transaction_timeout``): a session idle inside a
  transaction block that long is ended with FATAL 25P03, its transaction rolled back.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from cache.server.auth import LoginRefused


@dataclass(frozen=True)
class Limits:
    max_sessions: int | None = None  # client sessions at once (None: no limit)
    max_sessions_per_role: int | None = None
    statement_timeout: float | None = None  # seconds
    idle_in_transaction_timeout: float | None = None  # seconds

    def backend_settings(self) -> dict[str, str]:
        """The settings a session's backend connection opens with (milliseconds)."""
        if self.statement_timeout is None:
            return {}
        return {"statement_timeout": str(max(1, round(self.statement_timeout * 1000)))}


class Admission:
    """Sessions open, in all and per role, within `Limits`."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}
        self._total = 0

    def admit(self, role: str) -> None:
        """Count a session of ``role`` in, or `LoginRefused` (53300) past a limit."""
        limits = self.limits
        with self._lock:
            if limits.max_sessions is not None and self._total >= limits.max_sessions:
                raise LoginRefused("53300", "sorry, too many clients already")
            held = self._open.get(role, 0)
            if limits.max_sessions_per_role is not None and held >= limits.max_sessions_per_role:
                raise LoginRefused("53300", f'too many connections for role "{role}"')
            self._open[role] = held + 1
            self._total += 1

    def release(self, role: str) -> None:
        with self._lock:
            held = self._open.get(role, 0) - 1
            if held > 0:
                self._open[role] = held
            else:
                self._open.pop(role, None)
            self._total -= 1


TICK_SECONDS = 0.05  # how often the server looks for a statement or a transaction past its time


__all__ = ["TICK_SECONDS", "Admission", "Limits"]
