"""The cache's numeric division (`optimizer.postgres.numeric`), used for averages and divisions
of numerics answered locally, against PostgreSQL's own: the same value at the same scale, for
operands of many magnitudes and scales (property-based, hypothesis)."""

from __future__ import annotations

import decimal

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optimizer.postgres import numeric as pg_numeric


def numerics(max_scale: int) -> st.SearchStrategy[decimal.Decimal]:
    """Values as numeric(p, s) columns hold them: up to 30 digits, scale 0..max_scale."""
    return st.builds(
        lambda digits, scale: decimal.Decimal(digits).scaleb(-scale),
        st.integers(min_value=-(10**30), max_value=10**30),
        st.integers(min_value=0, max_value=max_scale),
    )


@pytest.fixture(scope="module")
def pg(backend_dsn: str) -> psycopg.Connection[tuple[object, ...]]:
    conn = psycopg.connect(backend_dsn, autocommit=True)
    yield conn  # type: ignore[misc]
    conn.close()


def postgres_divide(pg: psycopg.Connection, a: object, b: object) -> decimal.Decimal:  # type: ignore[type-arg]
    row = pg.execute("SELECT %s::numeric / %s::numeric", (str(a), str(b))).fetchone()
    assert row is not None
    return row[0]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=numerics(12), b=numerics(12).filter(lambda v: v != 0))
def test_division_is_postgres_division(
    pg: psycopg.Connection,
    a: decimal.Decimal,  # type: ignore[type-arg]
    b: decimal.Decimal,
) -> None:
    want = postgres_divide(pg, a, b)
    got = pg_numeric.divide(a, b)
    assert (got, got.as_tuple().exponent) == (want, want.as_tuple().exponent)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    total=st.one_of(numerics(6), st.integers(-(10**25), 10**25)),
    count=st.integers(min_value=1, max_value=10**12),
)
def test_average_is_sum_over_count(pg: psycopg.Connection, total: object, count: int) -> None:  # type: ignore[type-arg]
    want = postgres_divide(pg, total, count)
    got = pg_numeric.average(total, count)  # type: ignore[arg-type]
    assert got is not None
    assert (got, got.as_tuple().exponent) == (want, want.as_tuple().exponent)


def test_division_by_zero_is_postgres_error() -> None:
    with pytest.raises(pg_numeric.DivisionByZero):
        pg_numeric.divide(decimal.Decimal("1.5"), 0)
    assert pg_numeric.average(None, 0) is None and pg_numeric.average(5, 0) is None
