"""The differential oracle: one query run directly on PostgreSQL and through the cache, the two
outcomes compared - the rows with their Python types and values (in order when the query
orders them), `cursor.description`'s names and type codes, and errors by SQLSTATE - and
ternary-logic partitioning (SQLancer's TLP): a query's rows are exactly the rows of its ``p``,
``NOT p`` and ``p IS NULL`` partitions, through the cache too.

A failure is a `Difference` of one kind; `minimal` makes a failing query smaller while it
fails the same way, for a reproduction a person can read.
"""

from __future__ import annotations

import signal
import threading
import typing as t
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

import cache
from experiments.differential.shapes import Compound, Query, Select

Row = tuple[t.Any, ...]
Typed = tuple[tuple[str, str], ...]

# a statement PostgreSQL runs longer than this is not compared (the cache's backend session
# has the same limit, so both sides would fail alike; locally it would answer)
STATEMENT_TIMEOUT_MS = 20_000
STALLED_SECONDS = 60  # the cache's own limit per statement (PostgreSQL's: the timeout above)
TIMEOUT = "57014"


@dataclass(frozen=True)
class Outcome:
    """What one side answered: rows with their description, or an error's SQLSTATE."""

    rows: tuple[Row, ...] = ()
    description: tuple[tuple[str, int], ...] = ()
    sqlstate: str | None = None  # an error (its message in ``error``)
    error: str = ""
    routes: tuple[str, ...] = ()  # the cache's: per table access, local or remote
    reason: str | None = None  # the cache's: why its plan sends the statement remote

    @property
    def failed(self) -> bool:
        return self.sqlstate is not None

    @property
    def route(self) -> str:
        """local (every access read the cache), remote (none did) or mixed."""
        if self.routes and all(r == "local" for r in self.routes):
            return "local"
        return "mixed" if "local" in self.routes else "remote"


@dataclass(frozen=True)
class Difference:
    kind: str  # values, types, order, description, raised, answered, sqlstate, partition
    detail: str


def typed(rows: t.Iterable[Row]) -> list[Typed]:
    """Each value as (its type, its repr): equal only when type, value and scale are."""
    return [tuple((type(v).__name__, repr(v)) for v in row) for row in rows]


def on_postgres(conn: psycopg.Connection[t.Any], sql: str) -> Outcome:
    try:
        cursor = conn.execute(sql)  # type: ignore[arg-type]
        rows = tuple(cursor.fetchall())
        described = tuple((d.name, d.type_code) for d in cursor.description or ())
        return Outcome(rows, described)
    except psycopg.Error as exc:
        return Outcome(sqlstate=exc.sqlstate or "?", error=str(exc).splitlines()[0])


class Stalled(Exception):
    """The cache took longer than STALLED_SECONDS over one statement."""


def _stalled(signum: int, frame: object) -> None:
    raise Stalled


def on_cache(conn: cache.Connection, sql: str) -> Outcome:
    """The cache's outcome; one that has not come after STALLED_SECONDS (planning that never
    ends, say) is an error of its own, "(stalled)", and the run goes on."""
    cursor = conn.cursor()
    watched = threading.current_thread() is threading.main_thread()
    if watched:
        previous = signal.signal(signal.SIGALRM, _stalled)
        signal.setitimer(signal.ITIMER_REAL, STALLED_SECONDS)
    try:
        cursor.execute(sql)
        rows = tuple(cursor.fetchall())
        described = tuple((d[0], d[1]) for d in cursor.description or ())
    except cache.Error as exc:
        state = getattr(exc, "sqlstate", None) or f"({type(exc).__name__})"
        return Outcome(sqlstate=state, error=str(exc).splitlines()[0])
    except Stalled:
        return Outcome(sqlstate="(stalled)", error=f"no outcome after {STALLED_SECONDS} s")
    finally:
        if watched:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    routes = tuple(p["route"] for p in cursor.provenance)
    reason = cursor.plan.reason if cursor.plan is not None else None
    return Outcome(rows, described, routes=routes, reason=reason)


