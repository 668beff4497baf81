"""The rewrite rules of `optimizer.postgres.semantics` and the type inference under them, without a
database: which nodes are compared without trailing blanks, padded again, typed, and which
statements cannot be made exactly PostgreSQL's (their answers are checked against PostgreSQL
in tests/optimizer/test_pg_semantics.py)."""

from __future__ import annotations

import pytest
from sqlglot import exp

from optimizer.analysis.analyze import analyze
from optimizer.postgres.expression_types import PgType, combine
from optimizer.postgres.semantics import Semantics
from sql_ext import parse_one
from sql_ext.catalog import Catalog, Column, Table
from sql_ext.params import NODE_ID
from tests.paths import ROOT

CATALOG = Catalog(
    tables={
        "t": Table(
            name="t",
            columns=(
                Column("id", "integer", nullable=False),
                Column("code", "character(5)"),
                Column("flag", "character(1)"),
                Column("label", "character varying(10)"),
                Column("note", "text"),
                Column("price", "numeric(12,2)"),
                Column("ratio", "double precision"),
                Column("icu", "text", byte_order=False),
                Column("loose", "text", byte_order=False, deterministic=False),
            ),
            primary_key=("id",),
        )
    },
    views={},
    text_byte_order=True,
)


def semantics(sql: str, catalog: Catalog = CATALOG) -> tuple[Semantics, exp.Expr]:
    query = parse_one(f"{sql} CURRENCY BOUND 10 MIN")
    return analyze(query, catalog).semantics, query.tree


def nodes(tree: exp.Expr, numbers: object) -> list[str]:
    by_id = {n.meta.get(NODE_ID): n for n in tree.walk()}
    return sorted(by_id[number].sql(dialect="postgres") for number in numbers)  # type: ignore[attr-defined]


def test_what_char_is_compared_with_loses_its_trailing_blanks() -> None:
    found, tree = semantics(
        "SELECT id FROM t WHERE code = 'AB ' AND flag IN ('A', label) "
        "AND note = 'x' AND code BETWEEN 'A' AND %s"
    )
    assert found.blocker is None
    assert nodes(tree, found.rtrim) == ["%s", "'A'", "'A'", "'AB '", "label"]


def test_patterns_and_printing_functions_read_char_padded() -> None:
    found, tree = semantics(
        "SELECT concat(code, flag), concat_ws('-', code) FROM t "
        "WHERE code LIKE 'A%' AND label LIKE 'B%'"
    )
    assert found.blocker is None
    assert sorted(found.rpad.values()) == [1, 5, 5, 5]
    assert "label" not in nodes(tree, found.rpad)


def test_char_outputs_are_padded_to_their_width() -> None:
    found, _ = semantics("SELECT code, flag, upper(code), coalesce(code, 'none') FROM t")
    assert found.output_widths == {0: 5, 1: 1, 3: 0}  # 3: padded in the statement itself


def test_numeric_casts_keep_their_scale_and_exponents_are_exact() -> None:
    found, _ = semantics("SELECT price::numeric, id::numeric, '1.250'::numeric, 1e3 FROM t")
    assert found.blocker is None
    assert sorted(found.decimal_scales.values()) == [0, 2, 3]
    # written out at their own precision: a DECIMAL(38, s) would make DuckDB round the values
    # it is combined with in CASE or COALESCE (it keeps 38 digits)
    assert sorted(found.exact_numbers.values()) == [
        "CAST('1.250' AS DECIMAL(4, 3))",
        "CAST('1000' AS DECIMAL(4, 0))",
    ]


def test_date_part_is_a_double() -> None:
    found, tree = semantics("SELECT date_part('year', DATE '1995-01-22') FROM t")
    assert nodes(tree, found.doubles) == ["DATE_PART('year', CAST('1995-01-22' AS DATE))"]


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT sum(ratio) FROM t", "floating-point"),
        ("SELECT round(ratio, 1) FROM t", "rounds a double"),
        ("SELECT extract(epoch FROM TIMESTAMP '1995-01-01 10:00') FROM t", "extracts epoch"),
        ("SELECT date_part('second', TIMESTAMP '1995-01-01 10:00') FROM t", "date_part"),
        ("SELECT label::char(3) FROM t", "casts to"),
        ("SELECT ratio::numeric(5,1) FROM t", "from a double"),
        ("SELECT bit_length(code) FROM t", "bit_length"),
        ("SELECT ratio::text FROM t", "float to text"),
        ("SELECT note FROM t ORDER BY icu", "collation"),
        ("SELECT icu AS k FROM t ORDER BY 1", "collation"),
        ("SELECT min(icu) FROM t", "collation"),
        ("SELECT id FROM t WHERE loose = 'a'", "nondeterministic"),
        ("SELECT DISTINCT coalesce(code, 'x') FROM t", "several lengths"),
        ("SELECT id FROM t WHERE code = (SELECT label FROM t WHERE id = 1)", "subquery"),
        ("SELECT 123456789012345678901234567890123456789.5 FROM t", "digits"),
    ],
)
def test_what_cannot_be_made_exact_stays_remote(sql: str, reason: str) -> None:
    found, _ = semantics(sql)
    assert found.blocker is not None and reason in found.blocker, found.blocker


