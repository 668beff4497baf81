"""`mtcache demo`: the dissertation's §2 examples, parsed and normalized against a live backend,
then the cache at work: the Fig 3.2 cache schema, admissions, queries answered locally or by
the backend under their bounds (with provenance), an EXPLAIN with its SwitchUnions, and the
counters. The cache part uses its own file beside the cache (``demo.duckdb``), made afresh."""

from __future__ import annotations

import json
import shutil
import subprocess
import typing as t
from dataclasses import dataclass
from pathlib import Path

import psycopg
from rich.console import Console
from rich.markup import escape
from sqlalchemy import create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import cache
from cache.backend.reflect import fetch_catalog
from cache.engine.admin import Admin
from cache.server.process import client_environment, serving_process
from cache.sqla import engine_url, provenance
from cache.store.counters import Counter
from cache.tools import bookstore
from cache.tools.formatting import describe_class
from cache.tools.settings import Settings
from optimizer.analysis.normalize_constraint import normalize_constraint
from sql_ext import Query, parse_one
from sql_ext.errors import ProgrammingError
from sql_ext.nodes import format_duration

SCHEMA = bookstore.CACHE_SCHEMA_FILE
SALES_VIEW = "CREATE CACHED VIEW salescopy AS SELECT saleid, isbn, sold_on, qty FROM sales"


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
                f"{format_duration(s.bound_seconds)}"
                f"{' ON (' + ', '.join(s.on) + ')' if s.on is not None else ''}"
                f"{' BY ' + ', '.join(s.by) if s.by else ''}"
                for s in clause.specs
            )
            console.print(f"  parsed   block {clause.block}: {escape(specs)}")
        for cls in normalize_constraint(statement, catalog).to_json():
            console.print(f"  [green]normalized[/green] {escape(describe_class(cls))}")
        console.print()
    cache_at_work(console, dsn, settings.cache_path.parent / "demo.duckdb")
    console.print(
        "Next: cache a table of your own (README.md, Quickstart): "
        "[bold]. .venv/bin/activate[/bold], then [bold]mtcache psql[/bold] opens psql on this "
        "PostgreSQL. The manual is "
        "docs/index.md; stop the embedded backend with [bold]mtcache stop[/bold]."
    )
    return 0


AUTHOR = "SELECT a.name, a.city FROM authors a WHERE a.authorid = %s"
AUTHOR_BOOKS = (
    "SELECT a.name, b.title FROM authors a JOIN books b ON a.authorid = b.authorid "
    "WHERE a.authorid = 4 ORDER BY b.title"
)
SALES_BY_TYPE = (
    "SELECT b.type, sum(s.qty) FROM sales s JOIN books b ON s.isbn = b.isbn "
    "WHERE b.authorid = 3 GROUP BY b.type ORDER BY 1"
)


def cache_at_work(console: Console, dsn: str, path: Path) -> None:
    for leftover in (path, path.with_name(path.name + ".wal")):
        leftover.unlink(missing_ok=True)
    console.rule("[bold]the cache at work[/bold]")
    console.print(f"cache schema {SCHEMA.name} (Fig 3.2) in {escape(str(path))}, plus sales:")
    with cache.connect(backend=dsn, cache_path=path) as conn:
        cur = conn.cursor()
        for statement in [*SCHEMA.read_text().split(";"), SALES_VIEW]:
            if statement.strip():
                cur.execute(statement)
        for admission in (
            "INSERT INTO citylist_csct VALUES ('Madison')",
            "INSERT INTO authorlist_pct VALUES (4), (8)",
        ):
            cur.execute(admission)
            console.print(f"  [dim]{admission}[/dim]: {escape(cur.messages[-1][1])}")
        conn.admin.refresh("salescopy")
        console.print()

        def run(sql: str, params: tuple[t.Any, ...] | None, why: str) -> None:
            cur.execute(sql, params)
            rows = cur.fetchall()
            shown = ", ".join(str(r) for r in rows[:3]) + (" ..." if len(rows) > 3 else "")
            console.print(f"[bold cyan]{escape(why)}[/bold cyan]")
            console.print(f"  [dim]{escape(sql)}[/dim]" + (f"  {params}" if params else ""))
            console.print(f"  {len(rows)} rows: {escape(shown)}")
            for p in cur.provenance:
                where = (
                    f"local from {p['view']}, {p['currency_seconds']:.1f}s old, "
                    f"snapshot {p['snapshot_ids']}"
                    if p["route"] == "local"
                    else "remote (PostgreSQL, current)"
                )
                console.print(f"  [green]{p['table']}[/green]: {escape(where)}")
            console.print()

        bound = "CURRENCY BOUND 10 MIN"
        run(f"{AUTHOR} {bound}", (4,), "an admitted author: the guard passes")
        run(
            f"{AUTHOR} {bound}",
            (5,),
            "author 5 is not admitted: a presence miss goes to the "
            "backend, and admits the author in the background",
        )
        conn.admin.wait_for_admissions()
        run(f"{AUTHOR} {bound}", (5,), "... so the same query now hits")
        run(
            f"{AUTHOR} CURRENCY BOUND 50 MS",
            (4,),
            "a bound below the refresh delay: no copy can ever be that fresh, the backend answers",
        )
        run(AUTHOR, (4,), "no clause: traditional semantics, the backend answers")
        run(
            f"{AUTHOR_BOOKS} {bound} ON (a, b)",
            None,
            "an author with her books, one snapshot: both from the cache (the books found "
            "through the join on authorid)",
        )
        run(
            f"{SALES_BY_TYPE} {bound} ON (s), 10 MIN ON (b)",
            None,
            "mixed: sales from the cache, the books of author 3 (not admitted) from the backend",
        )
        conn.admin.wait_for_admissions()
        cur.execute(f"EXPLAIN {AUTHOR_BOOKS} {bound} ON (a, b)")
        console.print(
            "[bold cyan]EXPLAIN: a SwitchUnion per cached access, with its guard[/bold cyan]"
        )
        for (line,) in cur.fetchall():
            console.print(f"  {escape(line)}")
        console.print()
    orm_at_work(console, dsn, path)
    with Admin.open(path) as admin:
        counters = admin.status()["counters"]
    console.print(
        "counters: " + ", ".join(f"{k} {v}" for k, v in sorted(counters.items())), soft_wrap=True
    )  # (one line, however narrow the terminal)
    console.print()
    server_at_work(console, dsn, path)