def compare(expected: Outcome, got: Outcome, ordered: bool) -> Difference | None:
    """How the cache's outcome differs from PostgreSQL's (None: it does not)."""
    if expected.failed or got.failed:
        if not got.failed:
            return Difference(
                "answered",
                f"PostgreSQL raised {expected.sqlstate} ({expected.error}); the cache answered",
            )
        if not expected.failed:
            return Difference(
                "raised", f"the cache raised {got.sqlstate} ({got.error}); PostgreSQL answered"
            )
        if expected.sqlstate != got.sqlstate:
            return Difference(
                "sqlstate",
                f"PostgreSQL {expected.sqlstate} ({expected.error}), "
                f"the cache {got.sqlstate} ({got.error})",
            )
        return None
    if got.description != expected.description:
        return Difference(
            "description",
            f"PostgreSQL {list(expected.description)}, the cache {list(got.description)}",
        )
    want, have = typed(expected.rows), typed(got.rows)
    if ordered and want == have:
        return None
    if sorted(want) != sorted(have):
        kind = "values"
        if len(want) == len(have) and sorted(map(_values, expected.rows)) == sorted(
            map(_values, got.rows)
        ):
            kind = "types"  # the same values, of other types or scales
        return Difference(kind, _first_difference(expected.rows, got.rows))
    if ordered and list(map(_values, expected.rows)) != list(map(_values, got.rows)):
        return Difference("order", "the same rows in another order")
    return None


def _values(row: Row) -> tuple[str, ...]:
    """A row's values compared as numbers and strings, not by type or scale."""
    return tuple(
        str(float(v)) if isinstance(v, int | float) or type(v).__name__ == "Decimal" else repr(v)
        for v in row
    )


def _first_difference(expected: t.Sequence[Row], got: t.Sequence[Row]) -> str:
    want, have = Counter(typed(expected)), Counter(typed(got))
    missing = list((want - have).elements())[:2]
    extra = list((have - want).elements())[:2]
    return (
        f"{len(expected)} rows from PostgreSQL, {len(got)} from the cache; only "
        f"PostgreSQL's: {missing}; only the cache's: {extra}"
    )


def partitions(base: Select, predicate: str) -> list[str]:
    """TLP: the three partitions of ``base`` by ``predicate``."""
    return [
        Select(base.items, base.from_, [*base.where, f"({p})"], with_=base.with_).sql()
        for p in (predicate, f"NOT ({predicate})", f"({predicate}) IS NULL")
    ]


def check_partitions(
    conn: cache.Connection,
    base: Select,
    predicate: str,
    pg: psycopg.Connection[t.Any] | None = None,
) -> Difference | None:
    """The base query's rows through the cache equal its three partitions' rows together
    (``pg``: first checked to be valid queries on PostgreSQL; an invalid predicate is no
    partition)."""
    if pg is not None and any(
        on_postgres(pg, sql).failed for sql in [base.sql(), *partitions(base, predicate)]
    ):
        return None
    whole = on_cache(conn, base.sql())
    parts = [on_cache(conn, sql) for sql in partitions(base, predicate)]
    failed = [p for p in (whole, *parts) if p.failed]
    if failed:
        if whole.failed and all(p.failed for p in parts):
            return None  # an error raised by every one of them (the base's own)
        states = [p.sqlstate for p in (whole, *parts)]
        return Difference("partition", f"errors {states}")
    together = [row for part in parts for row in part.rows]
    if sorted(typed(whole.rows)) != sorted(typed(together)):
        return Difference("partition", _first_difference(whole.rows, together))
    return None


def minimal(query: Query, fails: Callable[[Query], bool], budget: int = 40) -> Query:
    """The smallest variant of a failing query that still fails (greedy, a few dozen tries)."""
    current = query
    tries = 0
    shrinking = True
    while shrinking and tries < budget:
        shrinking = False
        for smaller in current.smaller():
            tries += 1
            if fails(smaller):
                current, shrinking = smaller, True
                break
            if tries >= budget:
                break
    return current


def ordered(query: Query) -> bool:
    return query.ordered


__all__ = [
    "Compound",
    "Difference",
    "Outcome",
    "check_partitions",
    "compare",
    "minimal",
    "on_cache",
    "on_postgres",
    "ordered",
    "partitions",
    "typed",
]
