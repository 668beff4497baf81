"""Property-based fuzzing (issue 10): generated SQL texts, currency clauses, cache DDL scripts,
parameters and control-key values through the parser, EXPLAIN, the DB-API, the administration
API and the CLI. The only outcomes allowed: PostgreSQL's answer (values and Python types) or an
error of the PEP 249 tree that is not an InternalError (CLI: one line, exit 1 or 2), and after
a rejected statement the cache file exactly as it was. Inputs come from tests/fuzzing.py; the
short run here is seeded, `python -m experiments.fuzz` runs the same properties longer."""

from __future__ import annotations

import decimal
import os
import re
import shutil
import subprocess
import typing as t
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import cache
from cache.dbapi.connection import Connection
from cache.engine.admin import Admin
from cache.tools import bookstore
from sql_ext import Query, parse
from sql_ext.errors import Error, InternalError, PositionedError
from tests import fuzzing
from tests.answers import typed

SCHEMA = bookstore.CACHE_SCHEMA_FILE.read_text()
WHOLE = """;
CREATE CACHED VIEW booksall AS SELECT * FROM books REFRESH EVERY 10 MIN;
CREATE CACHED VIEW salesall AS SELECT * FROM sales REFRESH EVERY 10 MIN
"""


def refused(exc: BaseException) -> bool:
    """A proper refusal: an error of the tree, and not a bug report."""
    return isinstance(exc, Error) and not isinstance(exc, InternalError)


# -- no database -------------------------------------------------------------------------------


@given(fuzzing.statement_texts)
@fuzzing.fuzz_settings(300)
def test_any_text_parses_or_is_refused(text: str) -> None:
    try:
        statements = parse(text)
    except Error as exc:
        assert refused(exc), exc
        if isinstance(exc, PositionedError) and exc.line is not None:
            # lines end at \n, \r\n or a lone \r (as sqlglot's tokenizer counts them)
            assert 1 <= exc.line <= len(re.split(r"\r\n|\r|\n", text)), (exc, exc.line)
        return
    assert statements


@given(fuzzing.clauses())
@fuzzing.fuzz_settings(200)
def test_currency_clauses_parse_exactly_or_are_refused(clause: str) -> None:
    text = f"SELECT a.name FROM authors a JOIN books b ON a.authorid = b.authorid {clause}"
    try:
        (query,) = parse(text)
    except Error as exc:
        assert refused(exc), exc
        return
    assert isinstance(query, Query)
    for block in query.clauses:
        for spec in block.specs:
            assert 0 <= spec.bound_seconds < float("inf")
    # the extended text is the statement: it parses back to the same clauses
    (again,) = parse(query.to_extended_sql())
    assert isinstance(again, Query) and again.clauses == query.clauses


@given(fuzzing.ddl_scripts())
@fuzzing.fuzz_settings(200)
def test_ddl_scripts_parse_or_are_refused(script: str) -> None:
    try:
        assert parse(script)
    except Error as exc:
        assert refused(exc), exc


