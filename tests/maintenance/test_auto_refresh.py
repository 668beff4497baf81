"""REFRESH AUTO: a view's interval follows the bounds its queries ask (the reads' asks, folded
by the scheduler, choose it; the scheduler refreshes at it). The moments the choices are made
at are given, not measured: a test must not depend on how fast a machine is."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from cache.engine.stats import document_samples
from cache.maintenance.auto_refresh import AutoIntervals
from cache.maintenance.engines import InlineEngine
from cache.maintenance.pipeline import Maintainer
from cache.maintenance.scheduler import RefreshScheduler, due_views
from cache.store.bound_asks import ASKS_HALF_LIFE, BoundAsks
from cache.store.cache_file import CacheStore
from cache.store.refresh_times import auto_refreshes, longest_delays
from sql_ext import parse
from tests.answers import assert_same_answer
from tests.maintenance.test_scheduler import bookstore_cache

SCHEMA = """
CREATE CACHED VIEW salescopy AS SELECT * FROM sales REFRESH AUTO;
CREATE CACHED VIEW reviewercopy AS SELECT * FROM reviewers REFRESH AUTO WITH NO DATA;
"""
POINT = "SELECT s.qty FROM sales s WHERE s.saleid = %s CURRENCY BOUND {bound} ON (s)"


@pytest.fixture
def setup(pg_cluster: EmbeddedPostgres, tmp_path: Path) -> Iterator[tuple[CacheStore, str]]:
    yield from bookstore_cache(pg_cluster, tmp_path, "auto_refresh", SCHEMA)


def read(conn: cache.Connection, bound: str, times: int) -> None:
    """``times`` point reads of sales under ``bound``, each answered as PostgreSQL answers."""
    cur = conn.cursor()
    for i in range(times):
        cur.execute(POINT.format(bound=bound), (1 + i % 5,))
        cur.fetchall()


def test_the_interval_follows_the_bounds_asked(setup: tuple[CacheStore, str]) -> None:
    store, dsn = setup
    chooser = AutoIntervals(store, dsn)
    with cache.connect(dsn, store.path, background=False) as conn:
        conn.admin.refresh("salescopy")  # (a measured delay d)
        start = time.time()
        # nobody asked yet: not refreshed, and said why
        choice = chooser.choose(start)["salescopy"]
        assert choice.interval is None and "no query asked" in choice.reason
        assert due_views(store, dt.datetime.now(dt.UTC) + dt.timedelta(days=1)) == []

        read(conn, "10 MIN", 300)
        loose = chooser.choose(start + 30)["salescopy"]
        delay = longest_delays(store)["salescopy"]
        assert loose.interval == pytest.approx(600 - delay), loose
        assert loose.served == (600.0,)
        # the file keeps the choice: the scheduler and status read it
        kept = auto_refreshes(store)["salescopy"]
        assert kept.interval == loose.interval and kept.reason == loose.reason
        stamp = store.con.execute(
            "SELECT refreshed_at FROM mtcache.view_state WHERE view = 'salescopy'"
        ).fetchone()
        assert stamp is not None
        after = stamp[0] + dt.timedelta(seconds=600 - delay)
        assert due_views(store, after - dt.timedelta(seconds=1)) == []
        assert due_views(store, after + dt.timedelta(seconds=1)) == ["salescopy"]
        # status, SHOW CACHED VIEWS and the metrics show the interval, the bounds and why
        [sales] = [v for v in conn.admin.status()["views"] if v["name"] == "salescopy"]
        assert sales["refresh_auto"]["interval_seconds"] == loose.interval
        assert sales["refresh_auto"]["bounds_served"] == [600.0]
        assert sales["refresh_auto"]["reason"] == loose.reason
        assert [a["bound_seconds"] for a in sales["bounds_asked"]] == [600.0]
        assert sales["bounds_asked"][0]["queries_per_hour"] > 0
        cur = conn.execute("SHOW CACHED VIEWS")
        rows = {r[0]: dict(zip([d[0] for d in cur.description], r, strict=True)) for r in cur}
        assert rows["salescopy"]["refresh"].startswith("auto, every ")
        assert rows["salescopy"]["refresh_reason"] == loose.reason
        assert rows["reviewercopy"]["refresh"] == "auto, not now"
        samples = {(s.name, s.labels): s.value for s in document_samples(conn.admin.status())}
        interval = ("mtcache_view_refresh_interval_seconds", (("view", "salescopy"),))
        assert samples[interval] == loose.interval
        asked = ("mtcache_view_bound_queries_per_hour", (("view", "salescopy"), ("bound", "600")))
        assert samples[asked] > 0

        # tighter bounds, asked often enough to pay for refreshing every few seconds (a pull
        # of sales costs ~100 times what a point read saves): the interval shrinks
        read(conn, "5 SEC", 3000)
        tight = chooser.choose(start + 60)["salescopy"]
        assert tight.interval == pytest.approx(5 - delay), tight
        assert tight.served == (5.0, 600.0)

        # nobody reads any more: after long enough, the refreshes stop
        idle = chooser.choose(start + 30 * ASKS_HALF_LIFE)["salescopy"]
        assert idle.interval is None and "more than the local answers would save" in idle.reason
        assert auto_refreshes(store)["salescopy"].interval is None
        assert due_views(store, dt.datetime.now(dt.UTC) + dt.timedelta(days=1)) == []

        # and every answer was PostgreSQL's
        answer = assert_same_answer(
            conn,
            dsn,
            POINT.format(bound="10 MIN"),
            "SELECT s.qty FROM sales s WHERE s.saleid = %s",
            (3,),
        )
        assert answer.route == "local"


def test_the_asks_are_counted_on_every_path_and_kept_in_the_file(
    setup: tuple[CacheStore, str],
) -> None:
    """Each read counts its bounds once, whether a plan, the memo or a lane answered it, or the
    backend (the view not fresh enough); the counts outlive the process in the file."""
    store, dsn = setup
    with cache.connect(dsn, store.path, background=False) as conn:
        conn.admin.refresh("salescopy")
        read(conn, "10 MIN", 40)  # local: plans, the memo, a lane
        read(conn, "1 MS", 7)  # below the refresh delay: the backend answers
        cur = conn.cursor()
        cur.execute("SELECT count(*) FROM reviewers r CURRENCY BOUND 2 MIN ON (r)")
        assert cur.provenance[0]["route"] != "local"  # never filled: the backend
    now = time.time()
    asks = store.load_asks()
    asks.fold(now)
    assert asks.counts("salescopy", now) == {600.0: 40.0, 0.001: 7.0}
    assert asks.counts("reviewercopy", now) == {120.0: 1.0}
    store.save_gathered(now, force=True)
    again = BoundAsks()
    again.load(
        store.con.execute(
            "SELECT view, bound, queries, saved, epoch(since), epoch(as_of) FROM mtcache.bound_asks"
        ).fetchall()
    )
    assert again.counts("salescopy", now) == pytest.approx({600.0: 40.0, 0.001: 7.0})
    # (the moments kept to the microsecond)
    later = now + 60
    for kept, counted in zip(
        again.rates("salescopy", later), asks.rates("salescopy", later), strict=True
    ):
        assert kept == pytest.approx(counted)


def test_the_scheduler_refreshes_what_the_bounds_ask(setup: tuple[CacheStore, str]) -> None:
    """The scheduler chooses at each tick and refreshes at the interval chosen; a view never
    filled and never read (reviewercopy, WITH NO DATA) is not pulled."""
    store, dsn = setup
    with cache.connect(dsn, store.path, background=False) as conn:
        conn.admin.refresh("salescopy")
        read(conn, "30 SEC", 300)
    scheduler = RefreshScheduler(store, dsn, InlineEngine(), tick=5.0)
    try:
        soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=10)
        assert scheduler.run_once(soon) == []  # chosen: 30 s - d; not due yet
        interval = auto_refreshes(store)["salescopy"].interval
        assert interval is not None and 25 < interval < 30
        later = soon + dt.timedelta(seconds=60)
        reports = scheduler.run_once(later)
        assert [r.operation for r in reports] == ["refresh salescopy"]
        assert scheduler.errors == []
        assert auto_refreshes(store)["reviewercopy"].interval is None
    finally:
        scheduler.stop()


def test_an_objective_warns_before_it_is_missed_and_when_it_is(
    setup: tuple[CacheStore, str], caplog: pytest.LogCaptureFixture
) -> None:
    """REFRESH AUTO WITHIN keeps a view nobody reads; when refreshes take so long to land that
    the next one will be late, the scheduler says so before, and again once the data is older
    than the objective (a log line each, the state in status and the metrics). The slow
    landing is given (a fault point's sleep), the moments too."""
    store, dsn = setup
    store.apply_ddl(
        parse("CREATE CACHED VIEW authorcopy AS SELECT * FROM authors REFRESH AUTO WITHIN 3 SEC"),
        store.load_catalog(),
    )
    scheduler = RefreshScheduler(store, dsn, InlineEngine(), tick=5.0)
    try:
        # nobody reads it, yet the objective keeps it: filled at once, then every few seconds
        reports = scheduler.run_once(dt.datetime.now(dt.UTC))
        assert "refresh authorcopy" in [r.operation for r in reports]
        interval = auto_refreshes(store)["authorcopy"].interval
        assert interval is not None and interval < 3
        assert scheduler.warnings == []  # met

        # a refresh that takes 2.5 s to land: the next one cannot land within 3 s
        Maintainer(store, dsn, faults_enabled=["after_pull:sleep=2.5"]).refresh("authorcopy")
        scheduler.intervals.choose()
        assert "cannot be met" in auto_refreshes(store)["authorcopy"].reason
        [(stamp,)] = store.con.execute(
            "SELECT refreshed_at FROM mtcache.view_state WHERE view = 'authorcopy'"
        ).fetchall()
        with caplog.at_level("WARNING", logger="mtcache.scheduler"):
            [before] = scheduler.watch_objectives(stamp + dt.timedelta(seconds=0.5))
            assert before.startswith("authorcopy will miss its objective of 3 sec: its data will")
            [missed] = scheduler.watch_objectives(stamp + dt.timedelta(seconds=10))
            assert missed == "authorcopy missed its objective of 3 sec: its data is 10.0 s old"
            assert scheduler.watch_objectives(stamp + dt.timedelta(seconds=11)) == []  # said
        assert [r.getMessage() for r in caplog.records] == [before, missed]
    finally:
        scheduler.stop()
    with cache.connect(dsn, store.path, background=False) as conn:
        document = conn.admin.status()
    [view] = [v for v in document["views"] if v["name"] == "authorcopy"]
    goal = view["refresh_auto"]["objective"]
    assert goal["state"] in ("at risk", "missed") and goal["predicted_age_seconds"] > 3
    samples = {(s.name, s.labels): s.value for s in document_samples(document)}
    assert samples["mtcache_view_objective_at_risk", (("view", "authorcopy"),)] == 1.0
    assert samples["mtcache_view_objective_seconds", (("view", "authorcopy"),)] == 3.0


def test_a_burst_of_reads_that_miss_refreshes_ahead_of_the_schedule(
    setup: tuple[CacheStore, str],
) -> None:
    """Reads asking for fresher data than the view holds, in a burst worth more than a pull,
    make the scheduler refresh it at once (an upquery), though at their hourly rate no
    interval pays; a few such reads do not. The folds' moments are given: each window of
    reads is read as 10 s long."""
    store, dsn = setup
    scheduler = RefreshScheduler(store, dsn, InlineEngine(), tick=5.0)
    try:
        with cache.connect(dsn, store.path, background=False) as conn:
            conn.admin.refresh("salescopy")
            base = time.time()
            read(conn, "5 SEC", 1)  # asked first three hours ago: an hourly rate of little
            scheduler.intervals.choose(base - 3 * 3600)
            for number, (count, refreshed) in enumerate(((3, False), (3000, True))):
                start = dt.datetime.fromtimestamp(base + 10 * number, dt.UTC)
                assert scheduler.run_once(start) == []  # (the fold before the burst)
                read(conn, "5 SEC", count)
                reports = scheduler.run_once(start + dt.timedelta(seconds=10))
                assert auto_refreshes(store)["salescopy"].interval is None
                assert scheduler.errors == []
                assert [r.operation for r in reports] == (
                    ["refresh salescopy"] if refreshed else []
                )
            # the refresh read the backend after the burst began
            [(stamp,)] = store.con.execute(
                "SELECT refreshed_at FROM mtcache.view_state WHERE view = 'salescopy'"
            ).fetchall()
            began = dt.datetime.fromtimestamp(base, dt.UTC)
            assert stamp >= began - dt.timedelta(seconds=1)  # (the backend's clock, not ours)
    finally:
        scheduler.stop()


REGIONS = """
CREATE CONTROL TABLE reviewerlist (reviewerid INTEGER);
CREATE CACHED VIEW reviewerpart AS SELECT * FROM reviewers
    PRESENCE ON (reviewerid) IN reviewerlist REFRESH AUTO;
"""
REVIEWER = "SELECT r.name FROM reviewers r WHERE r.reviewerid = %s CURRENCY BOUND 10 MIN ON (r)"


@pytest.fixture
def regions(pg_cluster: EmbeddedPostgres, tmp_path: Path) -> Iterator[tuple[CacheStore, str]]:
    yield from bookstore_cache(pg_cluster, tmp_path, "auto_regions", REGIONS)


def region_stamps(store: CacheStore) -> dict[int, dt.datetime]:
    return dict(store.con.execute("SELECT reviewerid, refreshed_at FROM reviewerlist").fetchall())


def read_reviewers(conn: cache.Connection, keys: list[int], times: int) -> list[str]:
    """Reads of the reviewers under a 10 min bound, each answered as PostgreSQL answers; the
    route of each key's last."""
    cur = conn.cursor()
    routes = []
    for key in keys:
        for _ in range(times):
            cur.execute(REVIEWER, (key,))
            assert len(cur.fetchall()) == 1
        routes.append(cur.provenance[0]["route"])
    return routes


def test_a_region_nobody_reads_is_not_refreshed(regions: tuple[CacheStore, str]) -> None:
    """A presence-controlled REFRESH AUTO view's refresh pulls only the regions read since
    their last refresh - locally, or by a read their data was too old for - and none when
    none was (the scheduler looks again an interval later). The moments are given, and so is
    when the reads began to be watched: before the keys were admitted."""
    store, dsn = regions
    scheduler = RefreshScheduler(store, dsn, InlineEngine(), tick=5.0)
    try:
        with cache.connect(dsn, store.path, background=False) as conn:
            conn.admin.admit("reviewerlist", [1, 2, 3])
            store.region_reads.watch(["reviewerlist"], lambda control: None)
            admitted = region_stamps(store)
            now = dt.datetime.now(dt.UTC)
            assert scheduler.run_once(now) == []  # nobody asked yet
            assert read_reviewers(conn, [1, 2], 150) == ["local", "local"]

            first = now + dt.timedelta(seconds=1000)
            [report] = scheduler.run_once(first)
            assert report.operation == "refresh reviewerpart (2 regions read since refreshed)"
            refreshed = region_stamps(store)
            assert refreshed[1] > admitted[1] and refreshed[2] > admitted[2]
            assert refreshed[3] == admitted[3]  # nobody read reviewer 3: not refreshed

            # reviewer 1 read locally; reviewer 3's data an hour older than it is (given, not
            # waited for): the backend answers it, and that read counts
            with store.transaction() as con:
                con.execute(
                    "UPDATE reviewerlist SET refreshed_at = refreshed_at - INTERVAL 1 HOUR "
                    "WHERE reviewerid = 3"
                )
                store.changed(["reviewerpart"])
            assert read_reviewers(conn, [1, 3], 1) == ["local", "remote"]
            second = first + dt.timedelta(seconds=1000)
            [report] = scheduler.run_once(second)
            assert report.operation == "refresh reviewerpart (2 regions read since refreshed)"
            after = region_stamps(store)
            assert after[1] > refreshed[1] and after[3] > refreshed[3]
            assert after[2] == refreshed[2]  # nobody read reviewer 2 since: not refreshed

            # nobody reads: none is refreshed, and the scheduler looks again an interval later
            third = second + dt.timedelta(seconds=1000)
            assert scheduler.run_once(third) == []
            assert region_stamps(store) == after
            interval = auto_refreshes(store)["reviewerpart"].interval
            assert interval is not None
            again = third + dt.timedelta(seconds=interval)
            assert due_views(store, again - dt.timedelta(seconds=1)) == []
            assert due_views(store, again + dt.timedelta(seconds=1)) == ["reviewerpart"]
            assert scheduler.errors == []

            # and the answers are PostgreSQL's
            answer = assert_same_answer(
                conn,
                dsn,
                REVIEWER,
                "SELECT r.name FROM reviewers r WHERE r.reviewerid = %s",
                (1,),
            )
            assert answer.route == "local"
    finally:
        scheduler.stop()


def test_a_view_gray_views_follow_is_refreshed_whole(
    pg_cluster: EmbeddedPostgres, tmp_path: Path
) -> None:
    """The books of the authors cached are read by the authors' keys, not the books': a
    REFRESH AUTO view that another view is controlled by (gray, or white of one snapshot) is
    refreshed whole, as is one with an objective (the one with neither, by the regions read:
    test_a_region_nobody_reads_is_not_refreshed)."""
    schema = """
    CREATE CONTROL TABLE authorlist (authorid INTEGER);
    CREATE CACHED VIEW authorpart AS SELECT * FROM authors
        PRESENCE ON (authorid) IN authorlist REFRESH AUTO;
    CREATE CACHED VIEW bookpart AS SELECT isbn, authorid, title FROM books
        PRESENCE ON (authorid) IN authorpart CONSISTENCY ROOT;
    CREATE CONTROL TABLE reviewerlist (reviewerid INTEGER);
    CREATE CACHED VIEW reviewerpart AS SELECT * FROM reviewers
        PRESENCE ON (reviewerid) IN reviewerlist REFRESH AUTO WITHIN 10 MIN;
    CREATE CONTROL TABLE isbnlist (isbn TEXT);
    CREATE CACHED VIEW salespart AS SELECT * FROM sales
        PRESENCE ON (isbn) IN isbnlist REFRESH AUTO;
    CREATE CACHED VIEW salesreviews AS SELECT * FROM reviews
        PRESENCE ON (isbn) IN salespart CONSISTENCY ON ALL REFRESH EVERY 10 MIN;
    """
    for store, dsn in bookstore_cache(pg_cluster, tmp_path, "auto_whole", schema):
        chooser = AutoIntervals(store, dsn)
        assert chooser.read_regions("authorpart") is None
        assert chooser.read_regions("reviewerpart") is None
        assert chooser.read_regions("salespart") is None
