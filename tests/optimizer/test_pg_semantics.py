"""PostgreSQL's semantics in local answers: every rewrite of the local statement -
char(n) in every position, numeric averages and divisions at several scales, exact numbers,
extract - checked against PostgreSQL's answer to the same query, values *and* Python types
and `cursor.description`'s type codes; and what cannot be made exactly equal goes remote."""

from __future__ import annotations

import decimal
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from tests.answers import assert_same_answer

SETUP = (
    "DROP TABLE IF EXISTS items",
    """CREATE TABLE items (
        id integer PRIMARY KEY, code char(5), flag char(1), label varchar(20), note text,
        small smallint, big bigint, price numeric(12,2), rate numeric(10,4),
        ratio double precision, r4 real, made date, at timestamp)""",
    """INSERT INTO items VALUES
        (1, 'AB', 'A', 'AB', 'ab', 1, 10, 10.50, 0.1250, 0.5, 0.25, '2024-01-31',
         '2024-01-31 10:20:30.5'),
        (2, 'AB ', 'B', 'AB  ', 'AB ', -7, -3000000000, 3.33, 2.0000, 1.5, 1.5, '2023-02-28',
         '2023-02-28 00:00:00'),
        (3, 'ABCDE', 'A', 'abcde', 'x y', 2, 7, 99999.99, 0.0001, -2.25, 3.0, '1999-12-31',
         '1999-12-31 23:59:59'),
        (4, 'x', NULL, 'x', NULL, 3, 5, -0.01, 1.3333, 10, 0.5, '2000-02-29',
         '2000-02-29 12:00:00'),
        (5, '', 'C', '', '', 4, 6, 0.00, 9.9999, 0, 2, '2024-06-01', '2024-06-01 06:06:06'),
        (6, NULL, 'A', NULL, 'none', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
        (7, 'Q R', 'B', 'Q R ', ' lead', 5, 1, 7.77, 5.5000, 2.5, 0.75, '2010-10-10',
         '2010-10-10 10:10:10')""",
)

LOCAL, REMOTE, ANY = "local", "remote", "any"

