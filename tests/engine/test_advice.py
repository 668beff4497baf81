"""Advice on what to cache: each kind of remote answer counted with its reason, the cache DDL
suggested for those a view would answer, and that DDL, applied, answering them locally as
PostgreSQL answers them."""

from __future__ import annotations

import math
import typing as t
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import cache
from cache.engine.advice import Advice, apply_script
from cache.engine.inspect import CACHE_ADVICE
from cache.maintenance.pipeline import Maintainer
from cache.tools import bookstore
from sql_ext import CreateCachedView, DropCacheObject, parse, parse_one
from sql_ext.ddl import Presence
from tests.answers import assert_same_answer
from tests.roles import login_role

SCHEMA = """
CREATE CONTROL TABLE authorlist_pct (authorid INTEGER);
CREATE CACHED VIEW authorcopy AS SELECT * FROM authors PRESENCE ON (authorid) IN authorlist_pct
    REFRESH EVERY 5 MIN;
CREATE CACHED VIEW salescopy AS SELECT * FROM sales REFRESH EVERY 1 HOUR;
"""
NO_VIEW = "SELECT r.rating, r.isbn FROM reviews r WHERE r.reviewerid = %s CURRENCY BOUND 10 MIN"
STALE = "SELECT s.qty FROM sales s WHERE s.saleid = %s CURRENCY BOUND 10 MIN"
MISSED = "SELECT a.name FROM authors a WHERE a.authorid = %s CURRENCY BOUND 10 MIN"
BELOW = "SELECT s.qty FROM sales s WHERE s.saleid = 1 CURRENCY BOUND 1 MS"


@pytest.fixture
def conn(bookstore_dsn: str, tmp_path: Path) -> Iterator[t.Any]:
    path = tmp_path / "cache.duckdb"
    with cache.connect(
        bookstore_dsn, path, autocommit=True, background=False, admit_on_miss=False
    ) as connection:
        connection.admin.apply_ddl(SCHEMA)
        yield connection


def advice_of(conn: t.Any) -> dict[str, t.Any]:
    return {a.statement: a for a in conn.admin.advice()}


def test_each_remote_answer_is_counted_with_its_reason(conn: t.Any) -> None:
    cur = conn.cursor()
    for key in (1, 2, 3):
        cur.execute(NO_VIEW, (key,))
        cur.execute(MISSED, (key,))
    cur.execute(BELOW)
    cur.execute(BELOW.replace("saleid = 1", "saleid = 2"))  # (one shape: its constants aside)
    # salescopy's data an hour older than it is (given, not waited for): a 10 min bound fails
    store = conn.admin.store
    with store.transaction() as con:
        con.execute(
            "UPDATE mtcache.view_state SET refreshed_at = refreshed_at - INTERVAL 1 HOUR "
            "WHERE view = 'salescopy'"
        )
        store.changed(["salescopy"])
    cur.execute(STALE, (1,))
    assert cur.provenance[0]["route"] != "local"

    found = advice_of(conn)
    # (each shape under its text with every constant a placeholder, as sqlglot prints it)
    no_view = found[parse_one(NO_VIEW).normalized]
    assert no_view.statement == (
        "SELECT r.rating, r.isbn FROM reviews AS r WHERE r.reviewerid = %s CURRENCY BOUND 10 MIN"
    )
    assert no_view.calls == 3 and no_view.backend_ms > 0
    assert no_view.reason == "no view: no cached view answers reviews (r)"
    # (reviews has these three columns: all of them)
    assert (
        no_view.suggestion
        == 'CREATE CACHED VIEW "reviews_cache" AS SELECT * FROM "reviews" REFRESH AUTO;'
    )

    assert no_view.bytes is not None and no_view.bytes > 0 and no_view.saves_ms > 0

    missed = found[parse_one(MISSED).normalized]
    assert missed.calls == 3 and missed.reason.startswith("presence miss: ")
    assert missed.suggestion is None and missed.saves_ms == 0

    below = found["SELECT s.qty FROM sales AS s WHERE s.saleid = %s CURRENCY BOUND 1 MS"]
    assert below.calls == 2 and below.reason.startswith("bound below delay: ")
    assert below.suggestion is None

    stale = found[parse_one(STALE).normalized]
    assert stale.calls == 1
    assert stale.reason == "bound not met: salescopy older than 10 min"
    assert stale.suggestion is not None
    assert stale.suggestion.startswith('DROP CACHED VIEW "salescopy";\n')
    assert stale.suggestion.endswith(
        "CREATE CACHED VIEW salescopy AS SELECT * FROM sales REFRESH AUTO;"
    )

    # SHOW CACHE ADVICE gives the same rows
    rows = conn.cursor().execute("SHOW CACHE ADVICE")
    shown = {r[0]: r for r in rows.fetchall()}
    assert [d[0] for d in rows.description] == [c for c, _ in CACHE_ADVICE]
    assert shown[missed.statement][1:4] == (3, missed.backend_ms, missed.reason)


