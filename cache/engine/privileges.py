"""Who may read what, as the backend decides: a cached answer is given to a session only when
its role may SELECT every relation the statement names and every base table it reads, none of
them under row-level security; otherwise the whole statement goes to the backend on the
session's own connection, which answers as PostgreSQL does (42501 for a role without the
privilege, the rows its policies allow under row-level security).

Table privileges only: a role that may read some columns of a table but not the table gets
the backend's answer, never a local one (stricter is safe). Group roles count as the backend
counts them (``has_table_privilege``, through inheritance). What a role may read is asked of
the backend once for all the relations it has asked about and kept ``seconds``
(`PRIVILEGE_SECONDS` by default): a GRANT or REVOKE takes effect on local answers within that
delay. While the backend is unreachable, the last answer holds (local answers then go only
where the role could read when last asked).
"""

from __future__ import annotations

import getpass
import os
import threading
import time
import typing as t
from collections.abc import Iterable

import psycopg

from cache.backend.pool import pooled

PRIVILEGE_SECONDS = 1.0  # how long what a role may read is taken as known

_READABLE = (
    "SELECT n, coalesce((SELECT has_table_privilege(%s, c.oid, 'SELECT') "
    "AND NOT c.relrowsecurity FROM pg_catalog.pg_class c WHERE c.oid = to_regclass(n)), false) "
    "FROM unnest(%s::text[]) AS n"
)


def login_role(dsn: str) -> str:
    """The role a connection to ``dsn`` logs in as (libpq's default: PGUSER, else the
    operating system's user)."""
    try:
        user = psycopg.conninfo.conninfo_to_dict(dsn).get("user")
    except psycopg.ProgrammingError:
        user = None
    return str(user or os.environ.get("PGUSER") or getpass.getuser())


class ReadPrivileges:
    """What each role may read locally (see the module); shared by an engine's sessions."""

    def __init__(self, backend: str, seconds: float = PRIVILEGE_SECONDS) -> None:
        self.backend = backend
        self.seconds = seconds
        self._lock = threading.Lock()
        # role -> (monotonic time the answer holds until, relation -> readable)
        self._known: dict[str, tuple[float, dict[str, bool]]] = {}

    def knows(self, role: str) -> bool:
        """Whether the backend was asked what ``role`` may read (by this process)."""
        return role in self._known

    def holds_until(
        self, role: str, relations: Iterable[str], last_known: bool = False
    ) -> float | None:
        """Until when (`time.monotonic`) ``role`` may read all ``relations`` locally; None:
        it may not (the backend answers). ``last_known``: the last answer, however old (the
        backend is unreachable)."""
        names = relations if isinstance(relations, frozenset) else frozenset(relations)
        found = self._answer(role, names, last_known)
        if found is not False or last_known:
            return found or None
        with self._lock:
            found = self._answer(role, names)  # (another session may have asked meanwhile)
            if found is not False:
                return found
            known = self._known.get(role)
            now = time.monotonic()
            asked = names | (known[1].keys() if known is not None else frozenset())
            try:
                with pooled(self.backend) as conn:
                    rows = conn.execute(_READABLE, [role, sorted(asked)]).fetchall()
            except psycopg.Error:
                return None  # (no such role, say: the backend decides, on its own)
            until = now + self.seconds
            readable = {str(n): bool(r) for n, r in rows}
            self._known[role] = (until, readable)
        return until if all(readable.get(n, False) for n in names) else None

    def holds_until_at_hand(
        self, role: str, relations: Iterable[str]
    ) -> float | t.Literal[False] | None:
        """`holds_until` from what is known; False: the backend must be asked."""
        names = relations if isinstance(relations, frozenset) else frozenset(relations)
        return self._answer(role, names)

    def _answer(
        self, role: str, names: frozenset[str], last_known: bool = False
    ) -> float | t.Literal[False] | None:
        """`holds_until` from what is known (as old as it may be with ``last_known``);
        False: the backend must be asked."""
        known = self._known.get(role)
        if known is None or not (last_known or time.monotonic() < known[0]):
            return False
        until, readable = known
        if not names.issubset(readable.keys()):
            return False
        return until if all(readable[n] for n in names) else None


__all__ = ["PRIVILEGE_SECONDS", "ReadPrivileges", "login_role"]
