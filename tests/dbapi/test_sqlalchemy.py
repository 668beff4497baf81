"""SQLAlchemy applications over the cache (cache.sqla): the ``postgresql+mtcache`` dialect
next to ``postgresql+psycopg`` on the same backend. Answers are compared with psycopg's,
values and Python types; provenance shows what the cache answered."""

from __future__ import annotations

import datetime as dt
import typing as t
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import ForeignKey, create_engine, event, inspect, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    aliased,
    joinedload,
    load_only,
    mapped_column,
    relationship,
    selectinload,
)

import cache
from cache.sqla import admin, engine_url, provenance, with_currency
from cache.sqla.dialect import MTCacheDialect
from tests.answers import typed
from tests.paths import ROOT

SCHEMA = ROOT / "cache" / "schemas" / "bookstore.sql"


class Base(DeclarativeBase):
    pass


class Author(Base):
    __tablename__ = "authors"
    authorid: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str]
    gender: Mapped[str]
    city: Mapped[str]
    state: Mapped[str]
    books: Mapped[list[Book]] = relationship(
        back_populates="author", order_by="Book.isbn", cascade="all, delete-orphan"
    )


class Book(Base):
    __tablename__ = "books"
    isbn: Mapped[str] = mapped_column(primary_key=True)
    authorid: Mapped[int] = mapped_column(ForeignKey("authors.authorid"))
    title: Mapped[str]
    publisherid: Mapped[int]
    type: Mapped[str]
    price: Mapped[Decimal]
    author: Mapped[Author] = relationship(back_populates="books")
    reviews: Mapped[list[Review]] = relationship(
        back_populates="book", order_by="Review.reviewid", cascade="all, delete-orphan"
    )
    sales: Mapped[list[Sale]] = relationship(
        back_populates="book", order_by="Sale.saleid", cascade="all, delete-orphan"
    )


class Reviewer(Base):
    __tablename__ = "reviewers"
    reviewerid: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str]
    gender: Mapped[str]
    city: Mapped[str]
    reviews: Mapped[list[Review]] = relationship(
        back_populates="reviewer", order_by="Review.reviewid"
    )


class Review(Base):
    __tablename__ = "reviews"
    reviewid: Mapped[int] = mapped_column(primary_key=True)
    isbn: Mapped[str] = mapped_column(ForeignKey("books.isbn"))
    reviewerid: Mapped[int] = mapped_column(ForeignKey("reviewers.reviewerid"))
    rating: Mapped[int]
    book: Mapped[Book] = relationship(back_populates="reviews")
    reviewer: Mapped[Reviewer] = relationship(back_populates="reviews")


class Sale(Base):
    __tablename__ = "sales"
    saleid: Mapped[int] = mapped_column(primary_key=True)
    isbn: Mapped[str] = mapped_column(ForeignKey("books.isbn"))
    sold_on: Mapped[dt.date]
    qty: Mapped[int]
    book: Mapped[Book] = relationship(back_populates="sales")


def _urls(dsn: str, cache_path: Path) -> tuple[URL, URL]:
    cached = engine_url(dsn, cache_path, background=False)
    return cached.set(drivername="postgresql+psycopg", query={}), cached


@pytest.fixture(scope="module")
def engines(
    bookstore_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Engine, Engine]]:
    path = tmp_path_factory.mktemp("sqla") / "cache.duckdb"
    plain_url, cached_url = _urls(bookstore_dsn, path)
    plain, cached = create_engine(plain_url), create_engine(cached_url)
    with admin(cached) as cache_admin:
        cache_admin.apply_ddl(SCHEMA.read_text())
        cache_admin.admit("authorlist_pct", [1, 2])
        cache_admin.admit("reviewerlist_pct", [1, 2, 3])
    try:
        yield plain, cached
    finally:
        cached.dispose()
        plain.dispose()


@pytest.fixture
def writer(engines: tuple[Engine, Engine]) -> Iterator[Engine]:
    """Another application's engine on the same cache and backend, for tests that write: a
    DB-API session that wrote a table reads it from the backend until the cache has caught up
    (read your writes), which would send the module's later bounded reads remote."""
    engine = create_engine(engines[1].url)
    try:
        yield engine
    finally:
        engine.dispose()