def test_the_suggestions_applied_answer_the_statements_locally(
    conn: t.Any, bookstore_dsn: str
) -> None:
    cur = conn.cursor()
    other = "SELECT r.isbn FROM reviews r WHERE r.rating > %s CURRENCY BOUND 10 MIN"
    for key in (1, 2):
        cur.execute(NO_VIEW, (key,))
        cur.execute(other, (key,))
    applied = apply_script(conn.admin.advice())
    # one view of reviews, with the columns both statements read
    assert applied.views == ("reviews_cache",)
    conn.admin.apply_ddl(applied.script)
    for sql, pg in (
        (NO_VIEW, "SELECT r.rating, r.isbn FROM reviews r WHERE r.reviewerid = %s"),
        (other, "SELECT r.isbn FROM reviews r WHERE r.rating > %s"),
    ):
        answer = assert_same_answer(conn, bookstore_dsn, sql, pg, (2,))
        assert answer.route == "local", answer.reason
    # nothing left to advise for them: their next calls were local
    assert apply_script(advice_of(conn).values()).views == ()


def test_a_budget_leaves_out_what_does_not_fit(conn: t.Any) -> None:
    cur = conn.cursor()
    cur.execute(NO_VIEW, (1,))
    applied = apply_script(conn.admin.advice(), room=1)
    assert applied.script == "" and applied.left_out[0][0] == "reviews_cache"


def test_what_reaches_the_backend_past_the_cache_is_listed_from_pg_stat_statements(
    pg_cluster: t.Any, tmp_path: Path
) -> None:
    """With pg_stat_statements on the backend (the embedded cluster loads it), the advice also
    lists the reads the cache never planned - no currency bound, or another client - with no
    suggestion (a view alone cannot answer a read of current data) and what to do; a read the
    cache counted itself is listed once."""
    dsn = pg_cluster.create_database("advice_statements")
    bookstore.load_into(dsn)
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute("CREATE EXTENSION pg_stat_statements")
        for key in (1, 2, 3):
            pg.execute("SELECT qty FROM sales WHERE saleid = %s", (key,))
    with cache.connect(dsn, tmp_path / "cache.duckdb", autocommit=True, background=False) as conn:
        for key in (1, 2):
            conn.execute(NO_VIEW, (key,))
        found = advice_of(conn)
    [plain] = [a for a in found.values() if "FROM sales" in a.statement]
    assert plain.statement == "SELECT qty FROM sales WHERE saleid = %s"
    assert plain.calls == 3 and plain.backend_ms >= 0
    assert plain.reason.startswith("no bound: the backend ran it 3 times without the cache")
    assert plain.suggestion is None
    # the cached read the backend answered: once, as the cache counted it
    assert [a.calls for a in found.values() if "FROM reviews" in a.statement] == [2]


