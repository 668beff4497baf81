"""Derived cached views kept REFRESH CONTINUOUSLY: the replication stream's changes carried
into their stored states as deltas (cache.maintenance.stream.derived), on a real slot; after
every batch of random writes each view equals what the backend computes of it."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import typing as t
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.reflect import fetch_catalog
from cache.backend.replication import drop_slot
from cache.maintenance import faults, stream
from cache.maintenance.background import attach, detach
from cache.maintenance.pipeline import Maintainer
from cache.maintenance.stream.arrangements import Arrangements
from cache.store.budget import parse_size, pulled_copies
from cache.store.cache_file import CacheStore
from cache.store.status import status
from cache.tools import bookstore
from control_tables.schema import CacheSchema
from control_tables.script import apply_script
from experiments.workers import Workers
from optimizer.derived.delta import maintenance
from optimizer.derived.states import layout, pull_select
from sql_ext import parse
from sql_ext.errors import NotSupportedError
from tests.engine.test_derived_views import answered_locally_as_postgresql, random_query
from tests.plan_cases import load_catalog

Setup = tuple[CacheStore, str, stream.Consumer]

VIEWS = {
    # one table, grouped: counts, sums, an average, a minimum and a maximum
    "author_stats": """SELECT b.authorid, count(*) AS books, sum(b.price) AS total,
        avg(b.price) AS mean, min(b.price) AS cheapest, max(b.price) AS dearest
        FROM books b GROUP BY b.authorid""",
    # three tables joined along keys, grouped by a column of the last
    "city_ratings": """SELECT a.city, count(*) AS reviews, sum(r.rating) AS stars,
        avg(r.rating) AS mean, min(r.rating) AS worst
        FROM reviews r JOIN books b ON r.isbn = b.isbn JOIN authors a ON b.authorid = a.authorid
        GROUP BY a.city""",
    # a join view without aggregates, with a selection
    "reviewed": """SELECT r.reviewid, r.rating, b.isbn, b.title, b.price
        FROM reviews r JOIN books b ON r.isbn = b.isbn WHERE r.rating >= 3""",
    # one group of all rows, with a char(n) grouping elsewhere
    "all_sales": """SELECT count(*) AS sales, sum(s.qty) AS sold, sum(s.qty * 1.5) AS weighted,
        max(s.sold_on) AS last_day FROM sales s""",
    "by_gender": """SELECT a.gender, count(*) AS books, sum(b.price) AS total
        FROM books b JOIN authors a ON b.authorid = a.authorid
        WHERE a.state = 'WI' GROUP BY a.gender""",
    # one table under a WHERE of a range, a list of texts and a date moved by an interval
    "cheap_books": """SELECT b.authorid, count(*) AS books, sum(b.price * 2) AS doubled,
        avg(b.price) AS mean FROM books b WHERE b.price < 40.5 AND b.type IN ('ebook', 'paperback')
        GROUP BY b.authorid""",
    "recent_sales": """SELECT s.isbn, count(*) AS sales, sum(s.qty) AS sold FROM sales s
        WHERE s.sold_on >= date '2024-06-01' - interval '60 days' GROUP BY s.isbn""",
    # one group of all rows, its states adding up, under a WHERE a batch may miss
    "big_sales": """SELECT count(*) AS sales, sum(s.qty) AS sold FROM sales s
        WHERE s.qty > 5""",
}


@pytest.fixture
def setup(pg_cluster: EmbeddedPostgres, tmp_path: Path) -> Iterator[Setup]:
    dsn = pg_cluster.create_database("derived_stream")
    bookstore.load_into(dsn)
    store = CacheStore(tmp_path / "cache.duckdb")
    ddl = ";\n".join(
        f"CREATE CACHED VIEW {name} AS {select} REFRESH CONTINUOUSLY"
        for name, select in VIEWS.items()
    )
    stream.apply_ddl(store, dsn, parse(ddl), fetch_catalog(dsn))
    with stream.Consumer(store, dsn) as consumer:
        yield store, dsn, consumer
    drops = "; ".join(f"DROP CACHED VIEW {name}" for name in VIEWS)
    with CacheStore(store.path) as again:  # (the last continuous view takes the slot along)
        stream.apply_ddl(again, dsn, parse(drops), fetch_catalog(dsn))
    store.close()


def pg(dsn: str, sql: str, params: t.Sequence[t.Any] = ()) -> list[tuple[t.Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def typed(rows: t.Iterable[tuple[t.Any, ...]]) -> list[tuple[tuple[type, t.Any], ...]]:
    return sorted((tuple((type(v), v) for v in row) for row in rows), key=repr)


def recomputed(store: CacheStore, dsn: str) -> None:
    """Every view holds what the backend computes of it now (values and types)."""
    schema, catalog = store.load_schema(), store.load_catalog()
    for name in VIEWS:
        found = layout(schema.views[name], catalog)
        columns = ", ".join(f'"{c.name}"' for c in found.columns)
        cached = store.con.execute(f"SELECT {columns} FROM {name}").fetchall()
        cast = ", ".join(f'"{c.name}"::{c.pg_type}' for c in found.columns)  # (as stored)
        want = pg(dsn, f"SELECT {cast} FROM ({pull_select(schema.views[name], found)}) x")
        assert typed(cached) == typed(want), name


def populate(store: CacheStore, dsn: str, consumer: stream.Consumer) -> None:
    maintainer = Maintainer(store, dsn)
    for name in VIEWS:
        maintainer.refresh(name)
    consumer.catch_up()


WRITES = [
    "UPDATE books SET price = price + 1.25 WHERE isbn = (SELECT isbn FROM books "
    "ORDER BY md5(isbn::text || %(tag)s) LIMIT 1)",
    "UPDATE authors SET city = (ARRAY['Madison','Milwaukee','Seattle','Chicago','Tulsa'])"
    "[1 + %(seed)s %% 5], state = (ARRAY['WI','WI','WA','IL','OK'])[1 + %(seed)s %% 5] "
    "WHERE authorid = (SELECT authorid FROM authors "
    "ORDER BY md5(authorid::text || %(tag)s) LIMIT 1)",
    "UPDATE reviews SET rating = 1 + (rating + %(seed)s) %% 5 WHERE reviewid = (SELECT reviewid "
    "FROM reviews ORDER BY md5(reviewid::text || %(tag)s) LIMIT 1)",
    "DELETE FROM reviews WHERE reviewid = (SELECT reviewid FROM reviews "
    "ORDER BY md5(reviewid::text || %(tag)s) LIMIT 1)",
    "INSERT INTO reviews SELECT (SELECT coalesce(max(reviewid), 0) + 1 FROM reviews), b.isbn, "
    "r.reviewerid, 1 + %(seed)s %% 5 FROM books b, reviewers r "
    "WHERE NOT EXISTS (SELECT 1 FROM reviews x "
    "WHERE x.isbn = b.isbn AND x.reviewerid = r.reviewerid) "
    "ORDER BY md5(b.isbn || r.reviewerid::text "
    "|| %(tag)s) LIMIT 1",
    "INSERT INTO sales SELECT (SELECT coalesce(max(saleid), 0) + 1 FROM sales), isbn, "
    "date '2024-01-01' + %(seed)s %% 400, 1 + %(seed)s %% 7 FROM books "
    "ORDER BY md5(isbn::text || %(tag)s) LIMIT 1",
    "DELETE FROM sales WHERE saleid = (SELECT saleid FROM sales "
    "ORDER BY md5(saleid::text || %(tag)s) LIMIT 1)",
    # the cheapest book of an author gets dearer: the minimum of that group is found again
    "UPDATE books SET price = price + 100 WHERE isbn = (SELECT isbn FROM books WHERE authorid "
    "= 1 + %(seed)s %% 5 ORDER BY price, isbn LIMIT 1)",
    # a new book, and a book with its reviews and sales gone
    "INSERT INTO books SELECT 'isbn-new-' || %(tag)s, 1 + %(seed)s %% 5, 'New ' || %(tag)s, 1, "
    "'ebook', 9.99 ON CONFLICT DO NOTHING",
    # an author's books all gone: the group leaves (its minimum computed again first)
    "WITH gone AS (SELECT isbn FROM books WHERE authorid = (SELECT authorid FROM books "
    "ORDER BY md5(isbn::text || %(tag)s) LIMIT 1)), "
    "r AS (DELETE FROM reviews WHERE isbn IN (SELECT isbn FROM gone)), "
    "s AS (DELETE FROM sales WHERE isbn IN (SELECT isbn FROM gone)) "
    "DELETE FROM books WHERE isbn IN (SELECT isbn FROM gone)",
    "WITH gone AS (SELECT isbn FROM books ORDER BY md5(isbn::text || %(tag)s) LIMIT 1), "
    "r AS (DELETE FROM reviews WHERE isbn IN (SELECT isbn FROM gone)), "
    "s AS (DELETE FROM sales WHERE isbn IN (SELECT isbn FROM gone)) "
    "DELETE FROM books WHERE isbn IN (SELECT isbn FROM gone)",
]


def test_random_writes_keep_every_derived_view_equal_to_the_backend_s(setup: Setup) -> None:
    store, dsn, consumer = setup
    populate(store, dsn, consumer)
    recomputed(store, dsn)
    pulls = pulled(store)
    rng = random.Random(2911)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(12):
            for _ in range(rng.randint(1, 12)):  # transactions of one to three writes
                with conn.transaction():
                    for _ in range(rng.randint(1, 3)):
                        seed = rng.randint(0, 10**6)
                        conn.execute(rng.choice(WRITES), {"seed": seed, "tag": str(seed)})
            consumer.catch_up()
            recomputed(store, dsn)
    assert pulled(store) == pulls and consumer.upqueries == 0  # (the stream did it all)
    store.con.execute("CHECKPOINT")
    [entry] = [v for v in status(store)["views"] if v["name"] == "city_ratings"]
    copied = sum(
        pg(dsn, f"SELECT count(*) FROM {t}")[0][0] for t in ("reviews", "books", "authors")
    )
    assert entry["continuous"] and entry["copies"]["rows"] == copied
    assert entry["copies"]["bytes"] > 0


def copy_columns(store: CacheStore) -> dict[str, set[str]]:
    """The columns of each copy of a table in the cache file, by DuckDB table."""
    found: dict[str, set[str]] = {}
    for table, column in store.con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() "
        "WHERE starts_with(table_name, 'mtcache_aux.')"
    ).fetchall():
        found.setdefault(table, set()).add(column)
    return found


def test_views_reading_a_table_share_one_copy_of_the_columns_they_read(setup: Setup) -> None:
    """One copy per table (its key and the union of what its readers read), kept once per
    batch for every view; a view that reads more of a table makes its copy again, pulled in
    one snapshot with every view reading it; one dropped narrows it, pulling nothing."""
    store, dsn, consumer = setup
    populate(store, dsn, consumer)
    assert copy_columns(store) == {
        "mtcache_aux.authors": {"authorid", "city", "state", "gender"},
        "mtcache_aux.books": {"isbn", "authorid", "price", "title", "type"},
        "mtcache_aux.reviews": {"reviewid", "rating", "isbn"},
        "mtcache_aux.sales": {"saleid", "isbn", "qty", "sold_on"},
    }
    rng = random.Random(55)
    random_writes(dsn, rng, 10)
    consumer.catch_up()
    recomputed(store, dsn)
    by_type = "CREATE CACHED VIEW by_type AS SELECT b.publisherid, count(*) AS n, "
    by_type += "sum(b.price) AS total FROM books b GROUP BY b.publisherid REFRESH CONTINUOUSLY"
    catalog = fetch_catalog(dsn)
    done = stream.apply_ddl(store, dsn, parse(by_type), catalog)
    # (books' readers made again with its wider copy: each as a view just created)
    readers = {"author_stats", "city_ratings", "reviewed", "by_gender", "cheap_books"}
    assert set(done.created) == {"by_type", *readers}
    books = {"isbn", "authorid", "price", "title", "type"}
    assert copy_columns(store)["mtcache_aux.books"] == {*books, "publisherid"}
    before = pulled(store)
    Maintainer(store, dsn).refresh("by_type")  # (the copy comes with all its readers)
    assert pulled(store) == before + 1
    random_writes(dsn, rng, 10)
    consumer.catch_up()
    recomputed(store, dsn)
    want = pg(dsn, "SELECT publisherid, count(*), sum(price) FROM books GROUP BY publisherid")
    got = store.con.execute("SELECT publisherid, n, total FROM by_type").fetchall()
    assert typed(got) == typed(want)
    stream.apply_ddl(store, dsn, parse("DROP CACHED VIEW by_type"), catalog)
    assert copy_columns(store)["mtcache_aux.books"] == books
    random_writes(dsn, rng, 10)
    consumer.catch_up()
    recomputed(store, dsn)
    assert pulled(store) == before + 1  # (narrowed, not pulled again)


def test_join_deltas_probe_arrangements_that_hold_what_the_copies_hold(setup: Setup) -> None:
    """A join view (by_gender: books joined with authors) joins a table's changes with the
    other tables' arrangements in memory, and a view's groups that lose a minimum are found
    again from them (author_stats, city_ratings): after every batch each arrangement holds
    its copy's rows; a pull of the copies makes them again; a batch that fails leaves
    none behind, and the next batch lands as the backend computes it."""
    store, dsn, consumer = setup
    populate(store, dsn, consumer)
    rng = random.Random(5501)

    def arranged_as_copied() -> None:
        arranged = consumer.arrangements.tables
        assert set(arranged) == {"books", "authors", "reviews"}  # (not sales: no join, no group)
        stamps = pulled_copies(store.con)
        for table, arrangement in arranged.items():
            assert arrangement.spec[0] == stamps[f"mtcache_aux.{table}"]
            held = [tuple(row.values()) for row in arrangement.rows().to_pylist()]
            columns = ", ".join(f'"{c}"' for c in arrangement.schema.names)
            copied = store.con.execute(f'SELECT {columns} FROM "mtcache_aux.{table}"')
            assert typed(held) == typed(copied.fetchall())

    def write_both() -> None:  # (a book and an author change: each probes the other table)
        random_writes(dsn, rng, 6)
        seed = rng.randint(0, 10**6)
        pg(dsn, WRITES[0], {"seed": seed, "tag": str(seed)})
        pg(dsn, WRITES[1], {"seed": seed, "tag": str(seed)})

    for _ in range(3):
        write_both()
        consumer.catch_up()
        recomputed(store, dsn)
        arranged_as_copied()
    before = pulled_copies(store.con)
    Maintainer(store, dsn).refresh()  # (every view: their copies pulled anew with them)
    assert pulled_copies(store.con)["mtcache_aux.books"] != before["mtcache_aux.books"]
    write_both()
    consumer.catch_up()
    recomputed(store, dsn)
    arranged_as_copied()
    consumer.faults = frozenset({"stream_apply"})
    write_both()
    with pytest.raises(faults.InjectedFault):
        consumer.catch_up()
    assert consumer.arrangements.tables == {}
    consumer.faults = frozenset()
    consumer.catch_up()
    recomputed(store, dsn)
    arranged_as_copied()


def test_items_by_arrow_and_by_duckdb_in_one_batch_merge(setup: Setup) -> None:
    """A join view whose product of numerics Arrow computes as a 38-digit decimal and DuckDB
    as a narrower one: with books' arrangement refused (over the memory limit) and authors'
    kept, a batch changing both tables takes one table's items from each, and lands as the
    backend computes it."""
    store, dsn, consumer = setup
    ddl = (
        "CREATE CACHED VIEW priced AS SELECT a.city, count(*) AS n, sum(b.price * 2) AS "
        "doubled FROM books b JOIN authors a ON b.authorid = a.authorid GROUP BY a.city "
        "REFRESH CONTINUOUSLY"
    )
    with applied(store, dsn, ddl, "DROP CACHED VIEW priced"):
        populate(store, dsn, consumer)
        Maintainer(store, dsn).refresh("priced")
        rng = random.Random(77)
        for write in (WRITES[0], WRITES[1]):  # (each table's change probes the other)
            seed = rng.randint(0, 10**6)
            pg(dsn, write, {"seed": seed, "tag": str(seed)})
        consumer.catch_up()
        arranged = consumer.arrangements.tables
        assert arranged["books"].nbytes > 2 * arranged["authors"].nbytes
        # (room for authors' rows and indexes, not for books')
        consumer.arrangements = Arrangements(limit=arranged["authors"].nbytes * 3 // 2)
        for _ in range(3):
            with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
                for write in (WRITES[0], WRITES[1], WRITES[0]):
                    seed = rng.randint(0, 10**6)
                    conn.execute(write, {"seed": seed, "tag": str(seed)})
            consumer.catch_up()
            assert "authors" in consumer.arrangements.tables
            assert "books" not in consumer.arrangements.tables
            want = pg(
                dsn,
                "SELECT a.city, count(*), sum(b.price * 2) FROM books b JOIN authors a "
                "ON b.authorid = a.authorid GROUP BY a.city",
            )
            got = store.con.execute("SELECT city, n, doubled FROM priced").fetchall()
            assert typed(got) == typed(want)
            recomputed(store, dsn)


def test_an_arranged_table_truncated_alone_is_not_probed_as_it_was(setup: Setup) -> None:
    """reviews, arranged (a book's change probes its reviews), truncated in a batch of its
    own: a later batch's join finds none of its old rows."""
    store, dsn, consumer = setup
    populate(store, dsn, consumer)
    seed = 4242
    pg(dsn, WRITES[0], {"seed": seed, "tag": str(seed)})
    consumer.catch_up()
    assert "reviews" in consumer.arrangements.tables
    pg(dsn, "TRUNCATE reviews")
    consumer.catch_up()
    recomputed(store, dsn)
    for seed in (1, 2, 3):
        pg(dsn, WRITES[0], {"seed": seed, "tag": str(seed)})
        pg(dsn, WRITES[4], {"seed": seed, "tag": str(seed)})  # (a review arrives)
        consumer.catch_up()
        recomputed(store, dsn)


def test_a_consumer_that_another_followed_makes_its_arrangements_again(setup: Setup) -> None:
    """Two consumers of one file in one process take turns: the one that resumes finds the
    stream past its arrangements, forgets them, and answers as the backend computes."""
    store, dsn, consumer = setup
    populate(store, dsn, consumer)
    rng = random.Random(9)
    random_writes(dsn, rng, 6)
    pg(dsn, WRITES[1], {"seed": 5, "tag": "5"})
    consumer.catch_up()
    assert consumer.arrangements.tables
    with stream.Consumer(store, dsn) as other:
        for _ in range(2):
            random_writes(dsn, rng, 6)
            pg(dsn, WRITES[1], {"seed": 6, "tag": "6"})
            other.catch_up()
    random_writes(dsn, rng, 6)
    pg(dsn, WRITES[0], {"seed": 7, "tag": "7"})
    consumer.catch_up()
    recomputed(store, dsn)


def test_a_batch_that_needs_a_pull_of_a_base_view_keeps_the_arrangements(setup: Setup) -> None:
    """A new author, whose books a presence-controlled base view must pull (the batch fails
    with NeedsPull before any derived view is touched, and goes again with its upquery), leaves
    the derived views' arrangements as they were: they are not made again (2 s for lineitem)."""
    store, dsn, consumer = setup
    ddl = (
        "CREATE CACHED VIEW authors_all AS SELECT authorid, city FROM authors "
        "REFRESH CONTINUOUSLY;\n"
        "CREATE CACHED VIEW author_books AS SELECT isbn, authorid, price FROM books "
        "PRESENCE ON (authorid) IN authors_all (authorid) CONSISTENCY ROOT"
    )
    with applied(store, dsn, ddl, "DROP CACHED VIEW author_books; DROP CACHED VIEW authors_all"):
        populate(store, dsn, consumer)
        Maintainer(store, dsn).refresh("authors_all")
        for write in (WRITES[0], WRITES[1]):
            pg(dsn, write, {"seed": 3, "tag": "3"})
        consumer.catch_up()
        arranged = consumer.arrangements.tables
        assert {"books", "authors"} <= set(arranged)
        upqueries = consumer.upqueries
        with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
            conn.execute(
                "INSERT INTO authors (authorid, name, city, state, gender) "
                "SELECT max(authorid) + 1, 'New', 'Madison', 'WI', 'F' FROM authors"
            )
            conn.execute(WRITES[0], {"seed": 4, "tag": "4"})
        consumer.catch_up()
        assert consumer.upqueries == upqueries + 1  # (the batch needed its pull)
        for table in ("books", "authors"):
            assert consumer.arrangements.tables[table] is arranged[table]
        recomputed(store, dsn)


@pytest.mark.parametrize("given", [0, "lots", True])
def test_a_bad_stream_memory_limit_is_refused_before_anything_is_opened(
    pg_cluster: EmbeddedPostgres, tmp_path: Path, given: object
) -> None:
    dsn = pg_cluster.create_database("derived_stream_memory")
    with pytest.raises(cache.ProgrammingError, match="stream_memory_limit must"):
        cache.connect(dsn, tmp_path / "c.duckdb", stream_memory_limit=given)  # type: ignore[arg-type]
    assert not (tmp_path / "c.duckdb").exists()


def test_the_background_consumer_keeps_its_arrangements_within_the_limit_given(
    pg_cluster: EmbeddedPostgres, tmp_path: Path
) -> None:
    dsn = pg_cluster.create_database("derived_stream_limit")
    with CacheStore(tmp_path / "c.duckdb") as store:
        running = attach(store, dsn, arranged_bytes=parse_size("3MB"))
        try:
            assert running.consumer.arrangements.limit == 3_000_000
        finally:
            detach(running)


def pulled(store: CacheStore) -> int:
    """How many pulls the file has applied (the stream's batches are not pulls)."""
    row = store.con.execute("SELECT count(*) FROM mtcache.snapshots WHERE engine <> 'stream'")
    found = row.fetchone()
    assert found is not None
    return int(found[0])


def test_a_truncate_empties_what_the_table_held(setup: Setup) -> None:
    store, dsn, consumer = setup
    populate(store, dsn, consumer)
    pg(dsn, "TRUNCATE sales")
    consumer.catch_up()
    recomputed(store, dsn)
    assert store.con.execute("SELECT sales, sold, last_day FROM all_sales").fetchall() == [
        (0, None, None)
    ]
    pg(dsn, "INSERT INTO sales VALUES (1, (SELECT min(isbn) FROM books), '2024-02-29', 3)")
    consumer.catch_up()
    recomputed(store, dsn)


@pytest.mark.parametrize(
    ("select", "words"),
    [
        (
            "SELECT b.authorid, max(b.title) AS last FROM books b GROUP BY b.authorid",
            "not of a number or a date",
        ),
        (
            "SELECT b.authorid, count(*) AS n FROM books b WHERE b.title LIKE 'A%' "
            "GROUP BY b.authorid",
            "would not read its condition",
        ),
        (
            "SELECT b.authorid, count(*) AS n FROM books b WHERE b.title > 'M' GROUP BY b.authorid",
            "would not read its condition",
        ),
        (  # (DuckDB reads 1e-3 as a DOUBLE)
            "SELECT b.authorid, sum(b.price * 1e-3) AS s FROM books b GROUP BY b.authorid",
            "not of integers or numerics computed by",
        ),
        (
            "SELECT b.authorid, count(*) AS n FROM books b WHERE b.price >= 1e-3 "
            "GROUP BY b.authorid",
            "would not read its condition",
        ),
    ],
)
def test_what_the_stream_cannot_keep_exact_is_refused_and_changes_nothing(
    setup: Setup, select: str, words: str
) -> None:
    store, dsn, _ = setup
    before = store.con.execute("SELECT name FROM mtcache.objects ORDER BY name").fetchall()
    with pytest.raises(NotSupportedError, match=words):
        stream.apply_ddl(
            store,
            dsn,
            parse(f"CREATE CACHED VIEW v AS {select} REFRESH CONTINUOUSLY"),
            fetch_catalog(dsn),
        )
    assert store.con.execute("SELECT name FROM mtcache.objects ORDER BY name").fetchall() == before


def test_the_copies_keep_the_key_and_the_columns_the_view_reads() -> None:
    catalog = load_catalog("bookstore")
    ddl = f"CREATE CACHED VIEW city_ratings AS {VIEWS['city_ratings']} REFRESH CONTINUOUSLY"
    schema, _ = apply_script(CacheSchema(), parse(ddl), catalog)
    plan = maintenance(schema.views["city_ratings"], catalog)
    assert {a.alias: a.copy.columns for a in plan.auxiliaries} == {
        "r": ("reviewid", "rating", "isbn"),
        "b": ("isbn", "authorid"),
        "a": ("authorid", "city"),
    }


OWNER = """
import sys
from cache.maintenance import stream
from cache.store.cache_file import CacheStore
from cache.store.status import status
from cache.backend.replication import wal_mark
with CacheStore(sys.argv[2]) as store, stream.Consumer(store, sys.argv[1], batch=50) as c:
    target = wal_mark(c.connection())
    while (c.position or 0) <= target:  # batch by batch, each confirmed to the backend
        c.step(wait=0.5)
"""


def random_writes(dsn: str, rng: random.Random, transactions: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(transactions):
            with conn.transaction():
                for _ in range(rng.randint(1, 3)):
                    seed = rng.randint(0, 10**6)
                    conn.execute(rng.choice(WRITES), {"seed": seed, "tag": str(seed)})


@pytest.mark.parametrize(
    ("point", "shared"),
    [("stream_apply", False), ("stream_advance", False), ("stream_apply", True)],
)
def test_sigkill_while_applying_then_reopening_leaves_each_view_as_recomputed(
    setup: Setup, point: str, shared: bool, tmp_path: Path
) -> None:
    """The owning process killed (SIGKILL) in the middle of applying a batch to the derived
    views and their copies, or after its commit before the slot is confirmed: reopened, the
    stream goes on from the position the file holds, and each view equals what the backend
    computes (``shared``: with books' copy held by a base view of all of books, too)."""
    store, dsn, consumer = setup
    whole = "CREATE CACHED VIEW all_books AS SELECT * FROM books REFRESH CONTINUOUSLY"
    if shared:
        stream.apply_ddl(store, dsn, parse(whole), fetch_catalog(dsn))
    populate(store, dsn, consumer)
    consumer.close()
    path = store.path
    store.close()
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    rng = random.Random(point)
    random_writes(dsn, rng, 40)
    env = {**os.environ, "MTCACHE_FAULTS": f"{point}:kill"}
    owner = subprocess.run(
        [sys.executable, str(script), dsn, str(path)],
        env=env,
        timeout=120,
        capture_output=True,
        text=True,
        check=False,
    )
    assert owner.returncode == -signal.SIGKILL, owner.stderr  # killed at the fault point
    random_writes(dsn, rng, 20)
    with CacheStore(path) as reopened, stream.Consumer(reopened, dsn) as catching_up:
        catching_up.catch_up()
        recomputed(reopened, dsn)
        if shared:
            assert "mtcache_aux.books" not in copy_columns(reopened)
            books = "SELECT * FROM {} ORDER BY isbn"
            assert reopened.con.execute(books.format("all_books")).fetchall() == pg(
                dsn, books.format("books")
            )
            drop = parse("DROP CACHED VIEW all_books")
            stream.apply_ddl(reopened, dsn, drop, fetch_catalog(dsn))


@pytest.mark.parametrize("held", [False, True], ids=["copies", "books held by a base view"])
def test_a_view_kept_current_under_concurrent_writes_answers_as_postgresql(
    pg_cluster: EmbeddedPostgres, tmp_path: Path, held: bool
) -> None:
    """A writer goes on while the stream is applied; now and then the writer pauses, the
    stream catches up, and the queries the views answer are answered locally (EXPLAIN names
    the view), equal to PostgreSQL's answer, in values, types and description (``held``:
    with books cached whole by a base view, books' copy, which answers its own reads too)."""
    import threading

    import cache

    dsn = pg_cluster.create_database("derived_stream_live")
    bookstore.load_into(dsn)
    path = tmp_path / "cache.duckdb"
    live = ("author_stats", "city_ratings", "reviewed")
    ddl = ";\n".join(
        f"CREATE CACHED VIEW {name} AS {VIEWS[name]} REFRESH CONTINUOUSLY" for name in live
    )
    if held:
        live = ("all_books", *live)
        ddl = "CREATE CACHED VIEW all_books AS SELECT * FROM books REFRESH CONTINUOUSLY;\n" + ddl
    queries = [
        "SELECT b.authorid, count(*), avg(b.price), min(b.price) FROM books b "
        "GROUP BY b.authorid ORDER BY 1",
        "SELECT a.city, sum(r.rating), count(*) FROM reviews r JOIN books b ON r.isbn = b.isbn "
        "JOIN authors a ON b.authorid = a.authorid GROUP BY a.city ORDER BY 1",
        "SELECT count(*), max(b.price) FROM books b",
        # the join view's rows
        "SELECT r.reviewid, b.title, b.price FROM reviews r JOIN books b ON r.isbn = b.isbn "
        "WHERE r.rating >= 3 AND b.price > 20 ORDER BY r.reviewid",
    ]
    reads = [  # (all_books's own: a base view's read)
        "SELECT b.isbn, b.title, b.price FROM books b WHERE b.authorid = 3 ORDER BY b.isbn"
    ]
    pause = threading.Lock()
    with (
        cache.connect(
            dsn, path, background=False, admit_on_miss=False, result_memo_bytes=0
        ) as conn,
        psycopg.connect(dsn) as backend,
    ):
        conn.admin.apply_ddl(ddl)
        for name in live:
            conn.admin.refresh(name)
        if held:
            assert "mtcache_aux.books" not in copy_columns(conn.admin.store)
        with (
            stream.Consumer(conn.admin.store.for_thread(), dsn) as consumer,
            Writer(dsn, pause) as writer,
        ):
            for _ in range(4):
                for _ in range(20):
                    consumer.step(wait=0.05)  # (applying while the writer writes)
                with pause:
                    consumer.catch_up()
                    for sql in queries + (reads if held else []):
                        cur = conn.cursor()
                        cur.execute(f"EXPLAIN {sql} CURRENCY BOUND 10 MIN")
                        assert ("DerivedScan" in str(cur.fetchall())) == (sql not in reads), sql
                        cur.execute(f"{sql} CURRENCY BOUND 10 MIN")
                        rows = cur.fetchall()
                        assert {p["route"] for p in cur.provenance} == {"local"}, sql
                        want = backend.execute(sql)
                        got = want.fetchall()
                        assert typed(rows) == typed(got), sql
                        assert [d[0] for d in cur.description] == [
                            d.name for d in want.description or []
                        ]
                        backend.rollback()
            assert writer.count > 0
        conn.admin.apply_ddl("; ".join(f"DROP CACHED VIEW {name}" for name in live))


class Writer(Workers):
    """Random writes on the views' tables, one transaction at a time (none while ``pause``
    is held), until stopped."""

    def __init__(self, dsn: str, pause: t.Any) -> None:
        self.dsn = dsn
        self.pause = pause
        self.count = 0
        super().__init__(1)

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stopping.is_set():
            with self.pause:
                random_writes(self.dsn, rng, 1)
            self.count += 1


def test_random_queries_after_each_batch_of_random_writes_get_postgresql_s_answers(
    pg_cluster: EmbeddedPostgres, tmp_path: Path
) -> None:
    """Rounds of random transactions at the backend, the stream applied, then random queries
    the continuously maintained views answer (a random grouping, aggregates and filters; the
    join view's rows by a random filter): each answered locally, equal to PostgreSQL's in
    values, types and description (fixed seed)."""
    import cache

    dsn = pg_cluster.create_database("derived_stream_random")
    bookstore.load_into(dsn)
    live = ("author_stats", "city_ratings", "reviewed")
    draw = random.Random(2811)
    aggregates = {
        "author_stats": [
            "count(*)",
            "sum(b.price)",
            "avg(b.price)",
            "min(b.price)",
            "max(b.price)",
        ],
        "city_ratings": ["count(*)", "sum(r.rating)", "avg(r.rating)", "min(r.rating)"],
    }
    with (
        cache.connect(
            dsn,
            tmp_path / "cache.duckdb",
            background=False,
            admit_on_miss=False,
            result_memo_bytes=0,
        ) as conn,
        psycopg.connect(dsn, autocommit=True) as pg,
    ):
        conn.admin.apply_ddl(
            ";\n".join(
                f"CREATE CACHED VIEW {name} AS {VIEWS[name]} REFRESH CONTINUOUSLY" for name in live
            )
        )
        for name in live:
            conn.admin.refresh(name)
        cur = conn.cursor()
        with stream.Consumer(conn.admin.store.for_thread(), dsn) as consumer:
            for _ in range(5):
                random_writes(dsn, draw, draw.randint(3, 15))
                consumer.catch_up()
                for _ in range(12):
                    if draw.random() < 0.25:  # the join view's rows
                        sql = (
                            "SELECT r.reviewid, r.rating, b.title FROM reviews r JOIN books b "
                            f"ON r.isbn = b.isbn WHERE r.rating >= 3 AND b.price "
                            f"{draw.choice(['<', '>='])} {draw.randint(5, 60)} "
                            "ORDER BY r.reviewid"
                        )
                    else:
                        sql = random_query(draw, aggregates)
                    answered_locally_as_postgresql(cur, pg, sql)
        conn.admin.apply_ddl("; ".join(f"DROP CACHED VIEW {name}" for name in live))


def test_a_partial_view_kept_by_the_stream_holds_its_admitted_keys_as_the_backend(
    pg_cluster: EmbeddedPostgres, tmp_path: Path
) -> None:
    """PRESENCE on a continuously maintained derived view: the first admission pulls the
    copies with it, later ones only their keys' groups (lined up with the stream); the
    stream keeps the admitted keys' groups and drops the others'; queries of admitted keys
    are answered locally, of others by PostgreSQL."""
    import cache

    dsn = pg_cluster.create_database("derived_stream_partial")
    bookstore.load_into(dsn)
    draw = random.Random(7)
    ddl = f"""CREATE CONTROL TABLE stats_pct (authorid integer);
        CREATE CACHED VIEW author_stats AS {VIEWS["author_stats"]}
        PRESENCE ON (authorid) IN stats_pct REFRESH CONTINUOUSLY;
        CREATE CONTROL TABLE city_pct (city text);
        CREATE CACHED VIEW city_ratings AS {VIEWS["city_ratings"]}
        PRESENCE ON (city) IN city_pct REFRESH CONTINUOUSLY"""

    def held(store: CacheStore) -> None:
        """Each view holds exactly the backend's groups of its admitted keys."""
        schema, catalog = store.load_schema(), store.load_catalog()
        for name, control, column in (
            ("author_stats", "stats_pct", "authorid"),
            ("city_ratings", "city_pct", "city"),
        ):
            keys = [r[0] for r in store.con.execute(f"SELECT {column} FROM {control}").fetchall()]
            found = layout(schema.views[name], catalog)
            columns = ", ".join(f'"{c.name}"' for c in found.columns)
            cast = ", ".join(f'"{c.name}"::{c.pg_type}' for c in found.columns)
            want = pg(
                dsn,
                f"SELECT {cast} FROM ({pull_select(schema.views[name], found)}) x "
                f"WHERE {column} = ANY(%s)",
                (keys,),
            )
            cached = store.con.execute(f"SELECT {columns} FROM {name}").fetchall()
            assert typed(cached) == typed(want), (name, keys)

    with (
        cache.connect(
            dsn,
            tmp_path / "cache.duckdb",
            background=False,
            admit_on_miss=False,
            result_memo_bytes=0,
        ) as conn,
        psycopg.connect(dsn, autocommit=True) as backend,
    ):
        conn.admin.apply_ddl(ddl)
        store = conn.admin.store
        with stream.Consumer(store.for_thread(), dsn) as consumer:
            conn.admin.admit("stats_pct", [3])
            conn.admin.admit("city_pct", ["Madison"])
            random_writes(dsn, draw, 10)
            consumer.catch_up()
            held(store)
            copies = store.con.execute('SELECT count(*) FROM "mtcache_aux.books"')
            assert copies.fetchone() == pg(dsn, "SELECT count(*) FROM books")[0]
            state = "SELECT snapshot_id FROM mtcache.view_state WHERE view = 'mtcache_aux.books'"
            first = store.con.execute(state).fetchall()  # (when its copies were pulled)
            assert len(first) == 1
            for round_ in range(4):
                random_writes(dsn, draw, 8)
                conn.admin.admit("stats_pct", [5 + round_])  # (its pull, amid the stream)
                random_writes(dsn, draw, 8)
                consumer.catch_up()
                held(store)
            assert store.con.execute(state).fetchall() == first  # (pulled once)
            conn.admin.evict("stats_pct", [3])
            conn.admin.admit("city_pct", ["Seattle"])
            random_writes(dsn, draw, 10)
            consumer.catch_up()
            held(store)
            cur = conn.cursor()
            for key, route in ((6, "local"), (3, "remote")):
                sql = (
                    "SELECT b.authorid, count(*), avg(b.price), min(b.price) FROM books b "
                    "WHERE b.authorid = %s GROUP BY b.authorid"
                )
                cur.execute(sql + " CURRENCY BOUND 10 MIN", (key,))
                assert {p["route"] for p in cur.provenance} == {route}
                assert typed(cur.fetchall()) == typed(backend.execute(sql, (key,)).fetchall())
            # the slot dropped at the backend: changes it never carries reach the copies too
            consumer.release()
            row = stream.load_stream(store.con)
            assert row is not None
            drop_slot(dsn, row.slot)
            backend.execute("UPDATE books SET price = price + 7 WHERE authorid = 6")
            consumer.catch_up()  # (makes the slot again and pulls the views anew)
            assert store.con.execute(state).fetchall() != first  # (the copies with them)
            random_writes(dsn, draw, 10)
            consumer.catch_up()
            held(store)
        conn.admin.apply_ddl("DROP CACHED VIEW author_stats; DROP CACHED VIEW city_ratings")


@contextlib.contextmanager
def applied(store: CacheStore, dsn: str, ddl: str, drops: str) -> Iterator[None]:
    """The cache DDL ``ddl`` applied for the block, ``drops`` after it."""
    stream.apply_ddl(store, dsn, parse(ddl), fetch_catalog(dsn))
    try:
        yield
    finally:
        stream.apply_ddl(store, dsn, parse(drops), fetch_catalog(dsn))


@contextlib.contextmanager
def views_of(setup: Setup, views: dict[str, str], tables: str) -> Iterator[None]:
    """``views`` (name -> SELECT) kept continuously, the first pulled (the copies with every
    view reading them) and the stream caught up; dropped after, with ``tables``."""
    store, dsn, consumer = setup
    ddl = "; ".join(f"CREATE CACHED VIEW {n} AS {q} REFRESH CONTINUOUSLY" for n, q in views.items())
    drops = "; ".join(f"DROP CACHED VIEW {n}" for n in views)
    try:
        with applied(store, dsn, ddl, drops):
            Maintainer(store, dsn).refresh(next(iter(views)))
            consumer.catch_up()
            yield
    finally:
        pg(dsn, f"DROP TABLE {tables}")


TOASTED = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 400))"