def test_a_url_names_the_backend_and_the_connection_options() -> None:
    dialect = MTCacheDialect(dbapi=MTCacheDialect.import_dbapi())
    url = make_url(
        "postgresql+mtcache://app:s3cret@db.example:6543/shop?cache_path=/var/c.duckdb"
        "&currency_bound=10+min&stale_ok=true&result_memo_bytes=0"
    )
    args, options = dialect.create_connect_args(url)
    assert args == []
    # the engine's psycopg adapters (JSON serializers, ...) for the backend sessions
    assert options.pop("context") is dialect._psycopg_adapters_map
    assert options == {
        "backend": "postgresql://app:s3cret@db.example:6543/shop",
        "cache_path": "/var/c.duckdb",
        "currency_bound": "10 min",
        "stale_ok": True,
        "result_memo_bytes": 0,
    }
    # no host: the embedded backend beside the cache file, as the CLI
    embedded = dialect.create_connect_args(make_url("postgresql+mtcache://"))[1]
    assert embedded["backend"] is None and set(embedded) == {"backend", "context"}
    with pytest.raises(cache.ProgrammingError, match="stale_ok must be true or false"):
        dialect.create_connect_args(make_url("postgresql+mtcache://h/db?stale_ok=maybe"))
    with pytest.raises(cache.ProgrammingError, match="result_memo_bytes must be a number"):
        dialect.create_connect_args(make_url("postgresql+mtcache://h/db?result_memo_bytes=lots"))
    with pytest.raises(cache.ProgrammingError, match="without a host uses the embedded"):
        dialect.create_connect_args(make_url("postgresql+mtcache:///shop"))


def test_a_bounded_orm_read_is_answered_by_the_cache(engines: tuple[Engine, Engine]) -> None:
    plain, cached = engines
    query = select(Author.authorid, Author.name, Author.city).where(Author.authorid == 1)
    with Session(plain) as pg_session, Session(cached) as session:
        want = pg_session.execute(query).all()
        result = session.execute(query.execution_options(currency_bound="10 min"))
        assert typed(result.all()) == typed(want)
        (entry,) = provenance(result).accesses
        assert (entry.table, entry.route, entry.view) == ("authors", "local", "authorcopy")
        # without a bound the backend answers, as PostgreSQL would
        result = session.execute(query)
        assert typed(result.all()) == typed(want)
        assert {e.route for e in provenance(result).accesses} == {"remote"}


def test_the_bound_of_a_session_or_engine_applies_to_its_reads(
    engines: tuple[Engine, Engine],
) -> None:
    plain, cached = engines
    # bookcopy holds these columns of books (not publisherid: a whole Book reads the backend)
    query = select(Book.isbn, Book.title, Book.price).where(Book.authorid == 2).order_by(Book.isbn)
    with Session(plain) as pg_session:
        want = pg_session.execute(query).all()
    bounded = cached.execution_options(currency_bound=dt.timedelta(minutes=10))
    with Session(bounded) as session:
        result = session.execute(query)
        assert typed(result.all()) == typed(want)
        assert {(e.table, e.route) for e in provenance(result).accesses} == {("books", "local")}
        books = session.scalars(select(Book).where(Book.authorid == 2))
        assert len(books.all()) == len(want)
        assert {(e.table, e.route) for e in provenance(books).accesses} == {("books", "remote")}