# (statement without its clause, where the cache answers it)
CASES: list[tuple[str, str]] = [
    (
        "SELECT i.id, i.code, i.label, i.note, i.small, i.big, i.price, i.rate, i.ratio, i.r4, "
        "i.made, i.at FROM items i",
        LOCAL,
    ),
    # char(n) compared: padding ignored, with literals, parameters-free varchar/text partners
    ("SELECT i.id FROM items i WHERE i.code = 'AB'", LOCAL),
    ("SELECT i.id FROM items i WHERE i.code = 'AB   '", LOCAL),
    ("SELECT i.id FROM items i WHERE i.code <> 'AB'", LOCAL),
    ("SELECT i.id FROM items i WHERE i.code IN ('AB ', 'x', 'Q R  ')", LOCAL),
    ("SELECT i.id FROM items i WHERE i.code BETWEEN 'AB ' AND 'ABZ'", LOCAL),
    ("SELECT i.id FROM items i WHERE i.code < 'AB '", LOCAL),
    ("SELECT i.id FROM items i WHERE i.code = ''", LOCAL),
    ("SELECT i.id FROM items i WHERE i.code = i.label", LOCAL),  # varchar read as char
    ("SELECT i.id FROM items i WHERE i.code = i.flag", LOCAL),
    ("SELECT i.id FROM items i WHERE i.label = 'AB'", LOCAL),  # varchar keeps its blanks
    ("SELECT i.id FROM items i WHERE i.code IS NULL", LOCAL),
    ("SELECT i.id, CASE i.code WHEN 'AB' THEN 1 ELSE 0 END FROM items i", LOCAL),
    ("SELECT i.id, nullif(i.code, 'AB ') FROM items i", LOCAL),
    # reals as PostgreSQL prints them (and psycopg reads them): a decimal exactly halfway to
    # the next real is not taken (found by the differential oracle, seed 21)
    (
        "SELECT i.id, (i.small * 0 + 33566752)::real, (i.small * 0 + 50816768)::real, "
        "(i.price * 1000)::real FROM items i",
        LOCAL,
    ),
    # NULLIF's value is its first operand as it is: a varchar compared with char(n) keeps the
    # blanks the comparison ignores (found by the differential oracle, seed 12)
    ("SELECT i.id, octet_length(nullif(i.label, i.flag)) FROM items i", REMOTE),
    ("SELECT i.id, nullif(i.label, i.flag), nullif(i.label, i.flag) || '|' FROM items i", REMOTE),
    ("SELECT i.id, nullif(i.code, i.label) FROM items i", ANY),
    # patterns see the padding
    ("SELECT i.id FROM items i WHERE i.code LIKE 'AB'", LOCAL),
    ("SELECT i.id FROM items i WHERE i.code LIKE 'AB%'", LOCAL),
    ("SELECT i.id FROM items i WHERE i.code LIKE '% '", LOCAL),
    ("SELECT i.id FROM items i WHERE i.code ILIKE 'ab___'", LOCAL),
    ("SELECT i.id FROM items i WHERE i.code ~ ' $'", LOCAL),
    ("SELECT i.id FROM items i WHERE i.code NOT LIKE 'A%'", LOCAL),
    ("SELECT i.id FROM items i WHERE i.label LIKE 'AB%'", LOCAL),
    # functions read char(n) as text, printing functions with its padding
    ("SELECT i.id, length(i.code), upper(i.code), lower(i.flag) FROM items i", LOCAL),
    ("SELECT i.id, i.code || '!', '<' || i.flag || '>' FROM items i", LOCAL),
    ("SELECT i.id, substring(i.code from 2 for 3), replace(i.code, 'B', 'b') FROM items i", LOCAL),
    (
        "SELECT i.id, concat(i.code, '|', i.flag), concat_ws('-', i.code, i.label) FROM items i",
        LOCAL,
    ),
    ("SELECT i.id, octet_length(i.code) FROM items i", LOCAL),  # UTF-8 bytes: the server's
    ("SELECT i.id, octet_length(i.label), i.note::bytea FROM items i", REMOTE),
    ("SELECT i.id, position('B' in i.code), trim(i.code) FROM items i", LOCAL),
    # outputs: plain char(n) is printed padded, as PostgreSQL does
    ("SELECT i.id, i.code, i.flag FROM items i ORDER BY i.id", LOCAL),
    (
        "SELECT i.id, coalesce(i.code, 'none'), CASE WHEN i.id > 3 THEN i.code END FROM items i",
        LOCAL,
    ),
    ("SELECT min(i.code), max(i.code), count(DISTINCT i.code) FROM items i", LOCAL),
    ("SELECT i.code, count(*) FROM items i GROUP BY i.code", LOCAL),
    ("SELECT i.code FROM items i ORDER BY i.code, i.id", LOCAL),
    ("SELECT DISTINCT i.code FROM items i", LOCAL),
    ("SELECT t.c FROM (SELECT i.code AS c FROM items i WHERE i.id < 4) t", LOCAL),
    ("SELECT i.code FROM items i UNION SELECT i.label FROM items i", ANY),  # cost decides
    # numerics: exact averages and divisions with PostgreSQL's result scale
    ("SELECT avg(i.price), avg(i.rate), avg(i.small), avg(i.big) FROM items i", LOCAL),
    ("SELECT i.flag, avg(i.price) FROM items i GROUP BY i.flag", LOCAL),
    ("SELECT sum(i.price) / count(*), sum(i.rate) / 3 FROM items i", LOCAL),
    (
        "SELECT i.id, i.price / i.rate, i.price / 7, i.small / 2 FROM items i WHERE i.rate <> 0",
        LOCAL,
    ),
    ("SELECT i.id, i.price * i.rate, i.price - i.rate FROM items i", LOCAL),
    ("SELECT i.id, i.small::numeric, i.price::numeric, '1.50'::numeric FROM items i", LOCAL),
    ("SELECT i.id, i.price * 1e2, 2.5e-3 * i.rate FROM items i", LOCAL),
    ("SELECT sum(i.small), sum(i.big), sum(i.price) FROM items i", LOCAL),
    ("SELECT i.id, i.ratio / 4, i.r4 * 2 FROM items i", LOCAL),
    ("SELECT i.id, round(i.price, 1), round(i.rate) FROM items i", LOCAL),
    # extract is numeric in PostgreSQL
    ("SELECT i.id, extract(year FROM i.made), extract(month FROM i.at) FROM items i", LOCAL),
    ("SELECT extract(year FROM i.made) AS y, sum(i.price) FROM items i GROUP BY y", LOCAL),
    ("SELECT i.id, date_part('day', i.made), date_part('year', i.at) / 2 FROM items i", LOCAL),
    ("SELECT i.id, date_part('second', i.at) FROM items i", REMOTE),
    # what the cache cannot make exactly equal goes remote
    ("SELECT sum(i.ratio), avg(i.r4) FROM items i", REMOTE),
    ("SELECT i.id, round(i.ratio) FROM items i", LOCAL),  # rint: half to even (round_even)
    ("SELECT i.id, extract(second FROM i.at) FROM items i", REMOTE),
    ("SELECT i.id, i.label::char(3) FROM items i", REMOTE),
    ("SELECT i.id, substring(i.code from 0 for 2) FROM items i", LOCAL),  # start before 1
    ("SELECT i.id, i.ratio::numeric(10,2) FROM items i", REMOTE),
    ("SELECT i.id FROM items i WHERE i.price > 0.2 * (SELECT avg(j.price) FROM items j)", REMOTE),
]