class _Base(DeclarativeBase):
    pass


class Author(_Base):
    """The bookstore's authors, as an ORM application maps them (the columns it reads)."""

    __tablename__ = "authors"
    authorid: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str]
    city: Mapped[str]


def orm_at_work(console: Console, dsn: str, path: Path) -> None:
    """One ORM query through SQLAlchemy's ``postgresql+mtcache`` engine on the same cache."""
    engine = create_engine(engine_url(dsn, path, background=False))
    try:
        with Session(engine) as session:
            query = select(Author.name, Author.city).where(Author.authorid == 4)
            result = session.execute(query.execution_options(currency_bound="10 min"))
            rows = result.all()
            console.print(
                "[bold cyan]SQLAlchemy ORM: the same read through "
                'create_engine("postgresql+mtcache://...")[/bold cyan]'
            )
            console.print(
                "  [dim]select(Author.name, Author.city).where(Author.authorid == 4)"
                '.execution_options(currency_bound="10 min")[/dim]'
            )
            console.print(f"  {len(rows)} rows: {escape(', '.join(str(tuple(r)) for r in rows))}")
            for entry in provenance(result):
                where = (
                    f"local from {entry['view']}"
                    if entry["route"] == "local"
                    else "remote (PostgreSQL, current)"
                )
                console.print(f"  [green]{entry['table']}[/green]: {escape(where)}")
            console.print()
    finally:
        engine.dispose()


PSQL_SCRIPT = """\\set ECHO queries
SET mtcache.provenance = on;
SELECT name, city FROM authors WHERE authorid = 4 CURRENCY BOUND 10 MIN;
EXPLAIN LAST STATEMENT;
SELECT name, city FROM authors WHERE authorid = 4;
EXPLAIN LAST STATEMENT;
SHOW CACHED VIEWS;
"""


def server_at_work(console: Console, dsn: str, path: Path) -> None:
    """The same cache file served by `mtcache serve`: psql, then pgbench, through it."""
    console.rule("[bold]one cache, every client: mtcache serve[/bold]")
    with serving_process(dsn, path) as served:
        host, port = served.host, served.port
        database = str(psycopg.conninfo.conninfo_to_dict(dsn).get("dbname", "postgres"))
        env = client_environment(host, port, database)
        console.print(
            f"[bold cyan]mtcache serve --listen {host}:{port}[/bold cyan] owns "
            f"{escape(str(path))}; every PostgreSQL client connects to it\n"
        )
        console.print(f"[bold cyan]psql -h {host} -p {port} -d {database}[/bold cyan]")
        said = _client(["psql", "-X", "-v", "ON_ERROR_STOP=1"], env, PSQL_SCRIPT)
        console.print(escape(said.rstrip()), highlight=False)
        console.print()
        console.print(
            "[bold cyan]pgbench through the server[/bold cyan]: init (writes pass "
            "through), a cached view of pgbench_accounts, then a select-only run "
            "with a session bound given in PGOPTIONS"
        )
        _client(["pgbench", "-i", "-q", "-s", "1"], env)
        with psycopg.connect(
            host=host, port=port, user="postgres", dbname=database, autocommit=True
        ) as conn:
            conn.execute(
                "CREATE CACHED VIEW demo_accounts AS SELECT * FROM pgbench_accounts "
                "REFRESH EVERY 10 MIN"
            )
            conn.execute("REFRESH CACHED VIEW demo_accounts")
            hits = _hits(conn)
            bound = client_environment(
                host, port, database, options="-c mtcache.currency_bound=600"
            )
            said = _client(
                ["pgbench", "-S", "-M", "prepared", "-n", "-c", "4", "-j", "2", "-t", "500"], bound
            )
            for line in said.splitlines():
                if line.startswith(("number of transactions actually", "latency average", "tps =")):
                    console.print(f"  {escape(line)}")
            console.print(
                f"  the cache answered {_hits(conn) - hits} of them (SHOW CACHE "
                "STATUS, counters.hits)"
            )
            conn.execute("DROP CACHED VIEW demo_accounts")
        console.print()
    console.print("the server stopped on SIGTERM (see docs/server.md)")
    console.print()


def _client(argv: list[str], env: dict[str, str], script: str | None = None) -> str:
    """A PostgreSQL client program's output (its notices in their place)."""
    if shutil.which(argv[0]) is None:
        raise ProgrammingError(
            f"{argv[0]} is not installed: `make demo` installs it (scripts/ensure-system-deps.sh)"
        )
    run = subprocess.run(
        argv,
        env=env,
        input=script,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=600,
        check=False,
    )
    if run.returncode != 0:
        raise ProgrammingError(f"{argv[0]} failed through the server: {run.stdout.strip()}")
    return run.stdout


def _hits(conn: psycopg.Connection[t.Any]) -> int:
    rows = dict(conn.execute("SHOW CACHE STATUS").fetchall())
    return int(json.loads(rows["counters"])[Counter.HITS])