def test_orm_writes_go_to_the_backend_in_transactions(
    engines: tuple[Engine, Engine], writer: Engine
) -> None:
    plain, cached = engines[0], writer
    with Session(cached) as session, session.begin():
        author = session.get(Author, 1)
        assert author is not None
        session.add(
            Book(
                isbn="sqla-1",
                authorid=1,
                title="Mapped",
                publisherid=1,
                type="fiction",
                price=Decimal("9.50"),
            )
        )
    with Session(cached) as session:
        session.begin()
        book = session.get(Book, "sqla-1")
        assert book is not None and book.author.authorid == 1
        book.price = Decimal("10.25")
        session.rollback()  # nothing of it reaches the backend
        with session.begin():
            session.get(Book, "sqla-1").title = "Retitled"  # type: ignore[union-attr]
    with plain.connect() as conn:
        row = conn.execute(text("SELECT title, price FROM books WHERE isbn = 'sqla-1'")).one()
        assert typed([row]) == typed([("Retitled", Decimal("9.50"))])
    with Session(cached) as session, session.begin():
        session.delete(session.get(Book, "sqla-1"))
    with plain.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM books WHERE isbn = 'sqla-1'")).scalar() == 0


def test_reflection_is_postgresqls(engines: tuple[Engine, Engine]) -> None:
    plain, cached = engines
    for table in ("authors", "books", "reviews"):
        assert _columns(cached, table) == _columns(plain, table)
        assert inspect(cached).get_pk_constraint(table) == inspect(plain).get_pk_constraint(table)
        assert inspect(cached).get_foreign_keys(table) == inspect(plain).get_foreign_keys(table)


def _columns(engine: Engine, table: str) -> list[tuple[str, str, bool, t.Any]]:
    return [
        (c["name"], str(c["type"]), c["nullable"], c["default"])
        for c in inspect(engine).get_columns(table)
    ]


def test_with_currency_writes_the_clause_with_the_blocks_own_names(
    engines: tuple[Engine, Engine],
) -> None:
    plain, cached = engines
    other = aliased(Author)
    inner = with_currency(select(other.authorid).where(other.city == "Madison"), 60, on=[other])
    query = select(Author.authorid, Author.name).where(Author.authorid.in_([1, 2]))
    bounded = with_currency(
        query.order_by(Author.authorid), "10 min", on=[Author], by=[Author.city]
    )
    text_of = str(bounded.compile(dialect=MTCacheDialect()))
    assert text_of.rstrip().endswith("CURRENCY BOUND 10 min ON (authors) BY authors.city")
    nested = str(
        select(Book.isbn)
        .where(Book.authorid.in_(inner.scalar_subquery()))
        .compile(dialect=MTCacheDialect())
    )
    assert "CURRENCY BOUND 1 min ON (authors_1) )" in nested
    with pytest.raises(cache.ProgrammingError, match="on= takes mapped classes"):
        with_currency(query, "10 min", on=["authors"])
    # another dialect renders no clause: PostgreSQL's own semantics
    assert "CURRENCY" not in str(bounded.compile(dialect=postgresql.dialect()))
    with plain.connect() as pg, cached.connect() as conn:
        want = pg.execute(bounded).all()
        result = conn.execute(bounded)
        assert typed(result.all()) == typed(want)
        assert {(e.table, e.route) for e in provenance(result).accesses} == {("authors", "local")}


@contextmanager
def routes_of(engine: Engine) -> Iterator[list[set[tuple[str, str]]]]:
    """The (table, route) pairs of each statement the engine runs inside the block, loaders'
    statements included."""
    seen: list[set[tuple[str, str]]] = []

    def routes(conn: t.Any, cursor: t.Any, *args: t.Any) -> None:
        seen.append({(e.table, e.route) for e in cursor.provenance.accesses})

    event.listen(engine, "after_cursor_execute", routes)
    try:
        yield seen
    finally:
        event.remove(engine, "after_cursor_execute", routes)