def docs_in_groups(dsn: str, columns: str, values: str) -> None:
    """Tables grps (groups 0 and 1) and docs (ids 1 to 4 in group id % 2; ``columns`` after
    those, of ``values``: SQL of g, the id; `TOASTED` a text stored out of line)."""
    pg(dsn, "CREATE TABLE grps (grp int PRIMARY KEY, name text NOT NULL)")
    pg(dsn, "INSERT INTO grps VALUES (0, 'even'), (1, 'odd')")
    pg(dsn, f"CREATE TABLE docs (id int PRIMARY KEY, grp int NOT NULL, {columns})")
    pg(dsn, f"INSERT INTO docs SELECT g, g %% 2, {values} FROM generate_series(1, 4) g")


def test_a_toasted_value_an_update_did_not_send_comes_from_the_shared_copy(setup: Setup) -> None:
    """An update that leaves a TOASTed value alone does not send it: the table's copy (one,
    shared by the views reading the table) supplies it, to the copy and to each view."""
    store, dsn, consumer = setup
    docs_in_groups(dsn, "body text, note text", f"{TOASTED}, 'n'")
    views = {
        "doc_bodies": "SELECT d.id, d.body, g.grp, g.name FROM docs d JOIN grps g ON d.grp = g.grp",
        "doc_groups": "SELECT d.grp, count(*) AS n FROM docs d GROUP BY d.grp",
    }
    with views_of(setup, views, "docs, grps"):
        assert copy_columns(store)["mtcache_aux.docs"] == {"id", "grp", "body"}
        pg(dsn, "UPDATE docs SET grp = 1 - grp WHERE id IN (1, 2)")  # (body not sent)
        pg(dsn, "UPDATE docs SET note = 'not read' WHERE id = 3")
        consumer.catch_up()
        docs = pg(dsn, "SELECT id, grp, body FROM docs ORDER BY id")
        assert all(len(t.cast(str, r[2])) == 12_800 for r in docs)
        held = 'SELECT id, grp, body FROM "mtcache_aux.docs" ORDER BY id'
        assert store.con.execute(held).fetchall() == docs
        bodies = "SELECT id, body, grp, name FROM doc_bodies ORDER BY id"
        assert store.con.execute(bodies).fetchall() == pg(
            dsn, "SELECT d.id, d.body, g.grp, g.name FROM docs d JOIN grps g USING (grp) ORDER BY 1"
        )
        groups = "SELECT grp, n FROM doc_groups ORDER BY grp"
        assert store.con.execute(groups).fetchall() == pg(
            dsn, "SELECT grp, count(*) FROM docs GROUP BY grp ORDER BY grp"
        )