def test_ordering_text_follows_the_database_collation() -> None:
    icu = Catalog(tables=CATALOG.tables, views={}, text_byte_order=False)
    assert semantics("SELECT note FROM t ORDER BY note", icu)[0].blocker is not None
    assert semantics('SELECT note FROM t ORDER BY note COLLATE "C"', icu)[0].blocker is None
    assert semantics("SELECT note FROM t ORDER BY note")[0].blocker is None
    assert semantics("SELECT id FROM t WHERE note = 'a' ORDER BY id", icu)[0].blocker is None


def test_combined_types_follow_postgres_resolution() -> None:
    char5, char1 = PgType("char", 5), PgType("char", 1)
    assert combine([char5, PgType("null")]) == char5
    assert combine([char5, char1]) == PgType("char")
    assert combine([char5, PgType("string")]) == PgType("char")
    assert combine([PgType("string"), PgType("string")]).kind == "text"
    assert combine([PgType("integer", 4), PgType("integer", 8)]) == PgType("integer", 8)
    assert combine([PgType("numeric", scale=2), PgType("integer", 4)]).kind == "numeric"
    assert combine([PgType("float"), PgType("numeric")]).kind == "float"
    # every string type converts to every other implicitly: PostgreSQL keeps the first
    assert combine([char5, PgType("varchar")]).kind == "char"
    assert combine([PgType("varchar"), char5]).kind == "varchar"
    assert combine([char5, PgType("text")]).kind == "char"


def test_the_document_lists_every_entry() -> None:
    """docs/postgres-semantics.md lists the allowlist as it is: every entry's name."""

    from optimizer.postgres.allowlist import ENTRIES

    text = (ROOT / "docs" / "postgres-semantics.md").read_text()
    missing = [e.name for e in ENTRIES if e.name.replace("|", "\\|") not in text]
    assert not missing, missing


def test_a_chain_of_double_arithmetic_grows_its_local_form_linearly() -> None:
    """Each double-precision operation's overflow checks read its operands once (found by the
    oracle: checks copying them made a chain of 12 operations 7^12 nodes, and planning never
    ended)."""
    from optimizer.postgres.allowlist import BY_NAME

    rewrite = BY_NAME["+ - * / of double precision"].rewrite
    assert rewrite is not None
    sizes = []
    for depth in (6, 12, 24):
        node: exp.Expr = exp.column("ratio")
        for level in range(depth):
            operation = (exp.Mul, exp.Add, exp.Div)[level % 3]
            node = rewrite(operation(this=node, expression=exp.Literal.number(1.5)))
        sizes.append(len(list(node.walk())))
    assert sizes[2] - sizes[1] == 2 * (sizes[1] - sizes[0]), sizes


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("SELECT array_agg(id) FROM t", "array without ORDER BY"),
        (
            "SELECT x FROM (SELECT array_agg(id ORDER BY id) AS x FROM t) s",
            "other than as an output",
        ),
        ("SELECT array_agg(id ORDER BY id) AS a FROM t ORDER BY a", "orders by the array"),
        (
            "SELECT DISTINCT array_agg(id ORDER BY id) FROM t GROUP BY code",
            "other than as an output",
        ),
        ("SELECT array_agg(DISTINCT id) FROM t", "DISTINCT values"),
        ("SELECT code, 2, count(*) FROM t GROUP BY CUBE (code, 2)", "output column's position"),
        ("SELECT code, 'x'::text AS c FROM t GROUP BY ROLLUP (code, c) ORDER BY c", "orders by it"),
        ("SELECT code, 5 FROM t GROUP BY ROLLUP (code, 5::int)", "besides it"),
        ("SELECT code, 'x'::text, 'x'::text FROM t GROUP BY ROLLUP (code, 'x'::text)", "besides"),
        (
            "SELECT code || 'x'::text FROM t GROUP BY ROLLUP (code, 'x'::text), code || 'x'::text",
            "holding it",
        ),
        ("SELECT DISTINCT code, 'x'::text FROM t GROUP BY ROLLUP (code, 'x'::text)", "duplicates"),
        ("SELECT json_agg(id) FROM t", "does not build json"),
        ("SELECT corr(ratio, ratio) FROM t", "order of additions"),
        ("SELECT sum(ratio) FROM t", "order of additions"),
        ("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ratio) FROM t", "ordered-set"),
        ("SELECT regexp_replace(note, 'a|ab', '') FROM t", "alternation"),
        ("SELECT regexp_replace(note, 'a*a', '') FROM t", "ends at the longest"),
        ("SELECT note ~ '(?m)a.b' FROM t", "embedded options"),
        ("SELECT note ~* '(?i)k' FROM t", "embedded options"),
        ("SELECT note ~ '***=k' FROM t", "embedded options"),
        ("SELECT note ~ '^*a' FROM t", "nothing to repeat"),
        ("SELECT note SIMILAR TO '(?i)k%' FROM t", "not a literal the cache translates"),
    ],
)
def test_a_remote_reason_names_the_construct_and_why(sql: str, why: str) -> None:
    blocker = semantics(sql)[0].blocker
    assert blocker is not None and why in blocker, blocker