def test_with_currency_statements_are_compiled_once(engines: tuple[Engine, Engine]) -> None:
    """A statement with a currency clause has a cache key: run again, it is not compiled
    again; another bound, another input or another alias is another key."""
    _, cached = engines
    other = aliased(Author)

    def bounded(bound: str, on: t.Any, by: t.Any = Author.city) -> t.Any:
        return with_currency(
            select(other.name, Author.name).where(
                other.authorid == Author.authorid, Author.authorid == 1
            ),
            bound,
            on=on,
            by=[by],
        )

    with cached.connect() as conn:
        for statement, clause in [
            (bounded("10 min", [Author, other]), "10 min ON (authors, authors_1) BY authors.city"),
            (bounded("10 min", [Author, other]), "10 min ON (authors, authors_1) BY authors.city"),
            (bounded("1 min", [Author, other]), "1 min ON (authors, authors_1) BY authors.city"),
            (bounded("1 min", [other], other.city), "1 min ON (authors_1) BY authors_1.city"),
            (bounded("1 min", [Author]), "1 min ON (authors) BY authors.city"),
        ]:
            result = conn.execute(statement)
            assert result.context.statement.rstrip().endswith(f"CURRENCY BOUND {clause}")
            result.all()
        hits = [
            conn.execute(bounded("1 min", [other], other.city)).context.cache_hit for _ in range(2)
        ]
    assert [str(h) for h in hits] == ["CacheStats.CACHE_HIT"] * 2


def test_orm_loaders_carry_the_bound_of_the_session(engines: tuple[Engine, Engine]) -> None:
    """Lazy and selectin loads of a session whose engine carries a bound read the cache."""
    plain, cached = engines
    with Session(plain) as pg_session:
        want = [(b.isbn, b.title) for b in pg_session.get(Author, 2).books]  # type: ignore[union-attr]
    bounded = cached.execution_options(currency_bound="10 min")
    with routes_of(cached) as seen:
        with Session(bounded) as session:
            author = session.scalars(select(Author).where(Author.authorid == 2)).one()
            books = author.books  # a lazy load
            assert typed([(b.isbn, b.title) for b in books]) == typed(want)
        with Session(bounded) as session:
            query = select(Author).where(Author.authorid == 2).options(selectinload(Author.books))
            author = session.scalars(query).one()
            assert typed([(b.isbn, b.title) for b in author.books]) == typed(want)
    assert ("authors", "local") in set().union(*seen)
    # books: whole Book objects read publisherid, which bookcopy does not hold
    assert all(routes_ <= {("authors", "local"), ("books", "remote")} for routes_ in seen)


# what bookcopy holds of a Book (not publisherid)
CACHED_BOOK = (Book.isbn, Book.authorid, Book.title, Book.type, Book.price)


def _author_rows(author: Author) -> list[tuple[t.Any, ...]]:
    return [
        (author.authorid, author.name, author.city, b.isbn, b.title, b.type, b.price)
        for b in author.books
    ]


def test_joinedload_reads_the_cache_in_one_statement(engines: tuple[Engine, Engine]) -> None:
    """A joined eager load is one LEFT OUTER JOIN statement; with the bound of the statement
    it is answered from the cache, also under LIMIT (a derived table) and many-to-one."""
    plain, cached = engines
    loads = [
        select(Author)
        .where(Author.authorid == 2)
        .options(joinedload(Author.books).load_only(*CACHED_BOOK)),
        select(Author)
        .where(Author.authorid == 1)  # .limit() puts authors in a derived table
        .options(joinedload(Author.books).load_only(*CACHED_BOOK))
        .limit(1),
    ]
    for query in loads:
        with Session(plain) as pg_session:
            want = [row for a in pg_session.scalars(query).unique() for row in _author_rows(a)]
        with Session(cached) as session, routes_of(cached) as seen:
            found = session.scalars(query.execution_options(currency_bound="10 min")).unique()
            assert typed([row for a in found for row in _author_rows(a)]) == typed(want)
        assert seen == [{("authors", "local"), ("books", "local")}]
    # many-to-one: each book with its author, in the statement that loads the books
    books = (
        select(Book)
        .where(Book.authorid == 2)
        .order_by(Book.isbn)
        .options(load_only(*CACHED_BOOK), joinedload(Book.author))
    )
    with Session(plain) as pg_session:
        want = [(b.isbn, b.author.name) for b in pg_session.scalars(books)]
    bounded = cached.execution_options(currency_bound="10 min")
    with Session(bounded) as session, routes_of(cached) as seen:
        assert typed([(b.isbn, b.author.name) for b in session.scalars(books)]) == typed(want)
    assert seen == [{("authors", "local"), ("books", "local")}]
    # three levels: one statement each with selectinload, each answered by the cache (as one
    # joined statement it goes remote: docs/limits.md)
    chain = (
        select(Author)
        .where(Author.authorid == 2)
        .options(selectinload(Author.books).load_only(*CACHED_BOOK).selectinload(Book.reviews))
    )

    def reviews(session: Session) -> list[tuple[t.Any, ...]]:
        return [
            (b.isbn, r.reviewid, r.rating)
            for a in session.scalars(chain)
            for b in a.books
            for r in b.reviews
        ]

    with Session(plain) as pg_session:
        want = reviews(pg_session)
    with Session(bounded) as session, routes_of(cached) as seen:
        assert typed(reviews(session)) == typed(want)
    assert want and seen == [{("authors", "local")}, {("books", "local")}, {("reviews", "local")}]


