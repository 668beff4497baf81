"""Statement routing (cache/engine/route.py): one pure function from a parse to a typed route.
No database needed."""

from __future__ import annotations

import pytest

from cache.engine.link.effects import effects_of
from cache.engine.route import (
    CacheDdl,
    CachedRead,
    ControlEdit,
    Explain,
    Passthrough,
    TimelineBracket,
    Write,
    parse_statement,
    route,
)
from sql_ext.errors import NotSupportedError

CONTROLS = frozenset({"authorlist_pct"})


def routed(sql: str) -> object:
    return route(parse_statement(sql), sql, CONTROLS)


def test_reads_with_and_without_clauses() -> None:
    read = routed("SELECT * FROM authors a WHERE a.authorid = 4 CURRENCY BOUND 10 MIN")
    assert isinstance(read, CachedRead)
    plain = routed("SELECT * FROM authors WHERE authorid = 4")
    assert isinstance(plain, Passthrough) and plain.reads is not None
    assert plain.sql == "SELECT * FROM authors WHERE authorid = 4"  # verbatim


def test_explain_of_a_query_with_clauses_is_the_caches_own() -> None:
    explain = routed("EXPLAIN SELECT * FROM authors a CURRENCY BOUND 10 MIN")
    assert isinstance(explain, Explain) and explain.query.explain is None
    plain = routed("EXPLAIN SELECT * FROM authors")
    assert isinstance(plain, Passthrough) and plain.reads is None


def test_writes_name_their_tables() -> None:
    write = routed("UPDATE authors SET name = 'x' WHERE authorid = 4")
    assert isinstance(write, Write) and write.tables == {"authors"}
    assert isinstance(routed("INSERT INTO books (isbn) VALUES ('x')"), Write)
    ddl = routed("CREATE TABLE t (x int)")
    assert isinstance(ddl, Passthrough) and ddl.changes_catalog


def test_control_table_edits_admit_and_evict() -> None:
    admit = routed("INSERT INTO authorlist_pct VALUES (4)")
    assert isinstance(admit, ControlEdit) and (admit.control, admit.kind) == (
        "authorlist_pct",
        "insert",
    )
    assert isinstance(routed("DELETE FROM authorlist_pct WHERE authorid = 4"), ControlEdit)
    with pytest.raises(NotSupportedError, match="UPDATE on control table"):
        routed("UPDATE authorlist_pct SET authorid = 5")


def test_cache_ddl_and_timeline() -> None:
    assert isinstance(routed("CREATE CONTROL TABLE x_pct (x INTEGER)"), CacheDdl)
    assert routed("BEGIN TIMEORDERED") == TimelineBracket(begin=True)


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE authors SET authorid = authorid %% 2 WHERE authorid = %s",
        "DELETE FROM authors WHERE authorid %% 2 = 0",
    ],
)
def test_a_write_the_parser_cannot_read_still_counts_as_a_write(sql: str) -> None:
    """psycopg's %% makes these unreadable to sqlglot; they go to PostgreSQL verbatim, and the
    session's later reads must still see them (read your writes)."""
    write = routed(sql)
    assert isinstance(write, Write) and write.sql == sql and write.tables is None


def test_a_read_the_parser_cannot_read_is_no_write() -> None:
    plain = routed("SELECT 7 %% 4")
    assert isinstance(plain, Passthrough) and plain.sql == "SELECT 7 %% 4"


@pytest.mark.parametrize("clause", ["", " CURRENCY BOUND 10 MIN"])
def test_a_data_modifying_cte_is_a_write(clause: str) -> None:
    """WITH d AS (DELETE ... RETURNING *) SELECT ... writes: the backend runs it (never the
    cache), and the session's later reads see it."""
    write = routed(
        f"WITH d AS (DELETE FROM books b WHERE b.authorid = 3 RETURNING *) "
        f"SELECT count(*) FROM d{clause}"
    )
    assert isinstance(write, Write) and write.tables == {"books"}


def test_commands_that_change_no_table_are_not_writes() -> None:
    """RESET and SHOW reach PostgreSQL as commands; they write nothing, so the session's own
    later reads may still be answered from the cache."""
    for sql in ("RESET TimeZone", "SHOW TimeZone", "SET TimeZone = 'UTC'", "LISTEN x"):
        assert isinstance(routed(sql), Passthrough), sql
    assert isinstance(routed("VACUUM authors"), Write)


@pytest.mark.parametrize(
    ("sql", "names", "pinned"),
    [
        ("SET bars.tag = 'x'", {"bars.tag"}, False),
        ('SET LOCAL "Bars" . Tag TO 1', {"bars.tag"}, False),
        ("reset session bars.tag", {"bars.tag"}, False),
        ("SET search_path = public", set(), False),
        (
            "SELECT set_config('App.Tenant', '7', false), set_config('a.b', 'c', true)",
            {"app.tenant", "a.b"},
            False,
        ),
        ("SELECT set_config('work_mem', '64MB', false)", set(), False),
        ("SELECT set_config(name, 'x', false) FROM names", set(), True),
        ("SELECT 1", set(), False),
    ],
)
def test_custom_settings_a_statement_may_define_are_named(
    sql: str, names: set[str], pinned: bool
) -> None:
    """A custom setting (a placeholder: pg_settings does not list it) is carried by the name
    a statement gives it; one set_config computes pins its pooled session instead."""
    effects = effects_of(sql)
    assert effects.custom_settings == names
    assert (effects.pins is not None) is pinned
