"""The cache file: shadow catalog, cache DDL, Rules 1-5 (real PostgreSQL and DuckDB)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cache.backend.reflect import fetch_catalog
from cache.store.cache_file import CacheStore
from cache.tools import bookstore
from control_tables.safety import UnsafeSchemaError
from sql_ext import parse
from sql_ext.errors import CatalogError, NotSupportedError, ProgrammingError

SCHEMA_FILE = bookstore.CACHE_SCHEMA_FILE


@pytest.fixture
def store(bookstore_dsn: str, tmp_path: Path) -> CacheStore:
    opened = CacheStore(tmp_path / "cache.duckdb")
    opened.save_catalog(fetch_catalog(bookstore_dsn))
    yield opened
    opened.close()


def apply(store: CacheStore, script: str) -> None:
    store.apply_ddl(parse(script), store.load_catalog())


def dump(store: CacheStore) -> dict[str, list[tuple[object, ...]]]:
    """Every table of the file, main and mtcache, sorted: equal dumps mean an unchanged file."""
    tables = store.con.execute(
        "SELECT table_schema, table_name FROM information_schema.tables "
        "WHERE table_schema IN ('main', 'mtcache') ORDER BY 1, 2"
    ).fetchall()
    return {
        f"{schema}.{name}": sorted(
            store.con.execute(f'SELECT * FROM "{schema}"."{name}"').fetchall(), key=repr
        )
        for schema, name in tables
    }


def test_shadow_catalog_keeps_keys_statistics_and_indexes(
    store: CacheStore, tmp_path: Path
) -> None:
    store.close()
    reopened = CacheStore(tmp_path / "cache.duckdb")
    catalog = reopened.load_catalog()
    books = catalog.table("books")
    assert books is not None
    assert books.primary_key == ("isbn",)
    assert books.row_count == 200
    assert {i.name for i in books.indexes} >= {"books_pkey", "books_authorid"}
    authorid = next(c for c in books.columns if c.name == "authorid")
    assert authorid.n_distinct == 40 and not authorid.nullable
    assert ("isbn", "reviewerid") in catalog.table("reviews").unique_keys  # type: ignore[union-attr]
    assert catalog.view("book_reviews") is not None
    reopened.close()


def test_fig_3_2_schema_creates_tables_and_records_the_dag(
    store: CacheStore, tmp_path: Path
) -> None:
    apply(store, SCHEMA_FILE.read_text())
    columns = {
        name: [r[0] for r in store.con.execute(f'DESCRIBE "{name}"').fetchall()]
        for name in ("authorlist_pct", "citylist_csct", "bookcopy")
    }
    assert columns["authorlist_pct"] == ["authorid", "refreshed_at", "snapshot_id"]
    assert columns["citylist_csct"] == ["city", "refreshed_at", "snapshot_id"]
    assert columns["bookcopy"] == ["isbn", "authorid", "title", "type", "price"]
    keys = dict(
        store.con.execute(
            "SELECT table_name, constraint_column_names FROM duckdb_constraints() "
            "WHERE constraint_type = 'PRIMARY KEY'"
        ).fetchall()
    )
    assert keys["bookcopy"] == ["isbn"] and keys["reviewcopy"] == ["reviewid"]
    recorded = {
        name: (color, consistency, parents)
        for name, color, consistency, parents in store.con.execute(
            "SELECT name, color, consistency, parents FROM mtcache.objects "
            "WHERE kind = 'cached view'"
        ).fetchall()
    }
    assert recorded == {
        "authorcopy": ("white", "group", ["authorlist_pct"]),
        "bookcopy": ("gray", "group", ["authorcopy"]),
        "reviewercopy": ("white", "group", ["reviewerlist_pct"]),
        "reviewcopy": ("white", "view", ["bookcopy", "reviewercopy"]),
    }
    store.close()
    reopened = CacheStore(tmp_path / "cache.duckdb")
    schema = reopened.load_schema()
    assert schema.topological_order() == ["authorcopy", "bookcopy", "reviewercopy", "reviewcopy"]
    assert schema.views["authorcopy"].completeness is not None
    assert schema.consistency_root("bookcopy") == "authorcopy"
    reopened.close()


BASE = """
CREATE CONTROL TABLE authorlist_pct (authorid INTEGER);
CREATE CONTROL TABLE reviewerlist_pct (reviewerid INTEGER);
CREATE CACHED VIEW authorcopy AS SELECT * FROM authors PRESENCE ON (authorid) IN authorlist_pct;
CREATE CACHED VIEW reviewercopy AS SELECT * FROM reviewers
    PRESENCE ON (reviewerid) IN reviewerlist_pct;
