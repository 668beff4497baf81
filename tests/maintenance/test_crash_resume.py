"""A process that owns the cache file killed (SIGKILL: no cleanup) while it populates a view or
admits a key: reopening the file converges to the backend's rows - an interrupted initial
population of a `REFRESH CONTINUOUSLY` view is pulled again by the next owning process's
scheduler, an interrupted admission left nothing behind - and no answer meanwhile breaks its
currency and consistency bound (a region never populated is never read)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from cache.engine.admin import Admin
from cache.maintenance import stream
from cache.maintenance.pipeline import make_engine
from cache.maintenance.scheduler import RefreshScheduler
from cache.tools import bookstore
from tests.maintenance.test_maintenance import local, pg

VIEW = "CREATE CACHED VIEW salescopy AS SELECT * FROM sales REFRESH CONTINUOUSLY"
QUERY = "SELECT saleid, isbn, qty FROM sales s ORDER BY saleid CURRENCY BOUND 10 MIN"


def _killed_owner(dsn: str, path: Path, fault: str, work: str) -> None:
    """Run ``work`` (Python, ``conn`` a connection on the file) in a process of its own that
    SIGKILLs itself at the named fault point."""
    script = textwrap.dedent(f"""
        import cache
        conn = cache.connect({dsn!r}, {str(path)!r}, background=False, admit_on_miss=False)
    """) + textwrap.dedent(work)
    env = {**os.environ, "MTCACHE_FAULTS": f"{fault}:kill"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr


def _answers(dsn: str, path: Path) -> tuple[list[tuple[object, ...]], set[str]]:
    """The cache's answer to QUERY and the routes its accesses took."""
    with cache.connect(dsn, path, background=False, admit_on_miss=False) as conn:
        cur = conn.cursor()
        cur.execute(QUERY)
        return cur.fetchall(), {p["route"] for p in cur.provenance}


@pytest.mark.parametrize("point", ["after_snapshot", "after_pull", "before_commit"])
def test_a_killed_initial_population_is_pulled_again(
    point: str, pg_cluster: EmbeddedPostgres, tmp_path: Path
) -> None:
    dsn = pg_cluster.create_database(f"resume_{point}")
    bookstore.load_into(dsn)
    path = tmp_path / "cache.duckdb"
    _killed_owner(
        dsn,
        path,
        point,
        f"""
        conn.admin.apply_ddl({VIEW!r})
        conn.admin.refresh("salescopy", engine="inline")
    """,
    )
    # the backend moves on while no process owns the file
    pg(dsn, "UPDATE sales SET qty = qty + 1 WHERE saleid <= 3")
    pg(
        dsn,
        "INSERT INTO sales SELECT saleid + 1000000, isbn, sold_on, qty FROM sales "
        "WHERE saleid <= 2",
    )
    want = pg(dsn, "SELECT saleid, isbn, qty FROM sales ORDER BY saleid")
    with Admin.open(path, dsn) as admin:
        store = admin.store
        [view] = [v for v in admin.status()["views"] if v["name"] == "salescopy"]
        assert [r["refreshed_at"] for r in view["regions"]] == [None]  # never populated
        with stream.Consumer(store.for_thread(), dsn) as consumer:
            consumer.catch_up()  # the stream alone touches rows of a region never populated
            assert _answers(dsn, path) == (want, {"remote"})  # which no answer reads
            scheduler = RefreshScheduler(store, dsn, make_engine("inline"))
            assert [r.operation for r in scheduler.run_once()] == ["refresh salescopy"]
            assert scheduler.run_once() == []  # populated: the stream keeps it current now
            pg(dsn, "UPDATE sales SET qty = qty + 10 WHERE saleid = 1")
            consumer.catch_up()
        want = pg(dsn, "SELECT * FROM sales ORDER BY saleid")
        assert local(store, "SELECT * FROM salescopy ORDER BY saleid") == want
        [view] = [v for v in admin.status()["views"] if v["name"] == "salescopy"]
        assert view["regions"][0]["refreshed_at"] is not None
    rows, routes = _answers(dsn, path)
    assert routes == {"local"}
    assert rows == [r[:2] + r[3:] for r in want]
    with Admin.open(path, dsn) as admin:
        admin.apply_ddl("DROP CACHED VIEW salescopy")  # its slot goes with it


def test_a_killed_admission_leaves_nothing_and_can_be_made_again(
    pg_cluster: EmbeddedPostgres, tmp_path: Path
) -> None:
    dsn = pg_cluster.create_database("resume_admission")
    bookstore.load_into(dsn)
    path = tmp_path / "cache.duckdb"
    with Admin.open(path, dsn) as admin:
        admin.apply_ddl(bookstore.CACHE_SCHEMA_FILE.read_text())
        before = admin.status()
    _killed_owner(
        dsn,
        path,
        "before_commit",
        """
        conn.admin.admit("authorlist_pct", [4])
    """,
    )
    with Admin.open(path, dsn) as admin:
        after = admin.status()
        assert [v["regions"] for v in after["views"]] == [v["regions"] for v in before["views"]]
        assert local(admin.store, "SELECT count(*) FROM authorcopy") == [(0,)]
        admin.admit("authorlist_pct", [4])
        assert local(admin.store, "SELECT authorid, name FROM authorcopy") == pg(
            dsn, "SELECT authorid, name FROM authors WHERE authorid = 4"
        )
