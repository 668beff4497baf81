"""Who may read what: a cached answer only for a role the backend would let read every table the
statement touches. A role without SELECT gets PostgreSQL's own error (42501), never the cached
rows; group roles count as the backend counts them; GRANT and REVOKE take effect (here at once:
the tests ask the backend at every statement, `privilege_seconds=0`); tables under row-level
security are never answered locally; SET ROLE changes whose privileges count. Through the
server (several roles, one cache), with psycopg and with the DB-API module."""

from __future__ import annotations

import typing as t
from collections.abc import Iterator

import psycopg
import pytest

import cache
from cache.engine.link.effects import effects_of
from cache.store.counters import Counter
from tests.answers import typed
from tests.serving import Served, serving

ROLES = ("priv_reader", "priv_none", "priv_group", "priv_member")
POINT = "SELECT authorid, name FROM authors WHERE authorid = %s CURRENCY BOUND 10 MIN"
PLAIN = "SELECT authorid, name FROM authors WHERE authorid = %s"
BOOKS = (
    "SELECT isbn, title, price FROM books WHERE authorid = 1 ORDER BY isbn CURRENCY BOUND 10 MIN"
)


@pytest.fixture(scope="module")
def served(bookstore_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with psycopg.connect(bookstore_dsn, autocommit=True) as conn:
        for role in ROLES:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone():
                conn.execute(f"DROP OWNED BY {role} CASCADE")
                conn.execute(f"DROP ROLE {role}")
        conn.execute("CREATE ROLE priv_reader LOGIN")
        conn.execute("CREATE ROLE priv_none LOGIN")
        conn.execute("CREATE ROLE priv_group NOLOGIN")
        conn.execute("CREATE ROLE priv_member LOGIN IN ROLE priv_group")
        conn.execute("GRANT SELECT ON authors, books TO priv_reader, priv_group")
    with serving(
        bookstore_dsn,
        tmp_path_factory.mktemp("privileges") / "cache.duckdb",
        (1, 2),
        privilege_seconds=0.0,
    ) as found:
        yield found


def as_role(served: Served, role: str) -> psycopg.Connection[t.Any]:
    return psycopg.connect(served.dsn.replace("user=postgres", f"user={role}"), autocommit=True)


def direct(served: Served, role: str) -> psycopg.Connection[t.Any]:
    return psycopg.connect(served.backend.replace("postgres@", f"{role}@"), autocommit=True)


def hits(served: Served) -> int:
    return int(served.engine.counters()[Counter.HITS])


def refused(
    conn: psycopg.Connection[t.Any], sql: str, params: t.Sequence[t.Any] | None = None
) -> tuple[str | None, str]:
    with pytest.raises(psycopg.Error) as raised:
        conn.execute(sql, params, prepare=True)
    return raised.value.sqlstate, str(raised.value)


def test_a_role_without_select_gets_postgresqls_error_not_the_cached_rows(served: Served) -> None:
    with as_role(served, "priv_reader") as reader, direct(served, "priv_reader") as pg:
        before = hits(served)
        assert typed(reader.execute(POINT, [1]).fetchall()) == typed(
            pg.execute(PLAIN, [1]).fetchall()
        )
        assert hits(served) > before  # (the cache can answer it: the rows are there)
    with as_role(served, "priv_none") as nobody, direct(served, "priv_none") as pg:
        before = hits(served)
        for _ in range(6):  # a prepared statement's every run, and its lane's
            assert refused(nobody, POINT, [1]) == refused(pg, PLAIN, [1])
            assert refused(nobody, BOOKS)[0] == "42501"
        assert hits(served) == before
        assert refused(nobody, POINT, [1])[0] == "42501"


def test_a_group_roles_privilege_counts(served: Served) -> None:
    with as_role(served, "priv_member") as member, direct(served, "priv_member") as pg:
        before = hits(served)
        assert typed(member.execute(POINT, [2]).fetchall()) == typed(
            pg.execute(PLAIN, [2]).fetchall()
        )
        assert hits(served) > before


def test_revoke_and_grant_take_effect(served: Served, bookstore_dsn: str) -> None:
    with (
        as_role(served, "priv_reader") as reader,
        psycopg.connect(bookstore_dsn, autocommit=True) as admin,
    ):
        for _ in range(6):  # a lane for it
            assert reader.execute(POINT, [1], prepare=True).fetchall()
        admin.execute("REVOKE SELECT ON authors FROM priv_reader")
        try:
            before = hits(served)
            assert refused(reader, POINT, [1])[0] == "42501"
            assert hits(served) == before
        finally:
            admin.execute("GRANT SELECT ON authors TO priv_reader")
        before = hits(served)
        assert reader.execute(POINT, [1], prepare=True).fetchall()
        assert hits(served) > before


def test_row_level_security_is_never_answered_locally(served: Served, bookstore_dsn: str) -> None:
    with (
        psycopg.connect(bookstore_dsn, autocommit=True) as admin,
        direct(served, "priv_reader") as reader,
    ):
        admin.execute("ALTER TABLE authors ENABLE ROW LEVEL SECURITY")
        admin.execute("CREATE POLICY only_two ON authors TO priv_reader USING (authorid = 2)")
        try:
            for role, pg in (("priv_reader", reader), ("postgres", admin)):
                with as_role(served, role) as conn:
                    before = hits(served)
                    for key in (1, 2):
                        assert typed(conn.execute(POINT, [key]).fetchall()) == typed(
                            pg.execute(PLAIN, [key]).fetchall()
                        )
                    assert hits(served) == before
        finally:
            admin.execute("DROP POLICY only_two ON authors")
            admin.execute("ALTER TABLE authors DISABLE ROW LEVEL SECURITY")


def test_set_role_changes_whose_privileges_count(served: Served) -> None:
    with as_role(served, "postgres") as conn:
        assert conn.execute(POINT, [1]).fetchall()
        conn.execute("SET ROLE priv_none")
        assert refused(conn, POINT, [1])[0] == "42501"
        conn.execute("RESET ROLE")
        before = hits(served)
        assert conn.execute(POINT, [1]).fetchall()
        assert hits(served) > before


def test_cache_connect_through_the_server_is_checked_alike(served: Served) -> None:
    backend = served.backend.replace("postgres@", "priv_none@")
    with cache.connect(
        backend, server=f"{served.host}:{served.port}", currency_bound="10 min"
    ) as conn:
        with pytest.raises(cache.ProgrammingError) as raised:
            conn.cursor().execute(PLAIN, [1])
        assert getattr(raised.value, "sqlstate", None) == "42501"


@pytest.mark.parametrize(
    "sql, changes",
    [
        ("SET ROLE priv_none", True),
        ("reset role", True),
        ("RESET ALL", True),
        ("SET SESSION AUTHORIZATION priv_none", True),
        ("DISCARD ALL", True),
        ("SELECT set_config('role', 'priv_none', false)", True),
        ("SELECT 1", False),
        ("UPDATE books SET price = 1", False),
    ],
)
def test_statements_that_may_change_the_role_are_recognized(sql: str, changes: bool) -> None:
    assert effects_of(sql).may_change_role is changes
