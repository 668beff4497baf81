"""Admission, eviction and refresh by affected closure, against real PostgreSQL and DuckDB.

Every check compares the cache with the backend's own answer for the same region.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.reflect import fetch_catalog
from cache.maintenance import faults
from cache.maintenance.pipeline import Maintainer
from cache.store.cache_file import CacheStore
from cache.store.status import status
from cache.tools import bookstore
from sql_ext import parse
from sql_ext.errors import BackendUnavailableError, DataError, ProgrammingError
from tests.store.test_store import SCHEMA_FILE, dump

# Authors' cities in the bookstore: authorid % 4 = 0 Madison, 1 Milwaukee, 2 Seattle, 3 Chicago.
MADISON = [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]


@pytest.fixture
def backend(pg_cluster: EmbeddedPostgres, request: pytest.FixtureRequest) -> str:
    """A fresh bookstore per test: these tests write to the backend."""
    dsn = pg_cluster.create_database(
        "m_" + request.node.name[:40].replace("[", "_").replace("]", "")
    )
    bookstore.load_into(dsn)
    return dsn


@pytest.fixture
def store(backend: str, tmp_path: Path) -> Iterator[CacheStore]:
    opened = CacheStore(tmp_path / "cache.duckdb")
    opened.save_catalog(fetch_catalog(backend))
    opened.apply_ddl(parse(SCHEMA_FILE.read_text()), opened.load_catalog())
    yield opened
    opened.close()


def pg(dsn: str, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def local(store: CacheStore, sql: str) -> list[tuple[object, ...]]:
    return store.con.execute(sql).fetchall()


def assert_mirrors_backend(store: CacheStore, dsn: str) -> None:
    """Each view holds exactly the backend rows of its regions (as the backend has them now)."""
    authors = [r[0] for r in local(store, "SELECT authorid FROM authorlist_pct")]
    reviewers = [r[0] for r in local(store, "SELECT reviewerid FROM reviewerlist_pct")]
    expected = {
        "authorcopy": pg(dsn, "SELECT * FROM authors WHERE authorid = ANY(%s)", (authors,)),
        "bookcopy": pg(
            dsn,
            "SELECT isbn, authorid, title, type, price FROM books WHERE authorid = ANY(%s)",
            (authors,),
        ),
        "reviewercopy": pg(dsn, "SELECT * FROM reviewers WHERE reviewerid = ANY(%s)", (reviewers,)),
        "reviewcopy": pg(
            dsn,
            "SELECT * FROM reviews WHERE reviewerid = ANY(%s) OR isbn IN "
            "(SELECT isbn FROM books WHERE authorid = ANY(%s))",
            (reviewers, authors),
        ),
    }
    for view, rows in expected.items():
        assert sorted(local(store, f"SELECT * FROM {view}")) == sorted(rows), view


def snapshot_ids(store: CacheStore, control: str, column: str) -> dict[object, int]:
    return dict(local(store, f"SELECT {column}, snapshot_id FROM {control}"))


def test_admitting_an_author_pulls_the_region_and_its_children(
    store: CacheStore, backend: str
) -> None:
    report = Maintainer(store, backend).admit("authorlist_pct", [(5,)])
    assert report.rows_inserted["authorcopy"] == 1
    assert report.rows_inserted["bookcopy"] == len(
        pg(backend, "SELECT 1 FROM books WHERE authorid = 5")
    )
    assert_mirrors_backend(store, backend)
    row = local(store, "SELECT refreshed_at, snapshot_id FROM authorlist_pct WHERE authorid = 5")
    assert row[0][1] == report.snapshot_id
    assert row[0][0] == report.backend_time


def test_many_presence_keys_are_pulled_with_one_in_list(store: CacheStore, backend: str) -> None:
    """The retrieval query for many admitted keys is one IN list per control key, which the
    backend hashes, not an OR of one comparison per key (evaluated term by term for every
    row: admitting 150,000 TPC-H customers never finished)."""
    from cache.maintenance.pull import Pull
    from control_tables.regions import Region

    schema = store.load_schema()
    pull = Pull(store.con, None, schema, store.load_catalog(), None)  # type: ignore[arg-type]
    wanted = {
        Region("authorcopy", "presence", ("authorid",), (k,), "authorlist_pct")
        for k in range(1, 2001)
    }
    [query] = pull.retrieval(wanted)
    assert query.where.count(" IN ") == 1 and " OR " not in query.where, query.where[:200]
    assert all(f"{k}," in query.where or f"{k})" in query.where for k in (1, 1000, 2000))
    Maintainer(store, backend).admit(
        "authorlist_pct", [(k,) for k in range(1, 2001)], allow_empty=True
    )
    assert_mirrors_backend(store, backend)


def test_consistency_region_refreshes_every_cached_author_of_the_city(
    store: CacheStore, backend: str
) -> None:
    """§3.4.1: with Madison in the CsCT, refreshing one Madison author pulls the other cached
    Madison authors in the same snapshot."""
    maintainer = Maintainer(store, backend)
    maintainer.admit("citylist_csct", [("Madison",)])
    maintainer.admit("authorlist_pct", [(4,)])
    maintainer.admit("authorlist_pct", [(13,)])  # Milwaukee: not in the CsCT
    pg(backend, "UPDATE authors SET name = 'renamed' WHERE authorid IN (4, 13)")
    report = maintainer.admit("authorlist_pct", [(8,)])
    names = dict(local(store, "SELECT authorid, name FROM authorcopy"))
    assert names[4] == "renamed"  # pulled again with 8
    assert names[13] == "Author 13"  # another city: untouched
    ids = snapshot_ids(store, "authorlist_pct", "authorid")
    assert ids[4] == ids[8] == report.snapshot_id != ids[13]
    assert snapshot_ids(store, "citylist_csct", "city")["Madison"] == report.snapshot_id
    assert sorted(local(store, "SELECT authorid FROM authorcopy")) == [(4,), (8,), (13,)]


def test_completeness_region_pulls_every_author_of_the_city(
    store: CacheStore, backend: str
) -> None:
    """§3.4.1: admitting Madison into the CpCT pulls every Madison author at once (a listed
    completeness region holds all of its rows: the guard answers a read of Madison from it),
    their presence keys listed with it; a city with no author yet is complete with none, and
    its first author arrives with the next refresh."""
    maintainer = Maintainer(store, backend)
    maintainer.admit("citylist_cpct", [("Madison",), ("Nowhere",)])
    cached = sorted(r[0] for r in local(store, "SELECT authorid FROM authorcopy"))
    assert cached == sorted(
        r[0] for r in pg(backend, "SELECT authorid FROM authors WHERE city = 'Madison'")
    )
    assert sorted(r[0] for r in local(store, "SELECT authorid FROM authorlist_pct")) == MADISON
    assert_mirrors_backend(store, backend)
    maintainer.admit("authorlist_pct", [(4,)])  # (inside the region: nothing changes)
    assert sorted(r[0] for r in local(store, "SELECT authorid FROM authorlist_pct")) == MADISON
    pg(
        backend,
        "INSERT INTO authors SELECT 1000, name, gender, 'Nowhere', state FROM authors "
        "WHERE authorid = 4",
    )
    maintainer.refresh("authorcopy")
    assert local(store, "SELECT authorid FROM authorcopy WHERE city = 'Nowhere'") == [(1000,)]
    assert_mirrors_backend(store, backend)


def test_refresh_after_backend_changes_mirrors_the_backend(store: CacheStore, backend: str) -> None:
    maintainer = Maintainer(store, backend)
    maintainer.admit("citylist_csct", [("Madison",), ("Seattle",)])
    maintainer.admit("authorlist_pct", [(4,), (6,), (8,), (9,)])
    maintainer.admit("reviewerlist_pct", [(3,), (7,)])
    pg(backend, "UPDATE authors SET name = name || ' (new)' WHERE authorid IN (4, 9)")
    pg(backend, "INSERT INTO books VALUES ('isbn-new', 4, 'New book', 1, 'ebook', 12)")
    pg(backend, "DELETE FROM reviews WHERE isbn IN (SELECT isbn FROM books WHERE authorid = 8)")
    pg(backend, "DELETE FROM sales WHERE isbn IN (SELECT isbn FROM books WHERE authorid = 8)")
    pg(backend, "DELETE FROM books WHERE authorid = 8")
    pg(backend, "INSERT INTO reviews VALUES (9001, 'isbn-new', 3, 5)")
    pg(backend, "UPDATE reviewers SET city = 'Boston' WHERE reviewerid = 7")
    report = maintainer.refresh()
    assert_mirrors_backend(store, backend)
    assert {r[0] for r in local(store, "SELECT DISTINCT snapshot_id FROM authorlist_pct")} == {
        report.snapshot_id
    }


def test_a_row_moving_to_another_region_widens_the_closure(store: CacheStore, backend: str) -> None:
    """Maintenance Algorithm: author 4 moves from Madison to Seattle; refreshing author 4 must
    also refresh the cached Seattle authors (another round, same snapshot)."""
    maintainer = Maintainer(store, backend)
    maintainer.admit("citylist_csct", [("Madison",), ("Seattle",)])
    maintainer.admit("authorlist_pct", [(4,)])
    maintainer.admit("authorlist_pct", [(6,)])
    pg(backend, "UPDATE authors SET city = 'Seattle', name = 'moved' WHERE authorid = 4")
    pg(backend, "UPDATE authors SET name = 'seattle changed' WHERE authorid = 6")
    report = maintainer.refresh("authorcopy", [(4,)])
    assert report.rounds == 2
    assert dict(local(store, "SELECT authorid, name FROM authorcopy")) == {
        4: "moved",
        6: "seattle changed",
    }
    ids = snapshot_ids(store, "authorlist_pct", "authorid")
    assert ids[4] == ids[6] == report.snapshot_id


def test_every_pull_reads_one_snapshot_while_the_backend_changes(
    store: CacheStore, backend: str
) -> None:
    """A writer keeps two Madison authors and all their books stamped with one counter per
    transaction. Whatever the timing, each refresh must see one counter everywhere."""
    maintainer = Maintainer(store, backend)
    maintainer.admit("citylist_csct", [("Madison",)])
    maintainer.admit("authorlist_pct", [(4,), (8,)])
    stop = threading.Event()
    stamped = threading.Event()  # the first counter is everywhere (before it, names differ)

    def write() -> None:
        with psycopg.connect(backend, autocommit=False) as conn:
            n = 0
            while not stop.is_set() and n < 2000:
                n += 1
                conn.execute("UPDATE authors SET name = %s WHERE authorid IN (4, 8)", (f"v{n}",))
                conn.execute("UPDATE books SET title = %s WHERE authorid IN (4, 8)", (f"v{n}",))
                conn.commit()
                stamped.set()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert stamped.wait(30), "the writer never committed"
        seen = set()
        for _ in range(15):
            maintainer.refresh("authorcopy")
            stamps = {r[0] for r in local(store, "SELECT name FROM authorcopy")}
            stamps |= {r[0] for r in local(store, "SELECT title FROM bookcopy")}
            assert len(stamps) == 1, stamps
            seen |= stamps
    finally:
        stop.set()
        writer.join()
    assert len(seen) > 1, "the writer should have moved on between refreshes"


def test_eviction_cascades_to_children(store: CacheStore, backend: str) -> None:
    maintainer = Maintainer(store, backend)
    maintainer.admit("authorlist_pct", [(5,), (6,)])
    maintainer.admit("reviewerlist_pct", [(2,)])
    report = maintainer.evict("authorlist_pct", [(5,)])
    assert report.rows_deleted["authorcopy"] == 1
    assert report.rows_deleted["bookcopy"] == len(
        pg(backend, "SELECT 1 FROM books WHERE authorid = 5")
    )
    assert local(
        store,
        "SELECT count(*) FROM bookcopy WHERE authorid NOT IN (SELECT authorid FROM authorcopy)",
    ) == [(0,)]
    orphans = local(
        store,
        "SELECT count(*) FROM reviewcopy WHERE isbn NOT IN (SELECT isbn FROM bookcopy) "
        "AND reviewerid NOT IN (SELECT reviewerid FROM reviewercopy)",
    )
    assert orphans == [(0,)]
    assert_mirrors_backend(store, backend)


def test_evicting_inside_a_complete_region_is_refused(store: CacheStore, backend: str) -> None:
    maintainer = Maintainer(store, backend)
    maintainer.admit("citylist_cpct", [("Madison",)])
    maintainer.admit("authorlist_pct", [(4,)])
    before = dump(store)
    with pytest.raises(ProgrammingError, match=r"complete region\(s\) \('Madison',\)"):
        maintainer.evict("authorlist_pct", [(8,)])
    assert dump(store) == before
    maintainer.evict("citylist_cpct", [("Madison",)])
    maintainer.evict("authorlist_pct", [(8,)])
    assert (8,) not in local(store, "SELECT authorid FROM authorcopy")


def test_refreshing_a_gray_view_names_its_root(store: CacheStore, backend: str) -> None:
    with pytest.raises(ProgrammingError, match="refresh authorcopy instead"):
        Maintainer(store, backend).refresh("bookcopy")


def test_admit_errors(store: CacheStore, backend: str) -> None:
    maintainer = Maintainer(store, backend)
    with pytest.raises(ProgrammingError, match="no control table 'nope'"):
        maintainer.admit("nope", [(1,)])
    with pytest.raises(ProgrammingError, match="is a cached view"):
        maintainer.admit("authorcopy", [(1,)])
    with pytest.raises(DataError, match=r"authorlist_pct\.authorid is integer: 'x' is not an"):
        maintainer.admit("authorlist_pct", [("x",)])


@pytest.mark.parametrize("point", ["after_snapshot", "after_pull", "before_commit"])
def test_an_injected_failure_leaves_the_cache_unchanged(
    store: CacheStore, backend: str, point: str
) -> None:
    Maintainer(store, backend).admit("authorlist_pct", [(4,)])
    pg(backend, "UPDATE authors SET name = 'changed'")
    before = dump(store)
    with pytest.raises(faults.InjectedFault):
        Maintainer(store, backend, faults_enabled=[point]).admit("authorlist_pct", [(8,)])
    assert dump(store) == before
    Maintainer(store, backend).refresh()  # and the cache still works afterwards
    assert_mirrors_backend(store, backend)


def test_a_backend_disconnect_leaves_the_cache_unchanged(store: CacheStore, backend: str) -> None:
    Maintainer(store, backend).admit("authorlist_pct", [(4,)])
    before = dump(store)
    with pytest.raises(BackendUnavailableError, match="lost the backend"):
        Maintainer(store, backend, faults_enabled=["after_snapshot:disconnect"]).refresh()
    assert dump(store) == before


def test_a_backend_error_leaves_the_cache_unchanged(store: CacheStore, backend: str) -> None:
    maintainer = Maintainer(store, backend)
    maintainer.admit("authorlist_pct", [(4,)])
    maintainer.admit("reviewerlist_pct", [(3,)])
    before = dump(store)
    pg(backend, "ALTER TABLE reviewers RENAME COLUMN city TO town")
    with pytest.raises(ProgrammingError, match="backend refused a pull"):
        maintainer.refresh()
    assert dump(store) == before


def test_a_process_killed_before_commit_leaves_the_file_unchanged(
    store: CacheStore, backend: str, tmp_path: Path
) -> None:
    Maintainer(store, backend).admit("authorlist_pct", [(4,)])
    before = dump(store)
    store.close()
    code = (
        "import sys\nfrom cache.store.cache_file import CacheStore\n"
        "from cache.maintenance.pipeline import Maintainer\n"
        "store = CacheStore(sys.argv[1])\n"
        "Maintainer(store, sys.argv[2]).admit('authorlist_pct', [(8,)])\n"
    )
    env = {**os.environ, "MTCACHE_FAULTS": "before_commit:kill"}
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "cache.duckdb"), backend],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == -9, result.stderr
    reopened = CacheStore(tmp_path / "cache.duckdb")
    try:
        assert dump(reopened) == before
    finally:
        reopened.close()


def test_status_reports_regions_with_currency(store: CacheStore, backend: str) -> None:
    maintainer = Maintainer(store, backend)
    maintainer.admit("citylist_csct", [("Madison",)])
    report = maintainer.admit("authorlist_pct", [(4,)])
    document = status(store)
    views = {v["name"]: v for v in document["views"]}
    author = views["authorcopy"]
    assert (author["color"], author["consistency"], author["rows"]) == ("white", "group", 1)
    regions = {(r["control"], tuple(r["key"])): r for r in author["regions"]}
    region = regions[("authorlist_pct", (4,))]
    assert region["snapshot_id"] == report.snapshot_id
    assert region["rows"] == 1 and 0 <= region["currency_seconds"] < 600
    assert regions[("citylist_csct", ("Madison",))]["rows"] == 1
    assert views["bookcopy"]["root"] == "authorcopy" and views["bookcopy"]["regions"] == []
    assert views["reviewcopy"]["regions"][0]["kind"] == "view"
    assert set(document["counters"]) == {
        "hits",
        "presence_misses",
        "currency_misses",
        "remote",
        "memo_hits",
        "memo_misses",
        "completeness_misses",
        "consistency_misses",
        "timeline_misses",
        "evictions",
        "budget_overruns",
        "deferred_admissions",
    }
    # bytes: of the data checkpointed into the file (what the WAL holds is not counted yet)
    store.con.execute("CHECKPOINT")
    sizes = {v["name"]: v["bytes"] for v in status(store)["views"]}
    assert sizes["authorcopy"] > 0 and sizes["reviewcopy"] > 0


def test_a_group_read_through_a_just_admitted_completeness_region(
    backend: str, tmp_path: Path
) -> None:
    """The guard answers a read of a listed completeness key locally: right after the key's
    admission the answer is PostgreSQL's, whatever the cache held of the group before (the
    chaos run over the wire once read 0 rows of such a group)."""
    import cache

    read = "SELECT authorid, name FROM authors WHERE city = %s ORDER BY authorid"
    with cache.connect(backend=backend, cache_path=tmp_path / "c.duckdb", background=False) as conn:
        conn.admin.apply_ddl(SCHEMA_FILE.read_text())
        conn.admin.admit("citylist_cpct", [("Madison",)])
        conn.admin.admit("authorlist_pct", [(6,)])  # (a Seattle author held before its city)
        conn.admin.admit("citylist_cpct", [("Seattle",)])
        cur = conn.cursor()
        for city in ("Madison", "Seattle"):
            cur.execute(read + " CURRENCY BOUND 10 MIN", [city])
            got = cur.fetchall()
            cur.execute("EXPLAIN LAST STATEMENT")
            assert cur.fetchone()[1] == "local"
            assert got == pg(backend, read, (city,)) != []


def test_an_operation_committing_during_another_is_not_overwritten(
    store: CacheStore, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refresh pulled at one snapshot; an author changes; Madison's completeness region is
    admitted from another thread before the refresh applies. Operations take their turns
    (from closure to commit), so the refresh's older row of author 4 never lands over the
    newer region: every Madison row is as the backend has it, all of one snapshot. (Without
    the turns the admission commits first, and the refresh then writes its older row.)"""
    from cache.maintenance import pipeline

    Maintainer(store, backend).admit("authorlist_pct", [(4,)])
    real = pipeline.apply_pull
    other = store.for_thread()
    admitting = threading.Thread(
        target=lambda: Maintainer(other, backend).admit("citylist_cpct", [("Madison",)])
    )
    calls: list[str] = []

    def apply_pull(*args: object, **kwargs: object) -> None:
        calls.append("apply")
        if len(calls) == 1:  # the refresh's, its rows pulled already
            pg(backend, "UPDATE authors SET name = 'later' WHERE authorid = 4")
            admitting.start()
            admitting.join(1.0)  # (it waits for the refresh's turn to end)
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pipeline, "apply_pull", apply_pull)
    Maintainer(store, backend).refresh("authorcopy")
    admitting.join()
    other.close()
    assert len(calls) == 2
    assert_mirrors_backend(store, backend)
    assert local(store, "SELECT name FROM authorcopy WHERE authorid = 4") == [("later",)]
    stamps = set(snapshot_ids(store, "authorlist_pct", "authorid").values())
    assert len(stamps) == 1 and stamps == set(snapshot_ids(store, "citylist_cpct", "city").values())


def test_an_interrupted_operation_says_cancelled(
    store: CacheStore, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB interrupted under an operation (a cancel, the server's statement timeout): the
    error is 57014's, which the server words by its reason, not a failure of the cache, and
    the cache is unchanged."""
    import duckdb

    from cache.maintenance import pipeline
    from sql_ext.errors import QueryCanceledError

    maintainer = Maintainer(store, backend)
    maintainer.admit("authorlist_pct", [(4,)])
    before = dump(store)

    def interrupted(*args: object, **kwargs: object) -> None:
        raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")

    monkeypatch.setattr(pipeline, "apply_pull", interrupted)
    with pytest.raises(QueryCanceledError):
        maintainer.refresh("authorcopy")
    assert dump(store) == before