def test_groups_of_any_type_and_sums_past_a_bigint_are_kept_as_postgresql_computes_them(
    setup: Setup,
) -> None:
    """Groups by a char(n), by a date that may be infinity and by a column named like Arrow's
    sums are matched by DuckDB (a group the view holds is added to, never inserted twice); a
    sum of bigints past 2^63 is the numeric PostgreSQL gives (Arrow's own sum would wrap
    around), of an integer's minimum too (negated, it overflows its type); a NaN is above
    every number, as PostgreSQL compares it."""
    store, dsn, consumer = setup
    pg(
        dsn,
        "CREATE TABLE nums (id int PRIMARY KEY, u char(3) NOT NULL, d date NOT NULL, b bigint, "
        "i int, x_sum int, f double precision)",
    )
    pg(
        dsn,
        "INSERT INTO nums SELECT g, 'u' || g %% 3, "
        "CASE WHEN g %% 2 = 0 THEN 'infinity'::date ELSE date '2024-01-01' END, g, "
        "CASE WHEN g = 3 THEN -2147483648 ELSE g END, g %% 2, "
        "CASE WHEN g %% 3 = 0 THEN 'NaN' ELSE g / 10.0 END FROM generate_series(1, 6) g",
    )
    views = {
        "by_code": "SELECT n.u, count(*) AS c, sum(n.b) AS total, sum(n.i) AS ints "
        "FROM nums n GROUP BY n.u",
        "by_day": "SELECT n.d, count(*) AS c, sum(n.b) AS total FROM nums n GROUP BY n.d",
        "by_x": "SELECT n.x_sum, count(*) AS c, sum(n.b) AS total FROM nums n "
        "WHERE n.f > 0.25 GROUP BY n.x_sum",
    }
    with views_of(setup, views, "nums"):
        pg(dsn, "UPDATE nums SET b = 5000000000000000000 WHERE id IN (1, 4)")
        pg(
            dsn,
            "BEGIN; UPDATE nums SET b = b + 1 WHERE id > 1; DELETE FROM nums WHERE id = 6; "
            "INSERT INTO nums VALUES (7, 'u1', 'infinity', 7, -2147483648, 1, 'NaN'); COMMIT",
        )
        consumer.catch_up()
        ints = store.con.execute("SELECT u, ints FROM by_code").fetchall()
        assert sorted(ints) == sorted(
            (u.rstrip(), i) for u, i in pg(dsn, "SELECT u, sum(i) FROM nums GROUP BY u")
        )
        for view, column, where in (  # (infinity read as text)
            ("by_code", "u", ""),
            ("by_day", "d", ""),
            ("by_x", "x_sum", " WHERE f > 0.25"),
        ):
            got = store.con.execute(f"SELECT {column}::text, c, total FROM {view}").fetchall()
            want = pg(
                dsn,
                f"SELECT {column}::text, count(*), sum(b) FROM nums{where} GROUP BY {column}",
            )
            # (a char(n) is kept without its blanks, which answers pad again)
            want = [(v.rstrip() if isinstance(v, str) else v, *rest) for v, *rest in want]
            assert sorted(map(repr, got)) == sorted(map(repr, want)), view