def test_relationships_both_ways_read_the_cache(engines: tuple[Engine, Engine]) -> None:
    """Reviewers and their reviews, and each review's reviewer and book, through every loader
    kind; reviewers 1-3 are admitted, so their side reads the cache."""
    plain, cached = engines

    def graph(session: Session) -> list[tuple[t.Any, ...]]:
        rows: list[tuple[t.Any, ...]] = []
        query = (
            select(Reviewer)
            .where(Reviewer.reviewerid.in_([2, 3]))
            .order_by(Reviewer.reviewerid)
            .options(selectinload(Reviewer.reviews))
        )
        for reviewer in session.scalars(query):
            for review in reviewer.reviews:
                assert review.reviewer is reviewer  # back_populates: no statement
                rows.append((reviewer.name, review.reviewid, review.rating, review.isbn))
        joined = (
            select(Review)
            .where(Review.reviewerid == 2)
            .order_by(Review.reviewid)
            .options(joinedload(Review.reviewer, innerjoin=True))
        )
        for review in session.scalars(joined):
            rows.append((review.reviewer.city, review.reviewid))
        lazy = session.scalars(select(Review).where(Review.reviewerid == 1)).first()
        assert lazy is not None
        rows.append((lazy.reviewer.name, lazy.book.title))  # lazy many-to-one loads
        return rows

    with Session(plain) as pg_session:
        want = graph(pg_session)
    bounded = cached.execution_options(currency_bound="10 min")
    with Session(bounded) as session, routes_of(cached) as seen:
        assert typed(graph(session)) == typed(want)
    assert len(want) > 4
    local = {("reviewers", "local"), ("reviews", "local")}
    # every statement reads reviews and reviewers from the cache; only the lazy load of a
    # whole Book (publisherid is not cached) reads the backend
    assert seen[:-1] == [
        {("reviewers", "local")},
        {("reviews", "local")},
        local,
        {("reviews", "local")},
        {("reviewers", "local")},
    ]
    assert seen[-1] == {("books", "remote")}


def _store_graph(session: Session, authorid: int) -> list[tuple[t.Any, ...]]:
    """An author's whole graph: books, their reviews with reviewers, their sales."""
    author = session.get(Author, authorid, populate_existing=True)
    if author is None:
        return []
    rows: list[tuple[t.Any, ...]] = [(author.authorid, author.name, author.city)]
    for book in author.books:
        rows.append((book.isbn, book.title, book.publisherid, book.price))
        rows.extend((r.reviewid, r.rating, r.reviewer.name) for r in book.reviews)
        rows.extend((s.saleid, s.sold_on, s.qty) for s in book.sales)
    return rows