"""

RULE_VIOLATIONS = {
    # Rule 1: a cycle (allowed forward references make one possible within a script).
    1: """
    CREATE CACHED VIEW bookcycle AS SELECT * FROM books PRESENCE ON (isbn) IN reviewcycle (isbn)
        CONSISTENCY ON ALL;
    CREATE CACHED VIEW reviewcycle AS SELECT * FROM reviews PRESENCE ON (isbn) IN bookcycle
        CONSISTENCY ON ALL;
    """,
    # Rule 2 is also a parse error (COMPLETENESS with ROOT); the schema check backs it up.
    2: None,
    # Rule 3: two presence controls without CONSISTENCY ON ALL.
    3: """
    CREATE CACHED VIEW bookcopy AS SELECT * FROM books PRESENCE ON (authorid) IN authorcopy
        CONSISTENCY ROOT;
    CREATE CACHED VIEW reviewcopy AS SELECT * FROM reviews PRESENCE ON (isbn) IN bookcopy
        PRESENCE ON (reviewerid) IN reviewercopy;
    """,
    # Rule 4: a gray view controlled by a non-key of its parent.
    4: """
    CREATE CACHED VIEW citybooks AS SELECT * FROM reviewers PRESENCE ON (city) IN authorcopy (city)
        CONSISTENCY ROOT;
    """,
    # Rule 5: consistency and completeness keys that do not determine each other.
    5: """
    CREATE CONTROL TABLE gender_csct (gender TEXT);
    CREATE CONTROL TABLE city_cpct (city TEXT);
    CREATE CACHED VIEW reviewers2 AS SELECT * FROM reviewers
        PRESENCE ON (reviewerid) IN r2_pct
        CONSISTENCY ON (gender) IN gender_csct
        COMPLETENESS ON (city) IN city_cpct;
    CREATE CONTROL TABLE r2_pct (reviewerid INTEGER);
    """,
}


@pytest.mark.parametrize("rule", [1, 3, 4, 5])
def test_each_rule_rejects_its_counter_example_and_changes_nothing(
    store: CacheStore, rule: int
) -> None:
    apply(store, BASE)
    before = dump(store)
    script = RULE_VIOLATIONS[rule]
    assert script is not None
    with pytest.raises(UnsafeSchemaError) as info:
        apply(store, script)
    assert info.value.rule == rule
    # the script position of the view it is about, then the rule
    assert re.match(rf"line \d+, column \d+: Rule {rule} \(", str(info.value))
    assert dump(store) == before


def test_rule_5_presence_key_must_determine_the_consistency_key(store: CacheStore) -> None:
    """The dissertation's control-table-hierarchy example: books by author, consistent by
    publisher, can overlap (Alice's books 1, 2; publisher A's books 1, 3)."""
    with pytest.raises(UnsafeSchemaError, match=r"Rule 5 .* presence key \(authorid\) does not"):
        apply(
            store,
            "CREATE CONTROL TABLE a_pct (authorid INT); CREATE CONTROL TABLE pub_csct "
            "(publisherid INT); CREATE CACHED VIEW b AS SELECT * FROM books "
            "PRESENCE ON (authorid) IN a_pct CONSISTENCY ON (publisherid) IN pub_csct",
        )


def test_rule_2_gray_view_with_completeness_is_rejected_at_parse_time() -> None:
    from sql_ext.errors import SqlSyntaxError

    with pytest.raises(SqlSyntaxError, match="Rule 2"):
        parse(
            "CREATE CACHED VIEW b AS SELECT * FROM books PRESENCE ON (authorid) IN authorcopy "
            "CONSISTENCY ROOT COMPLETENESS ON (type)"
        )


def test_a_script_is_all_or_nothing(store: CacheStore) -> None:
    before = dump(store)
    with pytest.raises(CatalogError, match="no table 'nosuch'"):
        apply(store, BASE + "CREATE CACHED VIEW broken AS SELECT * FROM nosuch;")
    assert dump(store) == before


@pytest.mark.parametrize(
    ("script", "error", "message"),
    [
        (
            "CREATE CACHED VIEW t AS SELECT title FROM books",
            ProgrammingError,
            "must include a key of books (isbn)",
        ),
        (
            "CREATE CACHED VIEW t AS SELECT isbn, colour FROM books",
            CatalogError,
            "books has no column 'colour'",
        ),
        (
            "CREATE CACHED VIEW t AS SELECT * FROM books PRESENCE ON (authorid) IN nowhere",
            ProgrammingError,
            "no control table or cached view 'nowhere'",
        ),
        (
            "CREATE CONTROL TABLE p (authorid INT); CREATE CACHED VIEW t1 AS SELECT * FROM authors "
            "PRESENCE ON (authorid) IN p; CREATE CACHED VIEW t2 AS SELECT * FROM authors "
            "PRESENCE ON (authorid) IN p",
            ProgrammingError,
            "controls one view in one role",
        ),
        (
            "CREATE CONTROL TABLE p (isbn TEXT); CREATE CACHED VIEW t AS SELECT * FROM books "
            "PRESENCE ON (authorid) IN p (isbn)",
            ProgrammingError,
            "authorid is INTEGER but p.isbn is VARCHAR",
        ),
        (
            "CREATE CONTROL TABLE p (isbn TEXT); CREATE CACHED VIEW t AS SELECT * FROM books "
            "PRESENCE ON (authorid) IN p (isbnx)",
            ProgrammingError,
            "p has no column isbnx",
        ),
        (
            "CREATE CONTROL TABLE p (authorid INT); CREATE CACHED VIEW t AS SELECT * FROM books "
            "PRESENCE ON (authorid) IN p CONSISTENCY ROOT",
            ProgrammingError,
            "is a control table",
        ),
        (
            "CREATE CACHED VIEW t AS SELECT * FROM books PRESENCE ON (authorid) IN authorcopy",
            NotSupportedError,
            "must be view-level consistent",
        ),
        (
            "CREATE CACHED VIEW t AS SELECT * FROM sales WHERE qty > 1 REFRESH CONTINUOUSLY",
            NotSupportedError,
            "selects whole rows of its table",
        ),
        (
            "CREATE CACHED VIEW t AS SELECT isbn, authorid FROM books PRESENCE ON (authorid) IN "
            "authorcopy CONSISTENCY ROOT REFRESH CONTINUOUSLY",
            ProgrammingError,
            "declare REFRESH CONTINUOUSLY on authorcopy instead",
        ),
        (
            "CREATE CACHED VIEW t AS SELECT isbn, authorid FROM books PRESENCE ON (authorid) IN "
            "authorcopy CONSISTENCY ROOT REFRESH AUTO",
            ProgrammingError,
            "declare REFRESH AUTO on authorcopy instead",
        ),
        (
            "CREATE CACHED VIEW t AS SELECT * FROM books REFRESH AUTO WITHIN 0 SEC",
            ProgrammingError,
            "REFRESH AUTO WITHIN needs an age above 0",
        ),
        (
            "CREATE CACHED VIEW t AS SELECT * FROM books PRESENCE ON (authorid) IN authorcopy "
            "CONSISTENCY ON ALL REFRESH CONTINUOUSLY",
            ProgrammingError,
            "its parent authorcopy is not",
        ),
        (
            "CREATE CONTROL TABLE q (reviewerid INT); CREATE CACHED VIEW r AS SELECT * FROM "
            "reviewers PRESENCE ON (reviewerid) IN q REFRESH CONTINUOUSLY; CREATE CACHED VIEW rv "
            "AS SELECT * FROM reviews PRESENCE ON (reviewerid) IN r CONSISTENCY ON ALL",
            ProgrammingError,
            "controlled by r, which is maintained continuously",
        ),
        ("DROP CONTROL TABLE authorlist_pct", ProgrammingError, "still a control of authorcopy"),
        ("DROP CACHED VIEW authorlist_pct", ProgrammingError, "is a control table"),
        ("DROP CACHED VIEW nothing", ProgrammingError, "there is no cached view 'nothing'"),
        ("CREATE CONTROL TABLE authorlist_pct (x INT)", ProgrammingError, "already exists"),
        ("SELECT 1", ProgrammingError, "found a query statement"),
    ],
)
def test_ddl_errors(store: CacheStore, script: str, error: type[Exception], message: str) -> None:
    apply(store, BASE)
    before = dump(store)
    with pytest.raises(error) as info:
        apply(store, script)
    assert message in str(info.value)
    assert dump(store) == before


def test_drop_then_recreate_in_one_script(store: CacheStore) -> None:
    apply(store, BASE)
    apply(
        store,
        "DROP CACHED VIEW reviewercopy; CREATE CACHED VIEW reviewercopy AS "
        "SELECT reviewerid, name FROM reviewers PRESENCE ON (reviewerid) IN reviewerlist_pct;"
        "DROP CACHED VIEW IF EXISTS never_was",
    )
    described = [r[0] for r in store.con.execute('DESCRIBE "reviewercopy"').fetchall()]
    assert described == ["reviewerid", "name"]


def test_a_second_process_gets_a_clear_error(store: CacheStore, tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; from cache.store.cache_file import CacheStore\n"
        "try:\n    CacheStore(sys.argv[1])\n"
        "except Exception as e:\n    print(type(e).__name__, e); sys.exit(3)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "cache.duckdb")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 3
    assert result.stdout.startswith("OperationalError the cache file")
    assert "in use by another process" in result.stdout


def test_rule_2_is_checked_on_the_schema_too(store: CacheStore) -> None:
    """The parser refuses ROOT with COMPLETENESS; a schema built another way is still checked."""
    from dataclasses import replace

    from control_tables.safety import check_schema
    from sql_ext import Completeness

    apply(store, SCHEMA_FILE.read_text())
    schema = store.load_schema()
    gray = replace(schema.views["bookcopy"], completeness=Completeness(("type",), None))
    with pytest.raises(UnsafeSchemaError) as info:
        check_schema(schema.with_view(gray), store.load_catalog())
    assert info.value.rule == 2 and info.value.views == ["bookcopy"]


def test_a_bump_and_a_write_transaction_take_the_locks_in_one_order(tmp_path: Path) -> None:
    """A change counted outside a transaction (`bump`, after DDL) while another thread commits
    one: each takes the file's write lock, then the commit lock. A bump that took them the
    other way round deadlocked against the scheduler keeping the bounds asked (a hung run of
    the suite); with one order, the two threads always finish."""
    import threading

    path = tmp_path / "locks.duckdb"
    writer, other = CacheStore(path), CacheStore(path)
    writer.con.execute("CREATE TABLE t (x INTEGER)")
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            with writer.transaction() as con:
                con.execute("INSERT INTO t VALUES (1)")

    def bump() -> None:
        for _ in range(5000):
            other.bump()
        stop.set()

    threads = [threading.Thread(target=f, daemon=True) for f in (write, bump)]
    for thread in threads:
        thread.start()
    for thread in threads:  # (a deadlock fails here, rather than hanging the suite)
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    writer.close()
    other.close()


def test_a_change_token_is_never_older_than_the_rows_a_reader_saw(tmp_path: Path) -> None:
    """A reader that saw a commit's rows gets a change token counting that commit (the result
    memo keeps answers under tokens: one from before the commit would let older rows pass for
    current). The chaos checker caught the window between COMMIT and the count under load."""
    import threading

    path = tmp_path / "tokens.duckdb"
    writer, reader = CacheStore(path), CacheStore(path)
    writer.con.execute("CREATE TABLE t (x INTEGER)")
    done = threading.Event()

    def write() -> None:
        for i in range(1000):
            with writer.transaction() as con:
                con.execute("INSERT INTO t VALUES (?)", [i])
                writer.changed(["t"])
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    checked = 0
    try:
        while not done.is_set():
            (count,) = reader.con.execute("SELECT count(*) FROM t").fetchone()  # type: ignore[misc]
            token = reader.change_token(["t"])
            assert token[-1] >= count, f"saw {count} commits' rows, token counts {token[-1]}"
            checked += 1
    finally:
        thread.join()
        writer.close()
        reader.close()
    assert checked > 0


def test_a_figure_of_the_data_is_read_again_after_a_change_or_a_checkpoint(
    tmp_path: Path,
) -> None:
    """`CacheStore.at_version` keeps a costly figure (the status's stored bytes, read at
    every scrape of the server's metrics) only while neither a commit nor a checkpoint can
    have changed it."""
    store = CacheStore(tmp_path / "figures.duckdb")
    reads: list[int] = []

    def count() -> int:
        (n,) = store.con.execute("SELECT count(*) FROM t").fetchone()  # type: ignore[misc]
        reads.append(n)
        return int(n)

    try:
        store.con.execute("CREATE TABLE t (x INTEGER)")
        store.bump()
        assert [store.at_version("n", count) for _ in range(3)] == [0, 0, 0]
        assert reads == [0]  # (read once: nothing changed)
        with store.transaction() as con:
            con.execute("INSERT INTO t VALUES (1)")
            store.changed(["t"])
        assert store.at_version("n", count) == 1 and reads == [0, 1]
        store.con.execute("CHECKPOINT")  # (no version: the file on disk changed)
        assert store.at_version("n", count) == 1 and reads == [0, 1, 1]
        assert store.at_version("n", count) == 1 and reads == [0, 1, 1]
    finally:
        store.close()
