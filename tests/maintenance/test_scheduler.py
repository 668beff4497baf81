"""The refresh scheduler: views are refreshed when their REFRESH EVERY interval elapses."""

from __future__ import annotations

import datetime as dt
import time
import typing as t
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.reflect import fetch_catalog
from cache.maintenance.engines import InlineEngine
from cache.maintenance.pipeline import Maintainer
from cache.maintenance.scheduler import MIN_WAIT, RefreshScheduler, due_views, next_due
from cache.store.cache_file import CacheStore
from cache.tools import bookstore
from sql_ext import parse
from tests.maintenance.test_maintenance import local, pg

SCHEMA = """
CREATE CONTROL TABLE authorlist_pct (authorid INTEGER);
CREATE CACHED VIEW authorcopy AS SELECT * FROM authors PRESENCE ON (authorid) IN authorlist_pct
    REFRESH EVERY 10 MIN;
CREATE CACHED VIEW bookcopy AS SELECT isbn, authorid, title FROM books
    PRESENCE ON (authorid) IN authorcopy CONSISTENCY ROOT;
CREATE CACHED VIEW salescopy AS SELECT * FROM sales REFRESH EVERY 1 SEC;
CREATE CACHED VIEW reviewercopy AS SELECT * FROM reviewers;
"""


def bookstore_cache(
    pg_cluster: EmbeddedPostgres, directory: Path, database: str, schema: str
) -> Iterator[tuple[CacheStore, str]]:
    """A new bookstore database and a cache file in ``directory`` with ``schema`` applied."""
    dsn = pg_cluster.create_database(database)
    bookstore.load_into(dsn)
    store = CacheStore(directory / "cache.duckdb")
    store.save_catalog(fetch_catalog(dsn))
    store.apply_ddl(parse(schema), store.load_catalog())
    yield store, dsn
    store.close()


@pytest.fixture
def setup(pg_cluster: EmbeddedPostgres, tmp_path: Path) -> Iterator[tuple[CacheStore, str]]:
    yield from bookstore_cache(pg_cluster, tmp_path, "scheduler", SCHEMA)


def test_due_views_follow_the_intervals(setup: tuple[CacheStore, str]) -> None:
    store, dsn = setup
    now = dt.datetime.now(dt.UTC)
    # salescopy was never populated; authorcopy has no region; reviewercopy has no interval.
    assert due_views(store, now) == ["salescopy"]
    maintainer = Maintainer(store, dsn)
    maintainer.refresh("salescopy")
    maintainer.admit("authorlist_pct", [(4,)])
    now = dt.datetime.now(dt.UTC)
    assert due_views(store, now) == []
    assert due_views(store, now + dt.timedelta(seconds=2)) == ["salescopy"]
    assert due_views(store, now + dt.timedelta(minutes=11)) == ["authorcopy", "salescopy"]
    # the scheduler wakes when the first of them is due (salescopy's 1 s), not a tick later
    sales = next_due(store)
    second = dt.timedelta(seconds=1)
    assert sales is not None and now - second < sales <= now + second


def test_the_scheduler_refreshes_on_time(setup: tuple[CacheStore, str]) -> None:
    """A view is refreshed when its interval elapses, not up to a tick later: with a 1 s
    interval and a 5 s tick, the scheduler sleeps until the view is due, no longer (the
    moments given, not measured: a test must not depend on how fast a machine is)."""
    store, dsn = setup
    scheduler = RefreshScheduler(store, dsn, InlineEngine(), tick=5.0)
    try:
        later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
        assert scheduler.run_once(later)  # every view due: each refreshed once
        due = next_due(store)
        assert due is not None
        second = dt.timedelta(seconds=1)
        assert scheduler.until_due(due - 0.25 * second) == pytest.approx(0.25)
        assert scheduler.until_due(due - 30 * second) == 5.0  # a tick at most (new views)
        assert scheduler.until_due(due + second) == MIN_WAIT  # due already: at once
        assert scheduler.run_once(due) and scheduler.errors == []  # due: refreshed
        assert scheduler.run_once(due) == []  # refreshed just now: not due again
    finally:
        scheduler.stop()


