"""What the backend says of its roles, for a server's logins: a role's password verifier (by
the operator's query) and its membership in a group role. Errors leave translated
(`sql_ext.errors`): the caller refuses the login with them."""

from __future__ import annotations

import psycopg

from cache.backend.pool import pooled
from sql_ext.errors import translate


def role_secret(backend: str, query: str, role: str) -> str | None:
    """The verifier ``query`` (of one parameter, the role) returns for ``role``; None: no
    row, or NULL."""
    try:
        with pooled(backend) as conn:
            row = conn.execute(query, [role]).fetchone()  # type: ignore[arg-type]
    except psycopg.Error as exc:
        raise translate(exc) from exc
    return None if row is None or row[0] is None else str(row[0])


def is_member(backend: str, role: str, group: str) -> bool:
    """Whether ``role`` is a member of ``group``, as the backend says."""
    try:
        with pooled(backend) as conn:
            row = conn.execute(
                "SELECT pg_has_role(r.oid, g.oid, 'MEMBER') FROM pg_roles r, "
                "pg_roles g WHERE r.rolname = %s AND g.rolname = %s",
                [role, group],
            ).fetchone()
    except psycopg.Error as exc:
        raise translate(exc) from exc
    return bool(row and row[0])


__all__ = ["is_member", "role_secret"]
