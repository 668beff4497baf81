"""Case mapping under a ctype that is not C, proven rather than assumed: on a database whose
LC_CTYPE is glibc's C.utf8, the cache compares PostgreSQL's upper and lower of every character
with DuckDB's when it reads the catalog (cache/backend/reflect.py), and the allowlist's
entries for that ctype answer upper, lower and ILIKE locally, with PostgreSQL's values, over
the edge table of tests/optimizer/test_allowlist.py and non-ASCII text of every kind."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.reflect import unicode_case
from optimizer.postgres.allowlist import ENTRIES, Entry
from tests.optimizer.test_allowlist import (
    EDGE,
    EXTREMES,
    ROWS,
    check,
    edge_connection,
    entry_uses,
    statement,
)

DATABASE = "t_unicode_case"
UNICODE_ENTRIES = [e for e in ENTRIES if e.ctype != "C"]


@pytest.fixture(scope="module")
def backend(pg_cluster: EmbeddedPostgres) -> str:
    admin = pg_cluster.ensure_database("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DATABASE)))
        conn.execute(
            sql.SQL(
                "CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' "
                "LC_CTYPE 'C.utf8'"
            ).format(sql.Identifier(DATABASE))
        )
    dsn = pg_cluster.ensure_database(DATABASE)
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute(EDGE)
        setup.execute(ROWS)
        setup.execute(
            "INSERT INTO edge (id, c, v, t) VALUES "
            "(9, 'ßẞǆ', 'İıΣσς', 'Straße ǅemal ΣΊΣΥΦΟΣ ꞵ'), (10, 'äÖ', 'ÉéÈ', 'SS ß ẞ ss')"
        )
    return dsn


@pytest.fixture(scope="module")
def conn(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[cache.Connection]:
    path = tmp_path_factory.mktemp("unicode-case") / "cache.duckdb"
    with edge_connection(backend, path) as conn:
        yield conn


def test_the_mapping_is_proven_over_every_character(backend: str) -> None:
    """This machine's C.utf8 (glibc) maps each character as DuckDB does but for upper('ß'),
    which PostgreSQL keeps; the proof says so rather than the cache assuming it."""
    with psycopg.connect(backend, autocommit=True) as pg:
        assert pg.execute(
            "SELECT datctype FROM pg_database WHERE datname = %s", (DATABASE,)
        ).fetchone() == ("C.utf8",)
        assert pg.execute("SELECT upper('ß'), lower('ẞ')").fetchone() == ("ß", "ß")
        assert unicode_case(pg) == "sharp_s"


@pytest.mark.parametrize("entry", UNICODE_ENTRIES, ids=[e.name for e in UNICODE_ENTRIES])
def test_every_unicode_entry_is_proven_against_postgres(
    conn: cache.Connection, backend: str, entry: Entry
) -> None:
    assert entry.proofs, f"{entry.name} has no proof"
    assert "sharp_s" in entry.ctype.split(), entry.ctype  # (this machine's mapping)
    for proof in entry.proofs:
        sql_text = statement(proof)
        assert entry.name in entry_uses(conn, sql_text), f"{proof} does not use {entry.name}"
        check(conn, backend, sql_text, local=False)
        check(conn, backend, statement(proof, f"e.id NOT IN {EXTREMES}"))


def test_what_the_proof_does_not_cover_stays_at_the_backend(
    conn: cache.Connection, backend: str
) -> None:
    """initcap folds case by rules of its own, and ~* a non-ASCII pattern's characters by
    towlower and towupper: PostgreSQL answers them."""
    for expression in ("e.t ~* 'straße'", "initcap(e.t)"):
        assert check(conn, backend, statement(expression), local=False) == "remote", expression


def test_an_ascii_pattern_matches_case_insensitively_as_postgres(
    conn: cache.Connection, backend: str
) -> None:
    """~* of an ASCII pattern adds the other ASCII case to each letter and folds no character
    of the value: the Kelvin sign, the long s and the dotted capital I match no k, s or i."""
    with psycopg.connect(backend, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS folds")
        setup.execute("CREATE TABLE folds (id integer PRIMARY KEY, t text)")
        setup.execute(
            "INSERT INTO folds VALUES (1, E'\\u212A'), (2, E'\\u017F'), (3, E'\\u0130'), "
            "(4, 'kSi'), (5, '_'), "
            "(6, NULL), (7, 'ǅ ß Straße')"
        )
    conn.cursor().execute("CREATE CACHED VIEW folds_copy AS SELECT * FROM folds")
    conn.admin.refresh("folds_copy")
    sql = (
        "SELECT f.id, f.t ~* 'k', f.t ~* '^S', f.t ~* 'I$', f.t !~* '[a-k]', f.t ~* 'STRA' "
        "FROM folds f ORDER BY f.id"
    )
    assert check(conn, backend, sql) == "local"
    assert check(conn, backend, "SELECT f.id, f.t ~* '[A-z]' FROM folds f", local=False) == (
        "remote"
    )


def test_a_collation_of_its_own_maps_case_at_the_backend(
    conn: cache.Connection, backend: str
) -> None:
    """A value under a collation of its own (a column's, a COLLATE clause's) has its case
    mapped by that collation's ctype, not the database's: PostgreSQL answers (found by an
    independent review: under C.utf8, a COLLATE "C" column's upper is ASCII's)."""
    with psycopg.connect(backend, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS coll")
        setup.execute('CREATE TABLE coll (id integer PRIMARY KEY, tc text COLLATE "C", t text)')
        setup.execute("INSERT INTO coll VALUES (1, 'éxß ΟΔΟΣ', 'éxß ΟΔΟΣ'), (2, NULL, 'abc')")
    conn.cursor().execute("CREATE CACHED VIEW coll_copy AS SELECT * FROM coll")
    conn.admin.refresh("coll_copy")
    for statement_text in (
        "SELECT c.id, upper(c.tc) FROM coll c",
        "SELECT c.id, lower(c.tc) FROM coll c",
        "SELECT c.id, c.tc ILIKE 'É%' FROM coll c",
        'SELECT c.id, upper(c.t COLLATE "C") FROM coll c',
        "SELECT c.id, upper(coalesce(c.tc, c.t)) FROM coll c",
    ):
        remote = check(conn, backend, statement_text, local=False)
        assert remote == "remote", statement_text
    assert check(conn, backend, "SELECT c.id, upper(c.t), c.t ILIKE 'É%' FROM coll c") == "local"
