"""Normalization against the real backend: tests/fixtures/normalize.sql, keys reflected live."""

from __future__ import annotations

import psycopg
import pytest

from cache.backend.reflect import fetch_catalog
from optimizer.analysis.normalize_constraint import normalize_constraint
from sql_ext import Query, parse_one
from sql_ext.catalog import Catalog
from sql_ext.errors import ProgrammingError
from tests.cases import Case, ids, load_cases

CASES = load_cases("normalize.sql")


def normalized(sql: str, catalog: Catalog) -> list[dict[str, object]]:
    query = parse_one(sql)
    assert isinstance(query, Query)
    return normalize_constraint(query, catalog).to_json()


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_normalize(case: Case, bookstore_catalog: Catalog) -> None:
    if case.error is None:
        assert normalized(case.sql, bookstore_catalog) == case.expect
        return
    line, col, text = case.error
    with pytest.raises(ProgrammingError) as info:
        normalized(case.sql, bookstore_catalog)
    assert (getattr(info.value, "line", None), getattr(info.value, "col", None)) == (line, col)
    assert text in str(info.value)


def test_keys_are_reflected_from_the_backend(bookstore_catalog: Catalog) -> None:
    reviews = bookstore_catalog.table("reviews")
    assert reviews is not None
    assert reviews.primary_key == ("reviewid",)
    assert ("isbn", "reviewerid") in reviews.candidate_keys()
    assert bookstore_catalog.view("book_reviews") is not None


def test_classes_are_disjoint_and_cover_every_instance(bookstore_catalog: Catalog) -> None:
    for case in CASES:
        if case.error is not None:
            continue
        query = parse_one(case.sql)
        assert isinstance(query, Query)
        constraint = normalize_constraint(query, bookstore_catalog)
        seen = [i for c in constraint.classes for i in c.instances]
        assert len(seen) == len(set(seen)), case.name
        assert set(seen) == set(constraint.instances), case.name


def test_a_new_key_on_the_backend_changes_the_normal_form(backend_dsn: str) -> None:
    """Keys come from the live catalog: adding a UNIQUE constraint adds a dependency."""
    sql = "SELECT * FROM items i CURRENCY BOUND 1 MIN BY i.code, i.name"
    with psycopg.connect(backend_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS items")
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, code text NOT NULL, name text)")
        before = normalized(sql, fetch_catalog(backend_dsn))
        conn.execute("ALTER TABLE items ADD CONSTRAINT items_code UNIQUE (code)")
        after = normalized(sql, fetch_catalog(backend_dsn))
    assert before == [
        {"bound_seconds": 60.0, "tables": ["items"], "by": ["items.code", "items.name"]}
    ]
    assert after == [{"bound_seconds": 60.0, "tables": ["items"], "by": ["items.code"]}]


def test_nullable_unique_key_is_not_a_dependency(backend_dsn: str) -> None:
    with psycopg.connect(backend_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS gadgets")
        conn.execute("CREATE TABLE gadgets (id int PRIMARY KEY, serial text UNIQUE, name text)")
    catalog = fetch_catalog(backend_dsn)
    assert normalized(
        "SELECT * FROM gadgets g CURRENCY BOUND 1 MIN BY g.serial, g.name", catalog
    ) == [{"bound_seconds": 60.0, "tables": ["gadgets"], "by": ["gadgets.name", "gadgets.serial"]}]


def test_a_view_definition_sqlglot_cannot_read_stays_one_opaque_input() -> None:
    """Planning is pure: a catalog value is enough (no database needed for this rule)."""
    from sql_ext.catalog import Column, Table, View

    catalog = Catalog(
        tables={"t": Table("t", (Column("id", "integer", nullable=False),), primary_key=("id",))},
        views={"odd": View("odd", "SELECT FROM WHERE ((")},
    )
    assert normalized("SELECT * FROM odd o, t CURRENCY BOUND 1 MIN ON (o)", catalog) == [
        {"bound_seconds": 60.0, "tables": ["odd"], "by": []},
        {"bound_seconds": 0.0, "tables": ["t"], "by": []},
    ]
    with pytest.raises(ProgrammingError, match=r"BY column o\.x is not a column"):
        normalized("SELECT * FROM odd o CURRENCY BOUND 1 MIN BY o.x", catalog)
