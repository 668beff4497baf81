"""The 22 TPC-H queries (validation parameters, SF 0.01) with every table cached as a fully
materialized view, refreshed just before: answered by the cache wherever it holds what they
need, and always exactly PostgreSQL's answer (values and Python types, description)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import cache
from experiments import tpch
from experiments.tpch_queries import QUERIES, WITH_SUBQUERIES, query, with_clause
from tests.answers import Answer, assert_same_answer

SCALE = 0.01
# with a clause on the outer block only: the queries without WHERE/HAVING subqueries
OUTER_LOCAL = frozenset(QUERIES) - WITH_SUBQUERIES


@pytest.fixture(scope="module")
def backend(backend_dsn: str) -> str:
    tpch.load(backend_dsn, SCALE, list(tpch.TABLES))
    return backend_dsn


@pytest.fixture(scope="module")
def conn(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[cache.Connection]:
    path = tmp_path_factory.mktemp("tpch") / "cache.duckdb"
    with cache.connect(backend=backend, cache_path=path, admit_on_miss=False) as conn:
        conn.admin.apply_ddl(
            ";\n".join(
                f"CREATE CACHED VIEW {t}_copy AS SELECT * FROM {t} REFRESH EVERY 10 MIN"
                for t in tpch.TABLES
            )
        )
        conn.admin.refresh()
        yield conn


def run_all(conn: cache.Connection, backend: str, clause: str) -> dict[int, Answer]:
    answers = {}
    for number in QUERIES:
        sql = query(number, SCALE)
        answers[number] = assert_same_answer(conn, backend, with_clause(sql, clause), sql)
    return answers


def test_a_clause_on_the_outer_block_answers_queries_without_subqueries_locally(
    conn: cache.Connection, backend: str
) -> None:
    answers = run_all(conn, backend, "CURRENCY BOUND 10 MIN")
    routes = {n: a.route for n, a in answers.items()}
    assert {n for n in OUTER_LOCAL if routes[n] != "local"} == set(), {
        n: answers[n].reason for n in OUTER_LOCAL
    }


def test_a_session_bound_answers_all_22_locally(conn: cache.Connection, backend: str) -> None:
    """Q17 and Q22 average inside subqueries: DuckDB divides with the cache's own PostgreSQL
    division (docs/postgres-semantics.md)."""
    conn.currency_bound = "10 min"
    try:
        answers = run_all(conn, backend, "")
    finally:
        conn.currency_bound = None
    remote = {n: a.reason for n, a in answers.items() if a.route != "local"}
    assert not remote, remote


def test_q1_is_answered_from_a_derived_view_of_its_groups(
    conn: cache.Connection, backend: str
) -> None:
    """TPC-H Q1 kept as a derived view (its SELECT, without its ORDER BY): Q1 itself is
    then read from the view's few groups, not from the cached lineitem, and its answer is
    PostgreSQL's (values, Python types, description); so is a coarser grouping of it."""
    sql = query(1, SCALE)
    definition = sql[: sql.index("order by")]
    conn.admin.apply_ddl(f"CREATE CACHED VIEW q1_groups AS {definition} REFRESH EVERY 10 MIN")
    try:
        conn.admin.refresh("q1_groups")
        answer = assert_same_answer(conn, backend, with_clause(sql, "CURRENCY BOUND 10 MIN"), sql)
        assert answer.route == "local", answer.reason
        cur = conn.cursor()
        cur.execute("EXPLAIN " + with_clause(sql, "CURRENCY BOUND 10 MIN"))
        assert any("DerivedScan" in row[0] and "q1_groups" in row[0] for row in cur.fetchall())
        coarser = (
            "select l_returnflag, sum(l_quantity) as sum_qty, avg(l_discount) as avg_disc, "
            "count(*) as count_order from lineitem where l_shipdate <= date '1998-12-01' "
            "- interval '90 days' group by l_returnflag order by l_returnflag"
        )
        bounded = with_clause(coarser, "CURRENCY BOUND 10 MIN")
        answer = assert_same_answer(conn, backend, bounded, coarser)
        assert answer.route == "local", answer.reason
    finally:
        conn.admin.apply_ddl("DROP CACHED VIEW q1_groups")