# -- against PostgreSQL ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(bookstore_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache file with the bookstore's cache schema, a few authors, cities and reviewers,
    and books and sales cached whole."""
    path = tmp_path_factory.mktemp("fuzz") / "template.duckdb"
    with cache.connect(bookstore_dsn, path, admit_on_miss=False) as conn:
        conn.admin.apply_ddl(SCHEMA + WHOLE)
        conn.admin.refresh("booksall")
        conn.admin.refresh("salesall")
        conn.admin.admit("authorlist_pct", [1, 2, 3, 4, 5])
        conn.admin.admit("citylist_cpct", ["Madison"])
        conn.admin.admit("reviewerlist_pct", [1, 2])
        conn.commit()
    return path


@pytest.fixture(scope="module")
def conn(bookstore_dsn: str, template: Path) -> Iterator[Connection]:
    path = template.with_name("queries.duckdb")
    shutil.copy(template, path)
    connection = cache.connect(bookstore_dsn, path, admit_on_miss=False, autocommit=True)
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def pg(bookstore_dsn: str) -> Iterator[psycopg.Connection[t.Any]]:
    with psycopg.connect(bookstore_dsn, autocommit=True) as connection:
        yield connection


@given(query=fuzzing.queries())
@fuzzing.fuzz_settings(60)
def test_queries_answer_as_postgresql_or_fail_as_it_does(
    conn: Connection, pg: psycopg.Connection[t.Any], query: tuple[str, list[t.Any], str]
) -> None:
    sql, params, clause = query
    try:
        expected = pg.execute(sql, params)
        want = (
            typed(expected.fetchall()),
            [(d.name, d.type_code) for d in expected.description or []],
        )
    except psycopg.Error:
        want = None
    before = fuzzing.cache_contents(conn.engine.store.con)
    for text in (sql, f"{sql} {clause}".strip()):
        try:
            plan = conn.explain(text, params)
        except Error as exc:
            assert refused(exc), (text, params, exc)
        else:
            assert plan is not None
        cur = conn.cursor()
        try:
            cur.execute(text, params)
        except Error as exc:
            assert refused(exc), (text, params, exc)
            assert want is None, f"{text} {params!r}: PostgreSQL answered, the cache said {exc}"
            assert fuzzing.cache_contents(conn.engine.store.con) == before, text
            event("refused, as by PostgreSQL")
            continue
        event("answered " + "+".join(sorted({p["route"] for p in cur.provenance})))
        assert want is not None, f"{text} {params!r}: PostgreSQL refused it, the cache answered"
        got = (typed(cur.fetchall()), [(d[0], d[1]) for d in cur.description or []])
        assert got == want, f"{text} {params!r}: {got} != {want}"


@given(script=fuzzing.ddl_scripts())
@fuzzing.fuzz_settings(40)
def test_ddl_scripts_apply_or_leave_the_cache_as_it_was(
    bookstore_dsn: str, template: Path, script: str
) -> None:
    path = template.with_name("ddl.duckdb")
    shutil.copy(template, path)
    with Admin.open(path, bookstore_dsn) as admin:
        before = fuzzing.cache_contents(admin.store.con)
        try:
            admin.apply_ddl(script)
        except Error as exc:
            assert refused(exc), (script, exc)
            assert fuzzing.cache_contents(admin.store.con) == before, script


@given(
    control=st.sampled_from(["authorlist_pct", "citylist_cpct", "reviewerlist_pct"]),
    value=fuzzing.key_values,
    evict=st.booleans(),
)
@fuzzing.fuzz_settings(60)
def test_control_keys_are_exact_or_refused(
    conn: Connection, control: str, value: object, evict: bool
) -> None:
    (column,) = conn.admin.control_key(control)

    def keys() -> set[object]:
        found = conn.engine.store.con.execute(f"SELECT {column} FROM {control}").fetchall()
        return {k for (k,) in found}

    before, listed = fuzzing.cache_contents(conn.engine.store.con), keys()
    try:
        (conn.admin.evict if evict else conn.admin.admit)(control, [value])
    except Error as exc:
        assert refused(exc), (control, value, exc)
        assert fuzzing.cache_contents(conn.engine.store.con) == before, (control, value)
        return
    # accepted: the value named exactly one key; then the cache is put back as it was
    changed = listed ^ keys()
    assert len(changed) <= 1, changed
    for key in changed:
        if control == "citylist_cpct":
            assert key == value
        else:  # an integer key, read without rounding
            assert decimal.Decimal(key) == decimal.Decimal(str(value).strip())  # type: ignore[arg-type]
        (conn.admin.admit if evict else conn.admin.evict)(control, [key])
    assert keys() == listed


CLI_COMMANDS = st.sampled_from(
    [
        ["parse"],
        ["explain"],
        ["query"],
        ["query", "--json"],
        ["admit", "authorlist_pct"],
        ["evict", "citylist_cpct"],
        ["ddl"],
        ["refresh", "--view"],
    ]
)


@given(
    command=CLI_COMMANDS,
    argument=st.one_of(fuzzing.statement_texts, fuzzing.clauses(), fuzzing.key_values.map(str)),
)
@fuzzing.fuzz_settings(12)
def test_the_cli_answers_or_says_why_in_one_line(
    mtcache_bin: str, bookstore_dsn: str, template: Path, command: list[str], argument: str
) -> None:
    path = template.with_name("cli.duckdb")
    shutil.copy(template, path)
    if command == ["ddl"]:
        script = template.with_name("fuzz.sql")
        script.write_text(argument, encoding="utf-8", errors="surrogateescape")
        argument = str(script)
    env = {**os.environ, "MTCACHE_BACKEND": bookstore_dsn, "MTCACHE_CACHE": str(path)}
    argv = [mtcache_bin, *command, os.fsencode(argument.replace("\0", ""))]
    result = subprocess.run(argv, capture_output=True, env=env, timeout=120, check=False)
    stderr = result.stderr.decode("utf-8", "replace")
    assert "Traceback" not in stderr, stderr
    if result.returncode == 0:
        return
    assert result.returncode in (1, 2), (argv, result.returncode, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtcache"), stderr
    assert "InternalError" not in lines[0], lines[0]