def test_the_scheduler_thread_keeps_a_view_fresh(setup: tuple[CacheStore, str]) -> None:
    store, dsn = setup
    scheduler = RefreshScheduler(store, dsn, InlineEngine(), tick=0.1)
    scheduler.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(scheduler.reports) < 2:
            time.sleep(0.05)
        pg(dsn, "UPDATE sales SET qty = 99 WHERE saleid = 1")
        seen = len(scheduler.reports)
        while time.monotonic() < deadline and len(scheduler.reports) <= seen:
            time.sleep(0.05)
    finally:
        scheduler.stop()
    assert scheduler.errors == []
    assert len(scheduler.reports) >= 3
    assert {r.operation for r in scheduler.reports} == {"refresh salescopy"}
    assert local(store, "SELECT qty FROM salescopy WHERE saleid = 1") == [(99,)]
    ids = [r.snapshot_id for r in scheduler.reports]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_a_connection_runs_the_scheduler_while_open(setup: tuple[CacheStore, str]) -> None:
    """The process that opens the cache refreshes views by itself: one scheduler
    per file per process, stopped when the last connection closes; ``background=False`` runs
    none."""
    import threading

    import cache
    from cache.maintenance import background

    store, dsn = setup
    path = store.path
    store.close()  # the connections below own the file now
    query = "SELECT s.qty FROM sales s WHERE s.saleid = 1 CURRENCY BOUND 3 SEC ON (s)"
    quiet = cache.connect(dsn, path, background=False)
    assert background.running(path) is None
    first = cache.connect(dsn, path)
    second = cache.connect(dsn, path)
    running = background.running(path)
    assert running is not None and running.users == 2
    try:
        pg(dsn, "UPDATE sales SET qty = 77 WHERE saleid = 1")
        deadline = time.monotonic() + 60
        answer: list[tuple[object, ...]] = []
        route = ""
        while time.monotonic() < deadline and (answer, route) != ([(77,)], "local"):
            cur = quiet.execute(query)  # nobody refreshes on demand: the scheduler must
            answer, route = cur.fetchall(), cur.provenance[0]["route"]
            time.sleep(0.2)
        assert (answer, route) == ([(77,)], "local")
        first.close()
        assert background.running(path) is running and running.users == 1
    finally:
        second.close()
        quiet.close()
    assert background.running(path) is None
    assert not [t for t in threading.enumerate() if t.name == "mtcache-refresh"]
    with cache.Admin.open(path) as admin:
        views = {v["name"]: v for v in admin.status()["views"]}
    sales = views["salescopy"]
    assert sales["last_refresh"] is not None and sales["next_refresh"] is not None
    assert views["reviewercopy"]["next_refresh"] is None  # no interval: on demand
    assert views["bookcopy"]["refresh_follows"] == "authorcopy"
    assert views["authorcopy"]["next_refresh"] is None  # no regions yet: waits for admissions


def test_the_refresh_delay_is_measured_per_view_and_planned_with(
    setup: tuple[CacheStore, str],
) -> None:
    """d of §4.6 is measured from the refreshes (how old their snapshot was when their rows
    became visible), shown by status, and used by the plan (EXPLAIN shows the d it used)."""
    import math

    import cache

    store, dsn = setup
    path = store.path
    store.close()
    with cache.connect(dsn, path, background=False) as conn:
        for _ in range(3):
            conn.admin.refresh("salescopy")
        views = {v["name"]: v for v in conn.admin.status()["views"]}
        delay = views["salescopy"]["refresh_delay_seconds"]
        assert delay is not None and 0 < delay < 60
        assert views["reviewercopy"]["refresh_delay_seconds"] is None  # never refreshed
        plan = conn.explain(
            "SELECT s.qty FROM sales s WHERE s.saleid = 1 CURRENCY BOUND 10 MIN ON (s)"
        ).to_json()

    def unions(node: dict[str, t.Any]) -> list[dict[str, t.Any]]:
        found = [node] if node["op"] == "SwitchUnion" else []
        return found + [u for child in node.get("children", []) for u in unions(child)]

    found = unions(plan["plan"])
    assert len(found) == 1, (plan["plan"], delay)
    (union,) = found
    assert union["guard"]["view"] == "salescopy"
    assert union["refresh_delay_seconds"] == math.ceil(delay * 100) / 100


def test_an_emulated_transport_delay_is_measured_as_the_views_delay(
    setup: tuple[CacheStore, str],
) -> None:
    """``after_pull:sleep=S`` (fault injection) delays the rows' arrival by S seconds, and the
    measured delay d of the view (cost model, status) includes it."""
    from cache.store.refresh_times import measured_delays

    store, dsn = setup
    Maintainer(store, dsn).refresh("salescopy")
    quick = measured_delays(store)["salescopy"]
    Maintainer(store, dsn, faults_enabled=["after_pull:sleep=0.6"]).refresh("salescopy")
    [(slow,)] = local(
        store, "SELECT delay_seconds FROM mtcache.snapshots ORDER BY snapshot_id DESC LIMIT 1"
    )
    assert 0.6 <= slow < 0.6 + quick + 0.5, (quick, slow)
    assert measured_delays(store)["salescopy"] == (quick + slow) / 2  # the median of the two