def test_a_copy_pulled_anew_brings_every_view_reading_it_and_their_other_copies(
    setup: Setup,
) -> None:
    """A view created reading a column of reviews no view read and a table no view read
    (reviewers): reviews' copy is made again with its readers; pulling one of them brings the
    copy, every view reading it, and reviewers' copy the new view reads too, in one snapshot;
    each view is then kept, and none is stamped while a copy it reads was never pulled."""
    store, dsn, consumer = setup
    populate(store, dsn, consumer)
    ddl = (
        "CREATE CACHED VIEW by_reviewer_city AS SELECT rv.city, count(*) AS reviews, "
        "sum(r.rating) AS stars FROM reviews r JOIN reviewers rv ON r.reviewerid = "
        "rv.reviewerid GROUP BY rv.city REFRESH CONTINUOUSLY"
    )
    with applied(store, dsn, ddl, "DROP CACHED VIEW by_reviewer_city"):
        state = "SELECT view FROM mtcache.view_state WHERE view = ?"
        assert store.con.execute(state, ["mtcache_aux.reviewers"]).fetchall() == []
        random_writes(dsn, random.Random(7), 5)
        consumer.catch_up()  # (city_ratings, reviewed: made again, not pulled: not stamped)
        assert store.con.execute(state, ["city_ratings"]).fetchall() == []
        Maintainer(store, dsn).refresh("city_ratings")
        assert store.con.execute(state, ["mtcache_aux.reviewers"]).fetchall() != []
        random_writes(dsn, random.Random(8), 10)
        consumer.catch_up()
        recomputed(store, dsn)
        got = store.con.execute("SELECT city, reviews, stars FROM by_reviewer_city").fetchall()
        want = pg(
            dsn,
            "SELECT rv.city, count(*), sum(r.rating) FROM reviews r JOIN reviewers rv "
            "ON r.reviewerid = rv.reviewerid GROUP BY rv.city",
        )
        assert sorted(got) == sorted(want)