def test_what_is_built_on_a_grouping_set_constant_reads_the_constant() -> None:
    """PostgreSQL computes ``'x' || 'a'`` once, as a constant's, though ``'x'`` is grouped by
    in a ROLLUP (NULL in the sets without it): DuckDB is given a scalar subquery there."""
    found, tree = semantics(
        "SELECT code, 'x'::text, 'x'::text || code, count('x'::text) FROM t "
        "GROUP BY ROLLUP (code, 'x'::text) HAVING 'x'::text IS NOT NULL"
    )
    assert found.blocker is None
    reads = nodes(tree, found.constant_reads)
    assert reads == ["CAST('x' AS TEXT)", "CAST('x' AS TEXT)"]  # (the || and the HAVING)


@pytest.mark.parametrize(
    ("sql", "tied"),
    [
        ("SELECT array_agg(note ORDER BY id) FROM t", False),  # the primary key
        (
            "SELECT array_agg(a.note ORDER BY a.id, b.id) FROM t a LEFT JOIN t b ON b.id = a.id",
            False,
        ),
        ("SELECT array_agg(a.note ORDER BY a.id) FROM t a JOIN t b ON b.id = a.id", True),
        ("SELECT array_agg(note ORDER BY code) FROM t", True),
        ("SELECT array_agg(code ORDER BY code DESC) FROM t", False),  # the value itself
        ("SELECT array_agg(price * 2 + id ORDER BY price, id) FROM t", False),
        ("SELECT array_agg(ratio ORDER BY ratio) FROM t", True),  # (0 and -0 tie)
        ("SELECT array_agg(ratio ORDER BY id) FROM t", False),
        ("SELECT array_agg(ratio > 1 ORDER BY ratio) FROM t", True),  # (0 and -0 tie)
        ("SELECT array_agg(id ORDER BY (SELECT 1)) FROM t", True),
        ("SELECT x.a FROM (SELECT 1) s, LATERAL (SELECT array_agg(note ORDER BY id) AS a) x", True),
        ("SELECT string_agg(note, ',' ORDER BY note) FILTER (WHERE id > 1) FROM t", False),
        ("SELECT string_agg(note, ',' ORDER BY label) FROM t", True),
        (
            "SELECT string_agg(CASE WHEN id > 1 THEN note END, ',' "
            "ORDER BY CASE WHEN id > 1 THEN note END) FROM t",
            False,
        ),
        ("SELECT array_agg(x.note ORDER BY x.id) FROM (SELECT id, note FROM t) x", True),
    ],
)
def test_an_ordered_aggregate_is_local_only_where_no_different_values_tie(
    sql: str, tied: bool
) -> None:
    blocker = semantics(sql)[0].blocker
    assert (blocker is not None and "may tie" in blocker) if tied else blocker is None, blocker