@pytest.fixture(scope="module")
def backend(backend_dsn: str) -> str:
    with psycopg.connect(backend_dsn, autocommit=True) as setup:
        for statement in SETUP:
            setup.execute(statement)
    return backend_dsn


@pytest.fixture(scope="module")
def conn(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[cache.Connection]:
    path = tmp_path_factory.mktemp("semantics") / "cache.duckdb"
    with cache.connect(backend=backend, cache_path=path, admit_on_miss=False) as conn:
        conn.cursor().execute("CREATE CACHED VIEW itemscopy AS SELECT * FROM items")
        conn.admin.refresh("itemscopy")
        yield conn


@pytest.mark.parametrize(("sql", "route"), CASES, ids=[sql for sql, _ in CASES])
def test_local_answers_are_postgres_answers(
    conn: cache.Connection, backend: str, sql: str, route: str
) -> None:
    answer = assert_same_answer(conn, backend, f"{sql} CURRENCY BOUND 10 MIN", sql)
    assert route in (answer.route, ANY), answer.reason


def test_parameters_compared_with_char_ignore_their_padding(
    conn: cache.Connection, backend: str
) -> None:
    sql = "SELECT i.id FROM items i WHERE i.code = %s OR i.flag = %s ORDER BY i.id"
    for values in (("AB", "C"), ("AB   ", "C "), ("x ", ""), ("ABCDE", "A")):
        answer = assert_same_answer(conn, backend, f"{sql} CURRENCY BOUND 10 MIN", sql, values)
        assert answer.route == LOCAL, answer.reason


def test_division_by_zero_is_postgres_error(conn: cache.Connection) -> None:
    cursor = conn.cursor()
    for sql in ("SELECT i.price / 0 FROM items i", "SELECT i.small / (i.id - 1) FROM items i"):
        with pytest.raises(cache.DataError, match="division by zero"):
            cursor.execute(f"{sql} CURRENCY BOUND 10 MIN")
        conn.rollback()


def test_empty_and_null_aggregates(conn: cache.Connection, backend: str) -> None:
    sql = "SELECT avg(i.price), sum(i.price) / count(*), min(i.code) FROM items i WHERE i.id > 99"
    assert_same_answer(conn, backend, f"{sql} CURRENCY BOUND 10 MIN", sql)
    assert_same_answer(
        conn,
        backend,
        f"{sql.replace('count(*)', '2')} CURRENCY BOUND 10 MIN",
        sql.replace("count(*)", "2"),
    )


def test_averages_at_many_scales(conn: cache.Connection, backend: str) -> None:
    """PostgreSQL picks a division's scale from the operands' magnitudes (select_div_scale):
    averages of values from 1e-4 to 1e9 over 1 to 7 rows."""
    for low in range(1, 8):
        for column in ("price", "rate", "big", "small"):
            sql = f"SELECT avg(i.{column}), sum(i.{column}) / 7 FROM items i WHERE i.id >= {low}"
            answer = assert_same_answer(conn, backend, f"{sql} CURRENCY BOUND 10 MIN", sql)
            assert answer.route == LOCAL, answer.reason
            assert isinstance(answer.rows[0][0], decimal.Decimal), answer.rows  # avg: numeric


def _collation_db(pg_cluster: EmbeddedPostgres, name: str, clause: str) -> str:
    with psycopg.connect(pg_cluster.dsn("postgres"), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name} {clause} TEMPLATE template0")
    dsn = pg_cluster.dsn(name)
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute(
            "CREATE TABLE words (id integer PRIMARY KEY, w text, "
            'u text COLLATE "en-x-icu", c char(3))'
        )
        setup.execute(
            "INSERT INTO words VALUES (1, 'b', 'b', 'b'), (2, 'B', 'B', 'B'), "
            "(3, 'a', 'a', 'a'), (4, 'C', 'C', 'C')"
        )
    return dsn


@pytest.mark.parametrize(
    ("database", "clause", "text_ordering"),
    [
        ("coll_c", "LOCALE 'C'", LOCAL),
        ("coll_cutf8", "LOCALE 'C.utf8' ENCODING 'UTF8'", LOCAL),
        ("coll_icu", "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'", REMOTE),
    ],
)
def test_text_ordering_under_the_backends_collations(
    pg_cluster: EmbeddedPostgres, tmp_path: Path, database: str, clause: str, text_ordering: str
) -> None:
    """DuckDB orders text by bytes: ordering is local only where PostgreSQL's collation is
    byte order (C, POSIX, C.utf8, or an explicit COLLATE "C"); a column collated otherwise is
    ordered by the backend even in a C database."""
    dsn = _collation_db(pg_cluster, database, clause)
    with cache.connect(backend=dsn, cache_path=tmp_path / "c.duckdb", admit_on_miss=False) as conn:
        conn.cursor().execute("CREATE CACHED VIEW wordscopy AS SELECT * FROM words")
        conn.admin.refresh("wordscopy")
        expected = [
            ("SELECT x.w FROM words x ORDER BY x.w", text_ordering),
            ("SELECT x.w FROM words x ORDER BY 1", text_ordering),
            ("SELECT x.w AS k FROM words x ORDER BY k DESC", text_ordering),
            ("SELECT min(x.w), max(x.c) FROM words x", text_ordering),
            ("SELECT x.id FROM words x WHERE x.w < 'b' ORDER BY x.id", text_ordering),
            ('SELECT x.w FROM words x ORDER BY x.w COLLATE "C"', LOCAL),
            ("SELECT x.u FROM words x ORDER BY x.u", REMOTE),
            ("SELECT x.id FROM words x WHERE x.u = 'B'", LOCAL),  # equality is byte equality
            ("SELECT x.id, x.w FROM words x WHERE x.id = 2", LOCAL),
        ]
        for sql, route in expected:
            answer = assert_same_answer(conn, dsn, f"{sql} CURRENCY BOUND 10 MIN", sql)
            assert answer.route == route, (database, sql, answer.reason)


def test_a_format_1_cache_file_is_migrated(backend: str, tmp_path: Path) -> None:
    """Format 1 stored char(n) values padded and knew no collations: opening such a file strips
    the padding and reflects the backend again; answers stay PostgreSQL's."""
    import duckdb

    path = tmp_path / "old.duckdb"
    with cache.connect(backend=backend, cache_path=path, admit_on_miss=False) as conn:
        conn.cursor().execute("CREATE CACHED VIEW itemscopy AS SELECT * FROM items")
        conn.admin.refresh("itemscopy")
    with duckdb.connect(str(path)) as old:  # made as format 1 made it
        old.execute("UPDATE itemscopy SET code = rpad(code, 5, ' '), flag = rpad(flag, 1, ' ')")
        old.execute("ALTER TABLE mtcache.backend_columns DROP COLUMN byte_order")
        old.execute("ALTER TABLE mtcache.backend_columns DROP COLUMN deterministic")
        old.execute("UPDATE mtcache.meta SET value = '1' WHERE key = 'format_version'")
    with cache.connect(backend=backend, cache_path=path, admit_on_miss=False) as conn:
        for sql in (
            "SELECT i.id, length(i.code), i.code || '|' FROM items i",
            "SELECT i.id, i.code FROM items i WHERE i.code LIKE 'AB'",
        ):
            answer = assert_same_answer(conn, backend, f"{sql} CURRENCY BOUND 10 MIN", sql)
            assert answer.route == LOCAL, answer.reason
    with duckdb.connect(str(path), read_only=True) as migrated:
        assert migrated.execute(
            "SELECT value FROM mtcache.meta WHERE key = 'format_version'"
        ).fetchone() == ("3",)
