"""SQLAlchemy applications over the cache (cache.sqla): the ``postgresql+mtcache`` dialect
next to ``postgresql+psycopg`` on the same backend. Answers are compared with psycopg's,
values and Python types; provenance shows what the cache answered."""

from __future__ import annotations

import datetime as dt
import typing as t
from collections.abc import Iterator
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
    mapped_column,
    relationship,
    selectinload,
)

import cache
from cache.sqla import admin, engine_url, provenance, with_currency
from cache.sqla.dialect import MTCacheDialect
from tests.answers import typed

SCHEMA = Path(__file__).parent.parent / "cache" / "schemas" / "bookstore.sql"


class Base(DeclarativeBase):
    pass


class Author(Base):
    __tablename__ = "authors"
    authorid: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str]
    gender: Mapped[str]
    city: Mapped[str]
    state: Mapped[str]
    books: Mapped[list[Book]] = relationship(back_populates="author", order_by="Book.isbn")


class Book(Base):
    __tablename__ = "books"
    isbn: Mapped[str] = mapped_column(primary_key=True)
    authorid: Mapped[int] = mapped_column(ForeignKey("authors.authorid"))
    title: Mapped[str]
    publisherid: Mapped[int]
    type: Mapped[str]
    price: Mapped[Decimal]
    author: Mapped[Author] = relationship(back_populates="books")


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
    try:
        yield plain, cached
    finally:
        cached.dispose()
        plain.dispose()


def test_a_url_names_the_backend_and_the_connection_options() -> None:
    dialect = MTCacheDialect(dbapi=MTCacheDialect.import_dbapi())
    url = make_url("postgresql+mtcache://app:s3cret@db.example:6543/shop?cache_path=/var/c.duckdb"
                   "&currency_bound=10+min&stale_ok=true&result_memo_bytes=0")  # fmt: skip
    args, options = dialect.create_connect_args(url)
    assert args == []
    # the engine's psycopg adapters (JSON serializers, ...) for the backend sessions
    assert options.pop("context") is dialect._psycopg_adapters_map
    assert options == {"backend": "postgresql://app:s3cret@db.example:6543/shop",
                       "cache_path": "/var/c.duckdb", "currency_bound": "10 min",
                       "stale_ok": True, "result_memo_bytes": 0}  # fmt: skip
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


def test_orm_writes_go_to_the_backend_in_transactions(engines: tuple[Engine, Engine]) -> None:
    plain, cached = engines
    with Session(cached) as session, session.begin():
        author = session.get(Author, 1)
        assert author is not None
        session.add(Book(isbn="sqla-1", authorid=1, title="Mapped", publisherid=1,
                         type="fiction", price=Decimal("9.50")))  # fmt: skip
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
    return [(c["name"], str(c["type"]), c["nullable"], c["default"])
            for c in inspect(engine).get_columns(table)]  # fmt: skip


def test_with_currency_writes_the_clause_with_the_blocks_own_names(
    engines: tuple[Engine, Engine],
) -> None:
    plain, cached = engines
    other = aliased(Author)
    inner = with_currency(select(other.authorid).where(other.city == "Madison"), 60, on=[other])
    query = select(Author.authorid, Author.name).where(Author.authorid.in_([1, 2]))
    bounded = with_currency(query.order_by(Author.authorid), "10 min", on=[Author],
                            by=[Author.city])  # fmt: skip
    text_of = str(bounded.compile(dialect=MTCacheDialect()))
    assert text_of.rstrip().endswith("CURRENCY BOUND 10 min ON (authors) BY authors.city")
    nested = str(select(Book.isbn).where(Book.authorid.in_(inner.scalar_subquery()))
                 .compile(dialect=MTCacheDialect()))  # fmt: skip
    assert "CURRENCY BOUND 1 min ON (authors_1) )" in nested
    # another dialect renders no clause: PostgreSQL's own semantics
    assert "CURRENCY" not in str(bounded.compile(dialect=postgresql.dialect()))
    with plain.connect() as pg, cached.connect() as conn:
        want = pg.execute(bounded).all()
        result = conn.execute(bounded)
        assert typed(result.all()) == typed(want)
        assert {(e.table, e.route) for e in provenance(result).accesses} == {("authors", "local")}


def test_orm_loaders_carry_the_bound_of_the_session(engines: tuple[Engine, Engine]) -> None:
    """Lazy and selectin loads of a session whose engine carries a bound read the cache."""
    plain, cached = engines
    with Session(plain) as pg_session:
        want = [(b.isbn, b.title) for b in pg_session.get(Author, 2).books]  # type: ignore[union-attr]
    seen: list[set[tuple[str, str]]] = []

    def routes(conn: t.Any, cursor: t.Any, *args: t.Any) -> None:
        seen.append({(e.table, e.route) for e in cursor.provenance.accesses})

    bounded = cached.execution_options(currency_bound="10 min")
    event.listen(cached, "after_cursor_execute", routes)
    try:
        with Session(bounded) as session:
            author = session.scalars(select(Author).where(Author.authorid == 2)).one()
            books = author.books  # a lazy load
            assert typed([(b.isbn, b.title) for b in books]) == typed(want)
        with Session(bounded) as session:
            query = select(Author).where(Author.authorid == 2).options(selectinload(Author.books))
            author = session.scalars(query).one()
            assert typed([(b.isbn, b.title) for b in author.books]) == typed(want)
    finally:
        event.remove(cached, "after_cursor_execute", routes)
    assert ("authors", "local") in set().union(*seen)
    # books: whole Book objects read publisherid, which bookcopy does not hold
    assert all(routes_ <= {("authors", "local"), ("books", "remote")} for routes_ in seen)