def test_a_copy_a_presence_controlled_view_reads_is_not_widened_under_it(setup: Setup) -> None:
    """A view reading a column of books no view reads would pull books' copy anew with every
    view reading it, which a view under PRESENCE (its admitted keys listed present) cannot
    follow: the DDL is refused, saying what to do, and changes nothing."""
    store, dsn, _ = setup
    ddl = (
        "CREATE CONTROL TABLE type_pct (type text); CREATE CACHED VIEW by_book_type AS "
        "SELECT b.type, count(*) AS n FROM books b GROUP BY b.type "
        "PRESENCE ON (type) IN type_pct REFRESH CONTINUOUSLY"
    )
    with applied(store, dsn, ddl, "DROP CACHED VIEW by_book_type; DROP CONTROL TABLE type_pct"):
        before = store.con.execute("SELECT name, seq FROM mtcache.objects ORDER BY 1").fetchall()
        wider = (
            "CREATE CACHED VIEW by_publisher AS SELECT b.publisherid, count(*) AS n "
            "FROM books b GROUP BY b.publisherid REFRESH CONTINUOUSLY"
        )
        with pytest.raises(NotSupportedError, match="by_book_type keeps groups under PRESENCE"):
            stream.apply_ddl(store, dsn, parse(wider), fetch_catalog(dsn))
        after = store.con.execute("SELECT name, seq FROM mtcache.objects ORDER BY 1").fetchall()
        assert after == before
        assert "publisherid" not in copy_columns(store)["mtcache_aux.books"]