def test_the_reasons_no_ddl_fixes_are_told_and_suggest_nothing(
    pg_cluster: t.Any, tmp_path: Path
) -> None:
    """A role that may read some columns only (the backend answers it), a function DuckDB
    cannot compute as PostgreSQL, a system catalog, a session reading after its own write:
    each counted with its reason, and no DDL suggested."""
    dsn = pg_cluster.create_database("advice_kinds")
    bookstore.load_into(dsn)
    reader_dsn = login_role(dsn, "advice_reader")
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute("GRANT SELECT (saleid, qty) ON sales TO advice_reader")
    path = tmp_path / "cache.duckdb"
    point = "SELECT s.qty FROM sales s WHERE s.saleid = %s CURRENCY BOUND 10 MIN"
    function = (
        "SELECT s.qty, pg_backend_pid() > 0 FROM sales s WHERE s.saleid = %s CURRENCY BOUND 10 MIN"
    )
    written = "SELECT s.isbn FROM sales s WHERE s.saleid = %s CURRENCY BOUND 10 MIN"
    catalog = "SELECT count(*) FROM pg_class c CURRENCY BOUND 10 MIN"
    with cache.connect(dsn, path, autocommit=True, background=False) as owner:
        owner.admin.apply_ddl("CREATE CACHED VIEW salescopy AS SELECT * FROM sales")
        with cache.connect(reader_dsn, path, autocommit=True, background=False) as reader:
            reader.execute(point, (1,))
            assert reader.cursor().execute(point, (1,)).provenance[0]["route"] == "remote"
        owner.execute(function, (1,))
        owner.execute(catalog)
        owner.execute("UPDATE sales SET qty = qty WHERE saleid = 2")
        owner.execute(written, (2,))
        found = {a.statement: a for a in owner.admin.advice()}
    for sql, start in (
        (point, "privileges: the session's role may not read"),
        (
            function,
            "allowlist: (sales): DuckDB cannot answer it as PostgreSQL: it calls pg_backend_pid",
        ),
        (written, "timeline: "),
        (catalog, "outside: (pg_class): DuckDB cannot answer it as PostgreSQL: it reads pg_class"),
    ):
        row = found[parse_one(sql).normalized]
        assert row.reason.startswith(start), row.reason
        assert row.suggestion is None


def test_a_bound_below_the_refresh_delay_suggests_the_change_stream(
    conn: t.Any, bookstore_dsn: str
) -> None:
    """Refreshes of salescopy that take 2.5 s to land (a fault point's sleep: given, not
    measured) put a 2 s bound below its delay: the advice is to keep it REFRESH CONTINUOUSLY.
    A bound under a second suggests nothing: no copy is kept that fresh."""
    store = conn.admin.store
    for _ in range(2):
        Maintainer(store, bookstore_dsn, faults_enabled=["after_pull:sleep=2.5"]).refresh(
            "salescopy"
        )
    slow = "SELECT s.qty FROM sales s WHERE s.saleid = %s CURRENCY BOUND 2 SEC"
    cur = conn.cursor()
    cur.execute(slow, (1,))
    cur.execute(BELOW)
    found = advice_of(conn)
    row = found[parse_one(slow).normalized]
    assert row.reason.startswith("bound below delay: ")
    assert row.suggestion == (
        'DROP CACHED VIEW "salescopy";\n'
        "CREATE CACHED VIEW salescopy AS SELECT * FROM sales REFRESH CONTINUOUSLY;"
    )
    assert found[parse_one(BELOW).normalized].suggestion is None


