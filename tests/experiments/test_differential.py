"""The differential oracle (experiments/differential) in the suite: every regression it (or a
user) found, kept as a fixture (tests/fixtures/differential.sql), and a short fixed-seed run of
random queries - each through the cache with the cost-based and the guarded plan, compared with
PostgreSQL's answer (values, Python types, description, errors by SQLSTATE), plus ternary-logic
partitioning. TPC-H at scale factor 0.01, every table cached, a session bound of 10 minutes, as
`mtcache experiment differential` runs it."""

from __future__ import annotations

import json
import typing as t
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import cache
from experiments import tpch
from experiments.differential.oracle import compare, on_cache, on_postgres
from experiments.differential.run import PASSES, SCALE, connections, run_queries
from tests.cases import Case, ids, load_cases

CASES = load_cases("differential.sql")
SEED = 25  # the short run's: the same queries every time
QUERIES = 150


@pytest.fixture(scope="module")
def oracle(
    backend_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[psycopg.Connection[t.Any], dict[str, cache.Connection]]]:
    tpch.load(backend_dsn, SCALE, list(tpch.TABLES))
    path = Path(tmp_path_factory.mktemp("differential")) / "cache.duckdb"
    with connections(backend_dsn, path) as opened:
        yield opened


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_each_regression_answers_as_postgres(
    oracle: tuple[psycopg.Connection[t.Any], dict[str, cache.Connection]], case: Case
) -> None:
    pg, conns = oracle
    expected = on_postgres(pg, case.sql)
    ordered = " order by " in case.sql.lower()
    for plan in PASSES:
        got = on_cache(conns[plan], case.sql)
        difference = compare(expected, got, ordered)
        assert difference is None, f"{plan}: {difference}"
        if plan == "guarded" and case.expect.get("local") and not expected.failed:
            assert got.route == "local", json.dumps({"reason": got.reason})


def test_a_short_run_of_random_queries_finds_no_difference(
    oracle: tuple[psycopg.Connection[t.Any], dict[str, cache.Connection]],
) -> None:
    pg, conns = oracle
    report = run_queries(pg, conns, QUERIES, SEED)
    failures = [f"{f.plan}: {f.kind}: {f.detail}\n  {f.reproduction}" for f in report.failures]
    assert not failures, "\n".join(failures)
    assert report.partitions > 0 and report.queries == QUERIES
