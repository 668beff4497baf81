"""`mtcache demo`: the dissertation's §2 examples, parsed and normalized against a live backend."""

from __future__ import annotations

import typing as t
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from cache import bookstore
from cache.backend_catalog import fetch_catalog

if t.TYPE_CHECKING:
    from cache.cli import Settings


@dataclass(frozen=True)
class Example:
    name: str
    sql: str
    why: str


Q1 = "SELECT b.title, r.rating FROM books b, reviews r WHERE b.isbn = r.isbn"

EXAMPLES = (
    Example(
        "E1",
        f"{Q1} CURRENCY BOUND 10 MIN ON (b, r)",
        "books and reviews at most 10 minutes old, both from one snapshot",
    ),
    Example(
        "E2",
        f"{Q1} CURRENCY BOUND 10 MIN ON (b), 30 MIN ON (r)",
        "separate classes: books within 10 min, reviews within 30 min, no mutual consistency",
    ),
    Example(
        "E3",
        f"{Q1} CURRENCY BOUND 10 MIN ON (b) BY b.isbn, 30 MIN ON (r) BY r.isbn",
        "each book row on its own, and the reviews of one isbn from one snapshot",
    ),
    Example(
        "E4",
        f"{Q1} CURRENCY BOUND 10 MIN ON (b, r) BY b.isbn",
        "each book consistent with the reviews it joins with; different books may differ",
    ),
    Example(
        "Q2",
        "SELECT s.qty, t.title FROM sales s, "
        f"({Q1.replace('b.title, r.rating', 'b.isbn, b.title')} CURRENCY BOUND 10 MIN ON (b, r)) t "
        "WHERE s.isbn = t.isbn CURRENCY BOUND 5 MIN ON (s, t)",
        "T is computed from B and R, so S, B, R share one snapshot within the tighter 5 min",
    ),
    Example(
        "Q3",
        f"{Q1} AND b.isbn IN (SELECT s.isbn FROM sales s WHERE s.sold_on >= DATE '2003-01-01' "
        "AND s.sold_on < DATE '2004-01-01' CURRENCY BOUND 10 MIN ON (s, b)) "
        "CURRENCY BOUND 10 MIN ON (b, r)",
        "the subquery ties sales to books, books are tied to reviews: one class B, R, S",
    ),
    Example(
        "E1.3",
        "SELECT a.name, a.city FROM authors a WHERE a.authorid IN (1, 2, 3) "
        "CURRENCY BOUND 10 MIN ON (a) BY a.city",
        "authors of one city must be mutually consistent; different cities may differ",
    ),
    Example(
        "view",
        "SELECT v.title, v.rating FROM book_reviews v CURRENCY BOUND 3 MIN ON (v) BY v.isbn",
        "a backend view expands to its base tables books and reviews",
    ),
    Example(
        "default",
        Q1,
        "no clause: traditional semantics, bound 0 and one class, so the backend answers",
    ),
    Example(
        "timeline",
        "BEGIN TIMEORDERED",
        "later queries of the bracket never read older data than earlier ones (§2.3)",
    ),
)


def run_demo(settings: Settings) -> int:
    from cache.cli import describe_class, format_seconds
    from optimizer.normalize_constraint import normalize_constraint
    from sql_ext import Query, parse_one

    console = Console(highlight=False, soft_wrap=True)
    where = settings.backend or f"embedded PostgreSQL under {settings.embedded_root}"
    console.print(f"[bold]mtcache demo[/bold]: backend = {escape(where)}")
    dsn = settings.backend_dsn()
    if not bookstore.is_loaded(dsn):
        console.print("loading the bookstore (authors, books, reviewers, reviews, sales) ...")
        bookstore.load_into(dsn)
    catalog = fetch_catalog(dsn)
    keys = ", ".join(
        f"{name}({', '.join(table.primary_key)})" for name, table in sorted(catalog.tables.items())
    )
    console.print(f"keys reflected from the backend: {escape(keys)}\n")

    for example in EXAMPLES:
        statement = parse_one(example.sql)
        console.print(f"[bold cyan]{example.name}[/bold cyan]  {escape(example.why)}")
        console.print(f"  [dim]{escape(example.sql)}[/dim]")
        if not isinstance(statement, Query):
            console.print(
                f"  parsed: {statement.kind} statement {escape(str(statement.to_json()))}\n"
            )
            continue
        for clause in statement.clauses:
            specs = "; ".join(
                f"{format_seconds(s.bound_seconds)}"
                f"{' ON (' + ', '.join(s.on) + ')' if s.on is not None else ''}"
                f"{' BY ' + ', '.join(s.by) if s.by else ''}"
                for s in clause.specs
            )
            console.print(f"  parsed   block {clause.block}: {escape(specs)}")
        for cls in normalize_constraint(statement, catalog).to_json():
            console.print(f"  [green]normalized[/green] {escape(describe_class(cls))}")
        console.print()
    console.print(
        'Try it yourself: [bold]mtcache explain "SELECT ... CURRENCY BOUND 5 MIN ..."[/bold]; '
        "stop the embedded backend with [bold]mtcache stop[/bold]."
    )
    return 0
