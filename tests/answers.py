"""Comparing the cache's answer with PostgreSQL's to the same query: values *and* the Python
types psycopg gives them (a ``Decimal('1.50')`` is not a ``Decimal('1.5')``, an ``int`` not a
``Decimal``), and `cursor.description`'s names and type codes."""

from __future__ import annotations

import contextlib
import typing as t
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

import cache

Row = tuple[t.Any, ...]


@contextlib.contextmanager
def cached_copies(backend: str, path: Path, ddl: str) -> Iterator[cache.Connection]:
    """A connection to a cache whose schema is ``ddl`` (admissions off), every view pulled."""
    with cache.connect(backend=backend, cache_path=path, admit_on_miss=False) as conn:
        conn.admin.apply_ddl(ddl)
        conn.admin.refresh()
        yield conn


def typed(rows: t.Iterable[Row]) -> list[tuple[tuple[str, str], ...]]:
    """Each value as (its type, its repr): equal only when type, value and scale are."""
    return [tuple((type(v).__name__, repr(v)) for v in row) for row in rows]


@dataclass
class Answer:
    rows: list[Row]
    routes: list[str]
    reason: str | None

    @property
    def route(self) -> str:
        """local (every access read the cache), remote (none did) or mixed."""
        if self.routes and all(r == "local" for r in self.routes):
            return "local"
        return "mixed" if "local" in self.routes else "remote"


def assert_same_answer(
    conn: cache.Connection, backend: str, cached_sql: str, pg_sql: str, params: t.Any = None
) -> Answer:
    """Run ``cached_sql`` through the cache and ``pg_sql`` through psycopg: the same rows (in
    order when the statement orders them), the same types, the same description."""
    cursor = conn.cursor()
    cursor.execute(cached_sql, params)
    rows = cursor.fetchall()
    description = [(d[0], d[1]) for d in cursor.description or []]
    with psycopg.connect(backend) as pg:
        pg_cursor = pg.execute(pg_sql, params)
        want = pg_cursor.fetchall()
        want_description = [(d.name, d.type_code) for d in pg_cursor.description or []]
    got_typed, want_typed = typed(rows), typed(want)
    if " order by " not in pg_sql.lower():
        got_typed, want_typed = sorted(got_typed), sorted(want_typed)
    assert got_typed == want_typed, f"{pg_sql}\n  cache: {rows}\n  pg:    {want}"
    assert description == want_description, pg_sql
    routes = [p["route"] for p in cursor.provenance]
    return Answer(rows, routes, cursor.plan.reason if cursor.plan else None)