BOOKS_READERS = ["author_stats", "by_gender", "cheap_books", "city_ratings", "reviewed"]


def stamped(store: CacheStore, views: t.Iterable[str]) -> dict[str, int]:
    """Each view's (or copy's) last pull's snapshot, as its view state holds it."""
    names = list(views)
    rows = store.con.execute(
        "SELECT view, snapshot_id FROM mtcache.view_state WHERE list_contains(?, view)", [names]
    ).fetchall()
    return dict(rows)


def test_a_base_view_holding_all_of_a_table_is_its_copy(setup: Setup) -> None:
    """A base view kept continuously that holds every row of books and every column the
    derived views read of it is books' copy: the file holds books once. Creating it makes
    books' readers again (pulled with it, in its snapshot); a pull of it alone brings them
    all whole; random writes keep it, them and their arrangements as the backend computes
    them; dropping it makes the copy of books again, its readers with it."""
    store, dsn, consumer = setup
    populate(store, dsn, consumer)
    assert "mtcache_aux.books" in copy_columns(store)
    ddl = "CREATE CACHED VIEW all_books AS SELECT * FROM books REFRESH CONTINUOUSLY"
    result = stream.apply_ddl(store, dsn, parse(ddl), fetch_catalog(dsn))
    assert sorted(result.created) == sorted([*BOOKS_READERS, "all_books"])
    assert "mtcache_aux.books" not in copy_columns(store)  # (one table holds books now)
    assert "mtcache_aux.books" not in pulled_copies(store.con)
    maintainer = Maintainer(store, dsn)
    maintainer.refresh("all_books")  # (brings every reader of books, whole, with it)
    pulls = pulled(store)
    snapshots = stamped(store, [*BOOKS_READERS, "all_books", "mtcache_aux.books"])
    assert len(snapshots) == len(BOOKS_READERS) + 2 and len(set(snapshots.values())) == 1
    books = "SELECT isbn, authorid, title, price, type FROM {} ORDER BY isbn"
    arranged = 0
    rng = random.Random(3011)
    for round_ in range(3):
        random_writes(dsn, rng, 8)
        consumer.catch_up()
        recomputed(store, dsn)
        assert store.con.execute(books.format("all_books")).fetchall() == pg(
            dsn, books.format("books")
        )
        found = consumer.arrangements.tables.get("books")
        if found is not None:  # (city_ratings and reviewed probe books as all_books holds it)
            arranged += 1
            assert found.spec[0] == pulled_copies(store.con)["mtcache_aux.books"]
            held = [tuple(row.values()) for row in found.rows().to_pylist()]
            columns = ", ".join(f'"{c}"' for c in found.schema.names)
            copied = store.con.execute(f"SELECT {columns} FROM all_books").fetchall()
            assert typed(held) == typed(copied)
        if round_ == 1:  # a pull of all_books alone: its readers come whole with it
            maintainer.refresh("all_books")
            again = stamped(store, [*BOOKS_READERS, "all_books", "mtcache_aux.books"])
            assert len(set(again.values())) == 1 and again != snapshots
            pulls += 1
    assert arranged and pulled(store) == pulls and consumer.upqueries == 0
    [entry] = [v for v in status(store)["views"] if v["name"] == "city_ratings"]
    assert entry["copies"]["views"] == ["all_books"]
    result = stream.apply_ddl(store, dsn, parse("DROP CACHED VIEW all_books"), fetch_catalog(dsn))
    assert sorted(result.created) == BOOKS_READERS
    assert copy_columns(store)["mtcache_aux.books"] == {
        "isbn",
        "authorid",
        "price",
        "title",
        "type",
    }
    assert "mtcache_aux.books" not in pulled_copies(store.con)
    maintainer.refresh("city_ratings")  # (the copy, and every view reading it, in one pull)
    random_writes(dsn, rng, 8)
    consumer.catch_up()
    recomputed(store, dsn)


