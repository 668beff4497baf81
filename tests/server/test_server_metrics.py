"""The server's Prometheus endpoint scraped while a load runs: the cache's figures and the
server's move with the load, each view's figures are the view's, /livez and /readyz answer,
and SHOW CACHE STATS gives the same figures over SQL."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cache.engine.conversation.statistics import FOLD
from cache.server.options import ServerOptions
from tests.serving import Served, numbers_table, quiet, serving

BOOKS = "SELECT isbn, title FROM books WHERE authorid = %s CURRENCY BOUND 10 MIN"
NUMBER = "SELECT n FROM numbers WHERE n = %s CURRENCY BOUND 10 MIN"  # (numbercopy's: a lane)


@pytest.fixture(scope="module")
def served(bookstore_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    numbers_table(bookstore_dsn)
    with serving(
        bookstore_dsn,
        tmp_path_factory.mktemp("metrics") / "cache.duckdb",
        (1, 2),
        ServerOptions(metrics="127.0.0.1:0"),
        numbers=True,
    ) as found:
        yield found


def url(served: Served, path: str) -> str:
    assert served.server.metrics is not None
    host, port = served.server.metrics.address
    return f"http://{host}:{port}{path}"


def scrape(served: Served) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url(served, "/metrics"), timeout=60) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_scraped_while_a_load_runs(served: Served) -> None:
    stop, errors = threading.Event(), []
    running = threading.Barrier(3)

    def load() -> None:
        try:
            with psycopg.connect(served.dsn, autocommit=True) as conn:
                running.wait(60)
                while not stop.is_set():
                    conn.execute(BOOKS, [1]).fetchall()
        except Exception as exc:  # (reported below)
            errors.append(exc)

    clients = [threading.Thread(target=load) for _ in range(2)]
    for client in clients:
        client.start()
    try:
        running.wait(60)
        first = scrape(served)
        local = ("mtcache_accesses_total", (("outcome", "local"),))
        while scrape(served)[local] <= first[local] + 10 and not errors:
            pass  # (the load goes on: the counter must move between scrapes)
        during = scrape(served)
    finally:
        stop.set()
        for client in clients:
            client.join(60)
    assert not errors, errors
    assert during[("mtcache_sessions", ())] >= 2
    assert during[("mtcache_backend_up", ())] == 1
    from importlib.metadata import version

    assert during[("mtcache_build_info", (("version", version("mtcache")),))] == 1
    assert (
        during[("mtcache_server_statements_total", (("path", "lane"),))]
        + during[("mtcache_server_statements_total", (("path", "at_hand"),))]
        > 0
    )
    with psycopg.connect(served.backend) as pg:
        books = pg.execute("SELECT count(*) FROM books WHERE authorid IN (1, 2)").fetchone()
    assert books is not None
    assert during[("mtcache_view_rows", (("view", "bookcopy"),))] == books[0]
    assert during[("mtcache_view_regions", (("view", "authorcopy"),))] == 2
    assert during[("mtcache_view_staleness_seconds", (("view", "authorcopy"),))] >= 0


def test_liveness_and_readiness(served: Served) -> None:
    for path, said in (("/livez", b"live\n"), ("/readyz", b"ready\n")):
        with urllib.request.urlopen(url(served, path), timeout=60) as answer:
            assert (answer.status, answer.read()) == (200, said)


def test_show_cache_stats_gives_the_same_figures(served: Served) -> None:
    with psycopg.connect(served.dsn, autocommit=True) as conn:
        cur = conn.execute("SHOW CACHE STATS")
        assert [d.name for d in cur.description or []] == ["name", "labels", "value", "kind"]
        rows = cur.fetchall()
    names = {name for name, _, _, _ in rows}
    scraped = {name for name, _ in scrape(served)}
    assert names <= scraped | {n.removesuffix("_total") for n in names}
    assert {"mtcache_accesses_total", "mtcache_sessions", "mtcache_view_rows"} <= names
    kinds = {name: kind for name, _, _, kind in rows}
    assert kinds["mtcache_accesses_total"] == "counter" and kinds["mtcache_sessions"] == "gauge"
    assert all(isinstance(value, float) for _, _, value, _ in rows)


def test_statements_by_route_outcome_and_latency(served: Served) -> None:
    """Each statement counted once by its route (a cached read local, a failed guard's
    fallback, a statement passed through, the cache's own) and outcome, and timed in its
    route's histogram: the counts move by what the statements were."""
    before = scrape(served)

    def moved(route: str, outcome: str = "ok") -> float:
        key = ("mtcache_statements_total", (("outcome", outcome), ("route", route)))
        return after.get(key, 0.0) - before.get(key, 0.0)

    with psycopg.connect(served.dsn, autocommit=True) as conn:
        for _ in range(3):
            conn.execute(BOOKS, [1]).fetchall()  # local (author 1 is cached)
        conn.execute(BOOKS, [7]).fetchall()  # fallback: author 7 is not
        conn.execute("SELECT count(*) FROM books").fetchall()  # remote: no clause
        conn.execute("SHOW CACHED VIEWS").fetchall()  # the cache's own
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")  # remote, failed
    after = scrape(served)
    assert moved("local") >= 3 and moved("fallback") == 1 and moved("cache") == 1
    assert moved("remote") == 1 and moved("remote", "error") == 1
    for route in ("local", "fallback", "remote"):
        count = ("mtcache_statement_seconds_count", (("route", route),))
        under = ("mtcache_statement_seconds_bucket", (("le", "+Inf"), ("route", route)))
        assert after[count] - before.get(count, 0.0) == moved(route) + moved(route, "error")
        assert after[under] == after[count]


def test_hit_path_statements_are_counted_and_timed_each_once(served: Served) -> None:
    """Prepared lookups answered by their lane (the hit path, whose seconds the event loop
    appends and folds every `FOLD`: `StatementStats.fold_hits`) are counted once each as
    local, folded or not, and every path's count is a count (never below zero)."""
    # (at least one fold, and some hits left unfolded: a run the loop could not take whole
    # - split by the network, or arriving while a worker held the session - is answered by
    # the full path, and its statement's next run makes the lane again, so how many take
    # the lane depends on timing; at least one fold's worth do whatever the machine's load)
    lookups = 2 * FOLD + 50
    with psycopg.connect(served.dsn, autocommit=True) as conn:
        for n in range(5):  # (the plan, the decision and the lookup index made)
            conn.execute(NUMBER, [n], prepare=True).fetchall()
        memo = served.engine.memo
        assert memo is not None and memo.lookups is not None
        memo.lookups.wait()
        quiet(served)
        before = scrape(served)
        for n in range(lookups):
            conn.execute(NUMBER, [n], prepare=True).fetchall()
    after = scrape(served)

    def moved(name: str, *labels: tuple[str, str]) -> float:
        key = (name, tuple(sorted(labels)))
        return after.get(key, 0.0) - before.get(key, 0.0)

    route = ("route", "local")
    assert moved("mtcache_statements_total", route, ("outcome", "ok")) == lookups
    assert moved("mtcache_statement_seconds_count", route) == lookups
    assert moved("mtcache_statement_seconds_bucket", route, ("le", "+Inf")) == lookups
    assert moved("mtcache_server_statements_total", ("path", "lane")) >= FOLD
    paths = [
        value for (name, _), value in after.items() if name == "mtcache_server_statements_total"
    ]
    assert len(paths) == 4 and min(paths) >= 0