def test_a_view_of_every_column_wins_the_merge_of_a_tables_suggestions() -> None:
    """One view per table: the union of the columns its suggestions read, every column when
    one reads them all (SELECT *), whatever order they come in. No database needed."""
    subset = 'CREATE CACHED VIEW "reviews_cache" AS SELECT "reviewid" FROM "reviews" REFRESH AUTO;'
    whole = 'CREATE CACHED VIEW "reviews_cache" AS SELECT * FROM "reviews" REFRESH AUTO;'
    other = (
        'CREATE CACHED VIEW "reviews_cache" AS SELECT "reviewid", "rating" FROM "reviews" '
        "REFRESH AUTO;"
    )

    def row(suggestion: str, saves: float) -> Advice:
        return Advice("SELECT %s", 1, 1.0, "no view: ...", suggestion, saves, 100)

    for rows in ([row(subset, 2.0), row(whole, 1.0)], [row(whole, 1.0), row(subset, 2.0)]):
        assert apply_script(rows).script == (
            'CREATE CACHED VIEW "reviews_cache" AS SELECT * FROM "reviews" REFRESH AUTO;'
        )
    merged = apply_script([row(subset, 1.0), row(other, 1.0)]).script
    assert merged == (
        'CREATE CACHED VIEW "reviews_cache" AS SELECT "rating", "reviewid" FROM "reviews" '
        "REFRESH AUTO;"
    )


def test_each_presence_view_is_applied_with_its_own_control_table() -> None:
    """A join of two tables each looked up by key suggests two control tables and two views:
    each view is applied with the control table it names (one left out for the budget takes
    its own along); a suggestion of another key does not merge into a table's view. No
    database needed."""
    join = (
        'CREATE CONTROL TABLE "reviews_keys" ("reviewerid" integer);\n'
        'CREATE CONTROL TABLE "reviewers_keys" ("reviewerid" integer);\n'
        'CREATE CACHED VIEW "reviews_cache" AS SELECT * FROM "reviews" '
        'PRESENCE ON ("reviewerid") IN "reviews_keys" REFRESH AUTO;\n'
        'CREATE CACHED VIEW "reviewers_cache" AS SELECT * FROM "reviewers" '
        'PRESENCE ON ("reviewerid") IN "reviewers_keys" REFRESH AUTO;'
    )
    by_isbn = (
        'CREATE CONTROL TABLE "reviews_keys2" ("isbn" text);\n'
        'CREATE CACHED VIEW "reviews_cache2" AS SELECT "reviewid", "isbn" FROM "reviews" '
        'PRESENCE ON ("isbn") IN "reviews_keys2" REFRESH AUTO;'
    )
    rows = [
        Advice("SELECT 1", 1, 1.0, "no view: ...", join, 2.0, 100),
        Advice("SELECT 2", 1, 1.0, "no view: ...", by_isbn, 1.0, 100),
    ]
    assert apply_script(rows).script == (  # (as much saved per byte: by name)
        'CREATE CONTROL TABLE "reviewers_keys" ("reviewerid" integer);\n'
        'CREATE CACHED VIEW "reviewers_cache" AS SELECT * FROM "reviewers" '
        'PRESENCE ON ("reviewerid") IN "reviewers_keys" REFRESH AUTO;\n'
        'CREATE CONTROL TABLE "reviews_keys" ("reviewerid" integer);\n'
        'CREATE CACHED VIEW "reviews_cache" AS SELECT * FROM "reviews" '
        'PRESENCE ON ("reviewerid") IN "reviews_keys" REFRESH AUTO;'
    )
    fitting = apply_script(rows, room=100)
    assert fitting.left_out == (("reviews_cache", 100),)
    assert fitting.script.count("CREATE CONTROL TABLE") == 1 and '"reviews_keys"' not in (
        fitting.script
    )