def test_only_a_base_view_holding_all_of_a_table_under_whole_readers_is_its_copy(
    setup: Setup,
) -> None:
    """A base view under PRESENCE, or lacking a column a reader reads, is not books' copy; nor
    is one that holds all of books while a reader of books keeps groups under PRESENCE (its
    pull could not bring that reader whole). Dropping and creating the base view in one script
    forgets the copy's pull: the new view and every reader come in the next pull together."""
    store, dsn, consumer = setup
    populate(store, dsn, consumer)
    catalog = fetch_catalog(dsn)
    for ddl, drops in (
        (
            "CREATE CONTROL TABLE author_pct (authorid int); CREATE CACHED VIEW some_books AS "
            "SELECT * FROM books PRESENCE ON (authorid) IN author_pct REFRESH CONTINUOUSLY",
            "DROP CACHED VIEW some_books; DROP CONTROL TABLE author_pct",
        ),
        (
            "CREATE CACHED VIEW book_titles AS SELECT isbn, title FROM books REFRESH CONTINUOUSLY",
            "DROP CACHED VIEW book_titles",
        ),
    ):
        with applied(store, dsn, ddl, drops):
            assert "mtcache_aux.books" in copy_columns(store)
            assert "mtcache_aux.books" in pulled_copies(store.con)  # (not pulled anew)
    presence = (
        "CREATE CONTROL TABLE type_pct (type text); CREATE CACHED VIEW by_book_type AS "
        "SELECT b.type, count(*) AS n FROM books b GROUP BY b.type "
        "PRESENCE ON (type) IN type_pct REFRESH CONTINUOUSLY; "
        "CREATE CACHED VIEW all_books AS SELECT * FROM books REFRESH CONTINUOUSLY"
    )
    drops = "DROP CACHED VIEW all_books; DROP CACHED VIEW by_book_type; DROP CONTROL TABLE type_pct"
    with applied(store, dsn, presence, drops):
        assert "mtcache_aux.books" in copy_columns(store)
    ddl = "CREATE CACHED VIEW all_books AS SELECT * FROM books REFRESH CONTINUOUSLY"
    with applied(store, dsn, ddl, "DROP CACHED VIEW all_books"):
        Maintainer(store, dsn).refresh("all_books")
        assert "mtcache_aux.books" in pulled_copies(store.con)
        again = "DROP CACHED VIEW all_books; " + ddl
        result = stream.apply_ddl(store, dsn, parse(again), catalog)
        assert sorted(result.created) == sorted([*BOOKS_READERS, "all_books"])
        assert "mtcache_aux.books" not in pulled_copies(store.con)  # (all_books is empty)
        random_writes(dsn, random.Random(12), 6)
        consumer.catch_up()  # (nothing reading books is kept until the pull)
        assert stamped(store, [*BOOKS_READERS, "all_books"]) == {}
        Maintainer(store, dsn).refresh("city_ratings")
        random_writes(dsn, random.Random(13), 6)
        consumer.catch_up()
        recomputed(store, dsn)
        books = "SELECT * FROM {} ORDER BY isbn"
        assert store.con.execute(books.format("all_books")).fetchall() == pg(
            dsn, books.format("books")
        )


