"""Data-driven parser tests: tests/fixtures/parse.sql and parse_errors.sql."""

from __future__ import annotations

import pytest
from sqlglot import exp
from sqlglot.tokens import Token

from sql_ext import CreateCachedView, Query, parse, parse_one
from sql_ext.errors import ProgrammingError, SqlSyntaxError
from sql_ext.long_lists import LONG_LIST, ListToken
from sql_ext.nodes import ConstantList
from tests.cases import Case, ids, load_cases

PARSE = load_cases("parse.sql")
ERRORS = load_cases("parse_errors.sql")


@pytest.mark.parametrize("case", PARSE, ids=ids(PARSE))
def test_parse(case: Case) -> None:
    assert parse_one(case.sql).to_json() == case.expect


@pytest.mark.parametrize("case", ERRORS, ids=ids(ERRORS))
def test_parse_error(case: Case) -> None:
    assert case.error is not None
    line, col, text = case.error
    with pytest.raises(SqlSyntaxError) as info:
        parse_one(case.sql)
    error = info.value
    assert isinstance(error, ProgrammingError)
    assert (error.line, error.col) == (line, col), str(error)
    assert text in str(error)
    assert str(error).startswith(f"line {line}, column {col}: ")


def test_fixture_files_cover_every_dissertation_example() -> None:
    names = {c.name.split(" ")[0] for c in PARSE}
    assert {"E1", "E2", "E3", "E4", "E1.1", "E1.2", "E1.3", "Q2", "Q3"} <= names
    assert any("timeordered" in c.name for c in PARSE)


@pytest.mark.parametrize("case", [c for c in PARSE if c.expect["kind"] == "query"], ids=str)
def test_extended_dialect_round_trips(case: Case) -> None:
    """Printing the tree in the mtcache dialect and parsing it again gives the same statement."""
    first = parse_one(case.sql)
    assert isinstance(first, Query)
    assert parse_one(first.to_extended_sql()).to_json() == first.to_json()


def test_script_of_ddl_statements() -> None:
    statements = parse(
        """
        CREATE CONTROL TABLE authorlist_pct (authorid INT);
        -- a comment between statements
        CREATE CACHED VIEW authorcopy AS SELECT * FROM authors
            PRESENCE ON (authorid) IN authorlist_pct;
        DROP CACHED VIEW authorcopy;
        """
    )
    assert [s.kind for s in statements] == ["ddl", "ddl", "ddl"]
    view = statements[1]
    assert isinstance(view, CreateCachedView)
    assert view.presence[0].control == "authorlist_pct"
    assert "PRESENCE" in view.text and "DROP" not in view.text


def test_error_in_second_statement_of_a_script_names_its_line() -> None:
    with pytest.raises(SqlSyntaxError) as info:
        parse("SELECT 1;\nSELECT * FROM t CURRENCY BOUND 5 PARSECS")
    assert (info.value.line, info.value.col) == (2, 34)


def test_parse_one_rejects_two_statements() -> None:
    with pytest.raises(SqlSyntaxError, match="expected one statement, found 2"):
        parse_one("SELECT 1; SELECT 2")


def test_duckdb_output_has_no_extensions() -> None:
    query = parse_one("SELECT b.isbn FROM books b CURRENCY BOUND 1 MIN ON (b) BY b.isbn")
    assert isinstance(query, Query)
    assert query.to_sql("duckdb") == "SELECT b.isbn FROM books AS b"


@pytest.mark.parametrize("depth", [100, 500])
def test_deeply_nested_statements_parse(depth: int) -> None:
    """PostgreSQL accepts hundreds of nested parentheses; so does the cache (sqlglot recurses
    about 20 Python frames per level, past the interpreter's default limit at 50)."""
    inner = "(" * depth + "1" + ")" * depth
    query = parse_one(f"SELECT name FROM books b WHERE b.isbn = {inner} CURRENCY BOUND 1 MIN")
    assert isinstance(query, Query)
    assert query.backend_sql.endswith(inner)


def test_a_statement_nested_past_the_limit_is_a_programming_error() -> None:
    depth = 20_000
    with pytest.raises(ProgrammingError, match="nested too deeply"):
        parse_one("SELECT " + "(" * depth + "1" + ")" * depth)