def test_orm_crud_over_the_whole_bookstore(engines: tuple[Engine, Engine], writer: Engine) -> None:
    """Create, read, update and delete a graph of every bookstore table through the cache, in
    transactions. After each step, the bounded answers equal PostgreSQL's: the writing
    application's at once (it reads its own writes), another application's once the cache
    is refreshed (until then it may see the cached graph, as old as its bound allows)."""
    plain, cached = engines

    def same_graph() -> list[tuple[t.Any, ...]]:
        with Session(plain) as pg_session:
            want = _store_graph(pg_session, 9001)
        with Session(writer.execution_options(currency_bound="10 min")) as session:
            assert typed(_store_graph(session, 9001)) == typed(want)
        with admin(cached) as cache_admin:
            cache_admin.refresh()
        with Session(cached.execution_options(currency_bound="10 min")) as session:
            assert typed(_store_graph(session, 9001)) == typed(want)
        return want

    with Session(writer) as session, session.begin():
        critic = session.get(Reviewer, 1)
        author = Author(authorid=9001, name="New Author", gender="F", city="Madison", state="WI")
        book = Book(
            isbn="sqla-crud", title="Fresh", publisherid=2, type="ebook", price=Decimal("12.00")
        )
        author.books.append(book)
        book.reviews.append(Review(reviewid=9001, reviewer=critic, rating=4))
        book.sales.append(Sale(saleid=9001, sold_on=dt.date(2026, 1, 2), qty=3))
        session.add(author)
    created = same_graph()
    assert [row[0] for row in created] == [9001, "sqla-crud", 9001, 9001]

    with Session(writer) as session:
        with session.begin():
            stored = session.get(Author, 9001)
            assert stored is not None
            stored.books[0].price = Decimal("13.50")
            stored.books[0].sales.append(Sale(saleid=9002, sold_on=dt.date(2026, 1, 3), qty=1))
        session.begin()  # a transaction rolled back leaves the graph as it was
        session.get(Author, 9001).name = "Renamed"  # type: ignore[union-attr]
        session.flush()
        session.rollback()
    updated = same_graph()
    assert updated[0] == (9001, "New Author", "Madison")
    assert ("sqla-crud", "Fresh", 2, Decimal("13.50")) in updated
    assert [row[0] for row in updated].count(9002) == 1

    with Session(writer) as session, session.begin():
        session.delete(session.get(Author, 9001))  # its books, their reviews and sales too
    assert same_graph() == []
    with plain.connect() as conn:
        counts = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM reviews WHERE reviewid = 9001),"
                " (SELECT count(*) FROM sales WHERE saleid > 9000)"
            )
        ).one()
        assert tuple(counts) == (0, 0)


def test_a_bounded_session_reads_its_own_writes(
    engines: tuple[Engine, Engine], writer: Engine
) -> None:
    """A session that wrote a table reads it from the backend: inside its transaction, and
    after it commits until the cache holds the change. Another application may read the
    cached row, as old as the bound allows, until the cache is refreshed."""
    plain, cached = engines
    query = select(Author.name).where(Author.authorid == 2)

    def read(engine: Engine) -> tuple[str, set[str]]:
        with Session(engine.execution_options(currency_bound="10 min")) as session:
            result = session.execute(query)
            return result.scalar_one(), {e.route for e in provenance(result).accesses}

    with Session(plain) as pg_session:
        before = pg_session.scalars(query).one()
    with Session(writer.execution_options(currency_bound="10 min")) as session:
        result = session.execute(query)
        assert (result.scalar_one(), {e.route for e in provenance(result).accesses}) == (
            before,
            {"local"},
        )
        session.get(Author, 2).name = "Written"  # type: ignore[union-attr]
        session.flush()
        result = session.execute(query)
        assert (result.scalar_one(), {e.route for e in provenance(result).accesses}) == (
            "Written",
            {"remote"},
        )
        session.rollback()
    assert read(writer) == (before, {"local"})
    try:
        with Session(writer) as session, session.begin():
            session.get(Author, 2).name = "Committed"  # type: ignore[union-attr]
        assert read(writer) == ("Committed", {"remote"})
        assert read(cached) == (before, {"local"})  # within its 10 minutes
        with admin(cached) as cache_admin:
            cache_admin.refresh("authorcopy")
        assert read(cached) == ("Committed", {"local"})
        assert read(writer) == ("Committed", {"local"})  # the cache has caught up
    finally:
        with Session(writer) as session, session.begin():
            session.get(Author, 2).name = before  # type: ignore[union-attr]
        with admin(cached) as cache_admin:
            cache_admin.refresh("authorcopy")