def test_a_table_too_big_for_the_budget_read_by_key_gets_a_presence_view(
    bookstore_dsn: str, tmp_path: Path
) -> None:
    """With a size budget the whole of reviews does not fit, a statement that looks reviews up
    by reviewer gets a view of the reviewers read: a control table of them, filled by the
    admissions of the reads that miss; applied, its next reads are local, as PostgreSQL
    answers them."""
    with cache.connect(
        bookstore_dsn, tmp_path / "cache.duckdb", background=False, cache_size_limit="4kB"
    ) as conn:
        cur = conn.cursor()
        for key in (1, 2):
            cur.execute(NO_VIEW, (key,))
        [row] = conn.admin.advice(backend=False)
        assert row.reason == "no view: no cached view answers reviews (r)"
        assert row.suggestion == (
            'CREATE CONTROL TABLE "reviews_keys" ("reviewerid" integer);\n'
            'CREATE CACHED VIEW "reviews_cache" AS SELECT * FROM "reviews" '
            'PRESENCE ON ("reviewerid") IN "reviews_keys" REFRESH AUTO;'
        )
        catalog = conn.admin.store.load_catalog()
        whole = catalog.table("reviews")
        assert whole is not None and whole.pages * 8192 > 4000  # (it would not fit)
        # (two keys' rows of the 60 reviewers')
        assert row.bytes == math.ceil(whole.pages * 8192 * 2 / 60)
        applied = apply_script([row], room=4000)
        assert applied.views == ("reviews_cache",)
        conn.admin.apply_ddl(applied.script)
        cur.execute(NO_VIEW, (2,))  # a presence miss, admitted
        assert cur.provenance[0]["route"] == "remote"
        conn.wait_for_admissions()
        answer = assert_same_answer(
            conn,
            bookstore_dsn,
            NO_VIEW,
            "SELECT r.rating, r.isbn FROM reviews r WHERE r.reviewerid = %s",
            (2,),
        )
        assert answer.route == "local", answer.reason


def test_a_consistency_miss_suggests_one_snapshot_for_the_view(
    pg_cluster: t.Any, tmp_path: Path
) -> None:
    """Two authors admitted apart, read in one consistency class: the backend answers, for the
    reason told, and the advice re-creates the view CONSISTENCY ON ALL (its regions then come
    from one snapshot); a group not complete in the cache is told as such, and suggests
    nothing (its admission fills it). Applied and refreshed, the read is local, as PostgreSQL
    answers it."""
    dsn = pg_cluster.create_database("advice_consistency")
    bookstore.load_into(dsn)
    both = "SELECT a.name FROM authors a WHERE a.authorid IN (4, 9) CURRENCY BOUND 10 MIN ON (a)"
    city = "SELECT a.name FROM authors a WHERE a.city = 'Seattle' CURRENCY BOUND 10 MIN ON (a)"
    with cache.connect(
        dsn, tmp_path / "cache.duckdb", autocommit=True, background=False, admit_on_miss=False
    ) as conn:
        conn.admin.apply_ddl(Path("cache/schemas/bookstore.sql").read_text())
        conn.admin.admit("authorlist_pct", [4])
        conn.admin.admit("authorlist_pct", [9])
        cur = conn.cursor()
        for sql in (both, city):
            cur.execute(sql)
            assert cur.provenance[0]["route"] == "remote"
        found = advice_of(conn)
        incomplete = found[parse_one(city).normalized]
        assert incomplete.reason == "completeness miss: a group it reads is not complete"
        assert incomplete.suggestion is None
        apart = found[parse_one(both).normalized]
        assert apart.reason == "consistency: the regions it reads are not from one backend snapshot"
        assert apart.suggestion is not None
        [drop, create] = parse(apart.suggestion)
        assert isinstance(drop, DropCacheObject) and drop.name == "authorcopy"
        assert isinstance(create, CreateCachedView) and create.name == "authorcopy"
        assert create.consistency is not None and create.consistency.kind == "all"
        # (what it reads and is controlled by stays)
        assert (create.columns, create.presence, create.refresh_seconds) == (
            None,
            (Presence(("authorid",), "authorlist_pct", ("authorid",)),),
            300.0,
        )
        conn.admin.apply_ddl(apply_script([apart]).script)
        conn.admin.refresh("authorcopy")
        answer = assert_same_answer(
            conn, dsn, both, "SELECT a.name FROM authors a WHERE a.authorid IN (4, 9)", None
        )
        assert answer.route == "local", answer.reason