def test_what_duckdb_joins_reads_the_base_view_holding_a_copy(setup: Setup) -> None:
    """With no memory for arrangements, every join and every group that loses its minimum is
    computed by DuckDB from the copies: books' from the base view holding it; so is a view
    computed again after a TRUNCATE of another table it reads."""
    store, dsn, consumer = setup
    ddl = "CREATE CACHED VIEW all_books AS SELECT * FROM books REFRESH CONTINUOUSLY"
    with applied(store, dsn, ddl, "DROP CACHED VIEW all_books"):
        populate(store, dsn, consumer)
        assert "mtcache_aux.books" not in copy_columns(store)
        with stream.Consumer(store, dsn, arranged_bytes=0) as joining:
            random_writes(dsn, random.Random(21), 12)
            joining.catch_up()
            recomputed(store, dsn)
            assert joining.arrangements.tables == {}
            pg(dsn, "TRUNCATE reviews")
            joining.catch_up()
            recomputed(store, dsn)
            assert joining.upqueries == 0


def test_a_toasted_value_the_views_do_not_read_stays_in_the_base_view_holding_the_copy(
    setup: Setup,
) -> None:
    """A base view holding docs whole is its copy; an update that leaves a TOASTed value the
    derived views do not read unsent keeps it in the base view (from its row as it was), and
    the views take the update."""
    store, dsn, consumer = setup
    docs_in_groups(dsn, "size int, body text", f"g, {TOASTED}")
    views = {
        "doc_groups": "SELECT g.name, count(*) AS n, sum(d.size) AS total "
        "FROM docs d JOIN grps g ON d.grp = g.grp GROUP BY g.name",
        "all_docs": "SELECT * FROM docs",
    }
    with views_of(setup, views, "docs, grps"):
        assert "mtcache_aux.docs" not in copy_columns(store)
        pg(dsn, "UPDATE docs SET grp = 1 - grp, size = size * 10 WHERE id IN (1, 2)")
        pg(dsn, "DELETE FROM docs WHERE id = 4")
        consumer.catch_up()
        docs = "SELECT id, grp, size, body FROM {} ORDER BY id"
        assert store.con.execute(docs.format("all_docs")).fetchall() == pg(dsn, docs.format("docs"))
        groups = "SELECT name, n, total FROM doc_groups ORDER BY name"
        assert store.con.execute(groups).fetchall() == pg(
            dsn,
            "SELECT g.name, count(*), sum(d.size) FROM docs d JOIN grps g USING (grp) "
            "GROUP BY g.name ORDER BY g.name",
        )


@pytest.mark.parametrize("pulled_whole", [True, False])
def test_a_format_2_file_drops_the_copy_a_base_view_now_holds(
    setup: Setup, pulled_whole: bool
) -> None:
    """A file of format 2 kept books' copy beside a base view of all of books: opened, the
    copy is dropped and the base view holds it. Its pull is kept when the base view was
    pulled as the copy was; else it is forgotten with its readers', which the next pull
    brings together. Either way the views go on as the backend computes them."""
    store, dsn, consumer = setup
    ddl = "CREATE CACHED VIEW all_books AS SELECT * FROM books REFRESH CONTINUOUSLY"
    stream.apply_ddl(store, dsn, parse(ddl), fetch_catalog(dsn))
    populate(store, dsn, consumer)
    consumer.close()
    # (as format 2 left it: the copy in a table of its own, beside the base view)
    store.con.execute(
        'CREATE TABLE "mtcache_aux.books" AS SELECT isbn, authorid, price, title, type '
        "FROM all_books"
    )
    store.con.execute("UPDATE mtcache.meta SET value = '2' WHERE key = 'format_version'")
    if not pulled_whole:
        store.con.execute("DELETE FROM mtcache.view_state WHERE view = 'all_books'")
    path = store.path
    store.close()
    random_writes(dsn, random.Random(41), 10)
    with CacheStore(path) as reopened, stream.Consumer(reopened, dsn) as catching_up:
        assert "mtcache_aux.books" not in copy_columns(reopened)
        kept = stamped(reopened, [*BOOKS_READERS, "mtcache_aux.books"])
        assert len(kept) == (len(BOOKS_READERS) + 1 if pulled_whole else 0)
        if not pulled_whole:
            Maintainer(reopened, dsn).refresh("all_books")
        catching_up.catch_up()
        recomputed(reopened, dsn)
        books = "SELECT * FROM {} ORDER BY isbn"
        assert reopened.con.execute(books.format("all_books")).fetchall() == pg(
            dsn, books.format("books")
        )
        stream.apply_ddl(reopened, dsn, parse("DROP CACHED VIEW all_books"), fetch_catalog(dsn))


def test_a_script_s_views_are_filled_by_as_few_pulls_as_bring_them(
    pg_cluster: EmbeddedPostgres, tmp_path: Path
) -> None:
    """The owner fills what a script creates: a pull of a base view holding books' copy
    brings every view reading books whole with it, so they are not pulled again one by one;
    a view the first pull did not bring (reading only sales) is pulled on its own."""
    dsn = pg_cluster.create_database("derived_fill")
    bookstore.load_into(dsn)
    names = ["author_stats", "cheap_books", "recent_sales"]
    ddl = ";\n".join(
        ["CREATE CACHED VIEW all_books AS SELECT * FROM books REFRESH CONTINUOUSLY"]
        + [f"CREATE CACHED VIEW {n} AS {VIEWS[n]} REFRESH CONTINUOUSLY" for n in names]
    )
    with cache.connect(dsn, tmp_path / "c.duckdb", admit_on_miss=False, background=False) as conn:
        result = conn.admin.apply_ddl(ddl)
        try:
            assert [sorted(r.rows_inserted) for r in result.filled] == [
                ["all_books", "author_stats", "cheap_books"],
                ["recent_sales"],
            ]
            assert result.unfilled == []
            admin = conn.admin
            assert isinstance(admin, cache.Admin)
            assert pulled(admin.store) == 2
        finally:
            conn.admin.apply_ddl("; ".join(f"DROP CACHED VIEW {n}" for n in ["all_books", *names]))


def test_a_format_2_file_whose_view_lost_its_table_opens_and_forgets_its_copies(
    setup: Setup,
) -> None:
    """A file of format 2 whose continuous derived view reads a table dropped at the
    backend since: which table holds which copy cannot be told, so the file opens with every
    copy's pull forgotten with its readers' (they wait for a pull), status answers, and the
    view can be dropped; the others are then pulled and kept as the backend computes them."""
    store, dsn, consumer = setup
    pg(dsn, "CREATE TABLE extra (id int PRIMARY KEY, v int)")
    pg(dsn, "INSERT INTO extra SELECT g, g FROM generate_series(1, 5) g")
    ddl = "CREATE CACHED VIEW extra_sum AS SELECT count(*) AS n, sum(e.v) AS total FROM extra e"
    stream.apply_ddl(store, dsn, parse(ddl + " REFRESH CONTINUOUSLY"), fetch_catalog(dsn))
    populate(store, dsn, consumer)
    consumer.close()
    pg(dsn, "DROP TABLE extra")
    store.save_catalog(fetch_catalog(dsn))
    store.con.execute("UPDATE mtcache.meta SET value = '2' WHERE key = 'format_version'")
    path = store.path
    store.close()
    with CacheStore(path) as reopened:
        assert pulled_copies(reopened.con) == {}
        assert stamped(reopened, [*VIEWS, "extra_sum"]) == {}
        assert {v["name"] for v in status(reopened)["views"]} == {*VIEWS, "extra_sum"}
        drop = parse("DROP CACHED VIEW extra_sum")
        stream.apply_ddl(reopened, dsn, drop, fetch_catalog(dsn))
        with stream.Consumer(reopened, dsn) as catching_up:
            populate(reopened, dsn, catching_up)
            random_writes(dsn, random.Random(43), 6)
            catching_up.catch_up()
            recomputed(reopened, dsn)