LISTS = [
    ", ".join(str(i) for i in range(40)),
    ", ".join(f"'k{i}'" for i in range(40)),
    ", ".join(["1.5", "'it''s'", "1e3", "0.000", "'%'", "''"] * 8),
    ", ".join([*map(str, range(39)), "-1"]),  # a sign: the generic rules
    ", ".join([*map(str, range(39)), "NULL"]),
    ", ".join([*map(str, range(39)), "'2024-01-01'::date"]),
    ", ".join([*map(str, range(39)), "'a' 'b'"]),
    ", ".join([*map(str, range(39)), "/* c */ 7"]),
    ", ".join([*map(str, range(39)), "(SELECT 1)"]),
    "SELECT k FROM t",
]


@pytest.mark.parametrize("items", LISTS, ids=range(len(LISTS)))
def test_a_long_constant_list_parses_as_the_generic_rules_parse_it(
    items: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parser reads a long IN list of plain constants straight from its tokens, and the
    printer prints it in one go (a 1 MB list must not take seconds): the tree, its positions
    and its SQL are the generic rules'."""
    from sql_ext.dialect import MTCacheGenerator, MTCacheParser

    sql = f"SELECT a FROM t WHERE a IN ({items}) AND b NOT IN ({items}) CURRENCY BOUND 1 MIN"
    fast = parse_one(sql)
    fast_json = fast.to_json()
    monkeypatch.setattr(MTCacheParser, "FAST_LIST", 10**9)
    monkeypatch.setattr(MTCacheGenerator, "FAST_LIST", 10**9)
    generic = parse_one(sql)
    assert fast.tree == generic.tree
    assert fast_json == generic.to_json()  # printed in one go and item by item
    assert fast_json["sql"] == generic.tree.sql("postgres").replace(" CURRENCY BOUND 1 MIN", "")
    assert fast.tree.sql("duckdb") == generic.tree.sql("duckdb")
    positions = [
        (n.meta.get("line"), n.meta.get("col"), n.meta.get("start")) for n in fast.tree.walk()
    ]
    assert positions == [
        (n.meta.get("line"), n.meta.get("col"), n.meta.get("start")) for n in generic.tree.walk()
    ]


@pytest.mark.parametrize("case", PARSE, ids=ids(PARSE))
def test_copy_tree_copies_as_sqlglot_does(case: Case) -> None:
    """`copy_tree` (a large statement's copy without a deep copy of every meta dict) gives
    what sqlglot's copy gives: equal nodes, metas, comments and printed SQL, and a tree of its
    own (parents inside the copy, nothing shared but immutable values)."""
    from sql_ext.nodes import copy_tree

    statement = parse_one(case.sql)
    tree = (
        statement.tree
        if isinstance(statement, Query)
        else statement.select
        if isinstance(statement, CreateCachedView)
        else None
    )
    if tree is None:
        return  # no tree to copy (control tables, drops, timeline brackets, settings)
    ours, theirs = copy_tree(tree), tree.copy()
    assert ours == theirs
    assert ours.sql("duckdb") == theirs.sql("duckdb") and ours.sql() == theirs.sql()
    assert ours.parent is None  # the copy's root stands alone, as sqlglot's does
    pairs = list(zip(ours.walk(), theirs.walk(), tree.walk(), strict=True))
    for mine, copied, original in pairs:
        assert mine.meta == copied.meta and mine.comments == copied.comments
        assert mine is not original
        if mine is not ours:
            assert mine.parent is not None and mine.parent is not original.parent


def _long(items: list[str]) -> str:
    return ", ".join(items)


LONG_INTS = _long([str(i) for i in range(LONG_LIST + 5)])
LONG_STRINGS = _long([f"'k{i}'" for i in range(LONG_LIST)] + ["'it''s'", "''", "'%'", "'€'"])
SPLICED = [  # (statement, how many lists the tokenizer reads as one token)
    (
        f"SELECT a FROM t WHERE a IN ({LONG_INTS}) AND b NOT IN ({LONG_STRINGS}) "
        "CURRENCY BOUND 1 MIN",
        2,
    ),
    (
        f"SELECT a\nFROM t -- a comment\nWHERE a in (\n  {LONG_INTS.replace(', 7,', ',7 ,')}\n)\n"
        "  AND c = 'x' CURRENCY BOUND 1 MIN ON (t)",
        1,
    ),
    # lists that are not IN lists: in a string, a comment, a quoted name, a dollar quote
    (f"SELECT 'x IN ({LONG_INTS})' AS s, a FROM t WHERE a IN ({LONG_INTS})", 1),
    (f"SELECT a FROM t /* IN ({LONG_INTS}) */ WHERE a IN (1, 2)", 0),
    (f"SELECT a FROM t -- IN ({LONG_INTS})\nWHERE a IN ({LONG_INTS})", 1),
    (f'SELECT "in" ({LONG_INTS}) FROM t', 0),
    (f"SELECT $$ IN ({LONG_INTS}) $$ AS s, a FROM t WHERE a IN ({LONG_INTS})", 1),
    # lists of other constants: one literal each
    (f"SELECT a FROM t WHERE a IN ({LONG_INTS}, -1)", 0),
    (f"SELECT a FROM t WHERE a IN ({LONG_INTS}, 'x')", 0),
    (f"SELECT a FROM t WHERE a IN ({LONG_STRINGS}, 'back\\\\slash')", 0),
    (f"SELECT a FROM t WHERE a IN ({LONG_INTS}, 1.5)", 0),
]


@pytest.mark.parametrize(("sql", "count"), SPLICED, ids=range(len(SPLICED)))
def test_a_long_list_reads_as_its_tokens_read(
    sql: str, count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tokenizer reads a long IN list of constants as one token, the text around it as
    ever (every other token where the whole text puts it); the tree is the one the tokens
    one by one give, positions included, and prints the same SQL."""
    from sql_ext import long_lists
    from sql_ext.dialect import plain_tokens
    from sql_ext.statements import DIALECT

    spliced = DIALECT.tokenize(sql)
    plain = plain_tokens(sql)
    lists = [tk for tk in spliced if type(tk) is ListToken]
    assert len(lists) == count
    where = {(tk.start, tk.end) for tk in plain}

    def key(tk: Token) -> tuple[object, ...]:
        return (tk.token_type, tk.text, tk.line, tk.col, tk.start, tk.end, tk.comments)

    inside = [range(tk.start, sql.index(")", tk.start)) for tk in lists]
    assert [key(tk) for tk in spliced if type(tk) is not ListToken] == [
        key(tk) for tk in plain if not any(tk.start in r for r in inside)
    ]
    for tk in lists:
        assert (tk.start, tk.end) in where  # where its first constant stands
    fast = parse_one(sql)
    monkeypatch.setattr(long_lists, "tokenize", lambda text, plain: plain(text))
    generic = parse_one(sql)
    assert fast.tree == generic.tree
    assert fast.to_json() == generic.to_json()
    assert [n.meta for n in fast.tree.walk()] == [n.meta for n in generic.tree.walk()]


def test_a_long_list_outside_an_in_list_reads_one_constant_at_a_time() -> None:
    """``position(x IN (...))`` is not an IN list: the text is read again without the splice
    and gets PostgreSQL's reading (here a row constructor)."""
    sql = f"SELECT position('1' IN ({LONG_INTS})) FROM t"
    tree = parse_one(sql).tree
    assert not list(tree.find_all(ConstantList))
    assert len(list(tree.find_all(exp.Literal))) == LONG_LIST + 5 + 1


def test_a_long_list_of_strings_with_parameters_reads_percent_signs_as_psycopg() -> None:
    sql = f"SELECT a FROM t WHERE a IN ({_long(['%%s', 'x%%y'] * LONG_LIST)}) AND b = %s"
    sql = sql.replace("%%s", "'%%s'").replace("x%%y", "'x%%y'")
    node = next(parse(sql, percent=True)[0].tree.find_all(ConstantList))
    assert node.constants[:2] == ("%s", "x%y")


def test_a_nul_byte_is_refused_where_it_stands() -> None:
    """libpq sends a statement's text up to its first NUL byte: PostgreSQL would run half of it
    (``column "name" does not exist``, or another statement); the cache refuses it, at it."""
    for sql, where in (("SELECT 'a\0b' AS name", (1, 10)), ("SELECT 1;\n SELECT 2\0", (2, 10))):
        with pytest.raises(SqlSyntaxError, match="holds a NUL byte") as raised:
            parse(sql)
        assert (raised.value.line, raised.value.col) == where


def test_show_cache_status_for_views_names_them_as_sql_folds_names() -> None:
    statement = parse_one('SHOW CACHE STATUS FOR VIEW AuthorCopy, "Book Copy"')
    assert statement.kind == "inspect"
    assert (statement.what, statement.views) == ("cache status", ("authorcopy", "Book Copy"))
    assert parse_one("SHOW CACHE STATUS").views == ()
