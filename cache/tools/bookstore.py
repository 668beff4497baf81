"""The dissertation's bookstore (§1, §2): Authors, Books, Reviewers, Reviews, Sales, with keys.

Used by `mtcache demo` and the tests. Data is generated in SQL, deterministic, small enough to
load in well under a second.
"""

from __future__ import annotations

from pathlib import Path

import psycopg

# Fig 3.2's cache schema over the bookstore: AuthorCopy, BookCopy, ReviewerCopy, ReviewCopy.
CACHE_SCHEMA_FILE = Path(__file__).parents[1] / "schemas" / "bookstore.sql"

SCHEMA = """
CREATE TABLE authors (
    authorid  integer PRIMARY KEY,
    name      text NOT NULL,
    gender    char(1) NOT NULL,
    city      text NOT NULL,
    state     char(2) NOT NULL
);
CREATE TABLE books (
    isbn        text PRIMARY KEY,
    authorid    integer NOT NULL REFERENCES authors,
    title       text NOT NULL,
    publisherid integer NOT NULL,
    type        text NOT NULL,
    price       numeric(8, 2) NOT NULL
);
CREATE TABLE reviewers (
    reviewerid integer PRIMARY KEY,
    name       text NOT NULL,
    gender     char(1) NOT NULL,
    city       text NOT NULL
);
CREATE TABLE reviews (
    reviewid   integer PRIMARY KEY,
    isbn       text NOT NULL REFERENCES books,
    reviewerid integer NOT NULL REFERENCES reviewers,
    rating     integer NOT NULL CHECK (rating BETWEEN 1 AND 5),
    UNIQUE (isbn, reviewerid)
);
CREATE TABLE sales (
    saleid  bigint PRIMARY KEY,
    isbn    text NOT NULL REFERENCES books,
    sold_on date NOT NULL,
    qty     integer NOT NULL
);
CREATE INDEX books_authorid ON books (authorid);
CREATE INDEX reviews_isbn ON reviews (isbn);
CREATE INDEX sales_isbn ON sales (isbn);
CREATE VIEW book_reviews AS
    SELECT b.isbn, b.title, b.authorid, r.reviewid, r.reviewerid, r.rating
    FROM books b JOIN reviews r ON b.isbn = r.isbn;
"""

CITIES = [("Madison", "WI"), ("Milwaukee", "WI"), ("Seattle", "WA"), ("Chicago", "IL")]

DATA = """
INSERT INTO authors
SELECT g, 'Author ' || g, CASE WHEN g %% 2 = 0 THEN 'F' ELSE 'M' END,
       (ARRAY['Madison', 'Milwaukee', 'Seattle', 'Chicago'])[1 + g %% 4],
       (ARRAY['WI', 'WI', 'WA', 'IL'])[1 + g %% 4]
FROM generate_series(1, %(authors)s) g;

INSERT INTO books
SELECT 'isbn-' || lpad(g::text, 5, '0'), 1 + (g * 7) %% %(authors)s, 'Book ' || g, 1 + g %% 5,
       (ARRAY['paperback', 'hardcover', 'ebook'])[1 + g %% 3], 5 + (g * 13) %% 60
FROM generate_series(1, %(books)s) g;

INSERT INTO reviewers
SELECT g, 'Reviewer ' || g, CASE WHEN g %% 3 = 0 THEN 'F' ELSE 'M' END,
       (ARRAY['Madison', 'Milwaukee', 'Seattle', 'Chicago'])[1 + g %% 4]
FROM generate_series(1, %(reviewers)s) g;

INSERT INTO reviews
SELECT g, 'isbn-' || lpad((1 + (g * 11) %% %(books)s)::text, 5, '0'),
       1 + g %% %(reviewers)s, 1 + g %% 5
FROM generate_series(1, %(reviews)s) g
ON CONFLICT DO NOTHING;

INSERT INTO sales
SELECT g, 'isbn-' || lpad((1 + (g * 17) %% %(books)s)::text, 5, '0'),
       date '2002-01-01' + (g * 3) %% 1095, 1 + g %% 4
FROM generate_series(1, %(sales)s) g;
"""

SIZES = {"authors": 40, "books": 200, "reviewers": 60, "reviews": 600, "sales": 2000}


def load(conn: psycopg.Connection, sizes: dict[str, int] | None = None) -> None:  # type: ignore[type-arg]
    """Create the bookstore tables and fill them (in the connection's current transaction)."""
    params = {**SIZES, **(sizes or {})}
    conn.execute(SCHEMA)
    for statement in DATA.split(";"):
        if statement.strip():
            conn.execute(statement, params)
    conn.execute("ANALYZE")


def load_into(dsn: str, sizes: dict[str, int] | None = None) -> None:
    with psycopg.connect(dsn, autocommit=False) as conn:
        load(conn, sizes)
        conn.commit()


def is_loaded(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT to_regclass('authors') IS NOT NULL").fetchone()
        return bool(row and row[0])
