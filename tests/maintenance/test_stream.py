"""Continuous maintenance from the WAL: REFRESH CONTINUOUSLY views follow the backend's
transactions through the replication slot (cache.maintenance.stream), on a real slot."""

from __future__ import annotations

import contextlib
import time
import typing as t
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.pgoutput.messages import lsn_text, lsn_value
from cache.backend.reflect import fetch_catalog
from cache.backend.replication import drop_slot, slot_state
from cache.backend.requirements import stream_requirements
from cache.maintenance import stream
from cache.maintenance.pipeline import Maintainer
from cache.store.cache_file import CacheStore
from cache.tools import bookstore
from experiments.workers import Workers
from sql_ext import parse
from sql_ext.errors import NotSupportedError, OperationalError
from tests.maintenance.test_maintenance import local, pg
from tests.roles import login_role

Setup = tuple[CacheStore, str, stream.Consumer]

SCHEMA = """
CREATE CONTROL TABLE authorlist_pct (authorid INTEGER);
CREATE CONTROL TABLE citylist_cpct (city TEXT);
CREATE CACHED VIEW authorcopy AS SELECT * FROM authors
    PRESENCE ON (authorid) IN authorlist_pct
    COMPLETENESS ON (city) IN citylist_cpct
    REFRESH CONTINUOUSLY;
CREATE CACHED VIEW bookcopy AS SELECT isbn, authorid, title, price FROM books
    PRESENCE ON (authorid) IN authorcopy CONSISTENCY ROOT;
CREATE CACHED VIEW salescopy AS SELECT * FROM sales REFRESH CONTINUOUSLY;
"""


@pytest.fixture
def setup(pg_cluster: EmbeddedPostgres, tmp_path: Path) -> Iterator[Setup]:
    dsn = pg_cluster.create_database("stream")
    bookstore.load_into(dsn)
    store = CacheStore(tmp_path / "cache.duckdb")
    stream.apply_ddl(store, dsn, parse(SCHEMA), fetch_catalog(dsn))
    with stream.Consumer(store, dsn) as consumer:
        yield store, dsn, consumer
    # the last continuous view dropped takes the slot with it (a slot left holds WAL)
    drops = "DROP CACHED VIEW bookcopy; DROP CACHED VIEW authorcopy; DROP CACHED VIEW salescopy"
    with CacheStore(store.path) as again:  # a test may have handed the file to a connection
        stream.apply_ddl(again, dsn, parse(drops), fetch_catalog(dsn))
    store.close()


def mirrors_backend(store: CacheStore, dsn: str) -> None:
    """Each continuous view holds exactly the backend's rows of its present regions, typed as
    psycopg returns them."""
    listed = [r[0] for r in local(store, "SELECT authorid FROM authorlist_pct")]
    cities = [r[0] for r in local(store, "SELECT city FROM citylist_cpct")]
    authors = pg(
        dsn,
        "SELECT * FROM authors WHERE authorid = ANY(%s) OR city = ANY(%s) ORDER BY authorid",
        (listed, cities),
    )
    assert local(store, "SELECT * FROM authorcopy ORDER BY authorid") == authors
    ids = [a[0] for a in authors]
    books = pg(
        dsn,
        "SELECT isbn, authorid, title, price FROM books WHERE authorid = ANY(%s) ORDER BY isbn",
        (ids,),
    )
    cached = local(store, "SELECT * FROM bookcopy ORDER BY isbn")
    assert cached == books
    assert [tuple(map(type, r)) for r in cached] == [tuple(map(type, r)) for r in books]
    assert local(store, "SELECT * FROM salescopy ORDER BY saleid") == pg(
        dsn, "SELECT * FROM sales ORDER BY saleid"
    )


def test_ddl_makes_and_drops_the_slot(setup: Setup) -> None:
    store, dsn, _ = setup
    row = stream.load_stream(store.con)
    assert row is not None and row.slot.startswith("mtcache_")
    assert set(row.relations) == {"public.authors", "public.books", "public.sales"}
    assert pg(
        dsn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (row.slot,)
    ) == [(1,)]
    stream.apply_ddl(store, dsn, parse("DROP CACHED VIEW salescopy"), fetch_catalog(dsn))
    # still continuous views left: the slot stays, the publication loses sales
    tables = pg(
        dsn,
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1",
        (row.publication,),
    )
    assert tables == [("authors",), ("books",), ("mtcache_heartbeat",)]
    stream.apply_ddl(
        store,
        dsn,
        parse("CREATE CACHED VIEW salescopy AS SELECT * FROM sales REFRESH CONTINUOUSLY"),
        fetch_catalog(dsn),
    )


def test_a_table_without_a_primary_key_is_refused(setup: Setup) -> None:
    store, dsn, _ = setup
    pg(dsn, "CREATE TABLE IF NOT EXISTS tags (tag text NOT NULL UNIQUE, note text)")
    before = local(store, "SELECT name FROM mtcache.objects ORDER BY name")
    with pytest.raises(NotSupportedError, match="needs a primary key on tags"):
        stream.apply_ddl(
            store,
            dsn,
            parse("CREATE CACHED VIEW tagcopy AS SELECT * FROM tags REFRESH CONTINUOUSLY"),
            fetch_catalog(dsn),
        )
    assert local(store, "SELECT name FROM mtcache.objects ORDER BY name") == before
    # the same view refreshed by pulls is fine
    stream.apply_ddl(
        store, dsn, parse("CREATE CACHED VIEW tagcopy AS SELECT * FROM tags"), fetch_catalog(dsn)
    )
    stream.apply_ddl(store, dsn, parse("DROP CACHED VIEW tagcopy"), fetch_catalog(dsn))


def test_a_backend_that_cannot_stream_is_refused_before_anything_is_made(
    pg_cluster: EmbeddedPostgres, tmp_path: Path
) -> None:
    """A role that may not replicate (as a backend at wal_level=replica, `stream_unmet`): the
    DDL is refused with what to change, and the backend keeps no heartbeat table, publication
    or slot of it, the cache file no view."""
    owner = pg_cluster.create_database("stream_refused")
    bookstore.load_into(owner)
    dsn = login_role(owner, "no_replication", "NOREPLICATION")
    pg(owner, "GRANT SELECT ON ALL TABLES IN SCHEMA public TO no_replication")
    pg(owner, "GRANT CREATE ON SCHEMA public TO no_replication")
    store = CacheStore(tmp_path / "cache.duckdb")
    try:
        with pytest.raises(OperationalError, match=r"nothing was changed: the role may not"):
            stream.apply_ddl(
                store,
                dsn,
                parse("CREATE CACHED VIEW salescopy AS SELECT * FROM sales REFRESH CONTINUOUSLY"),
                fetch_catalog(dsn),
            )
        assert pg(owner, "SELECT to_regclass('mtcache_heartbeat')") == [(None,)]
        assert pg(owner, "SELECT count(*) FROM pg_publication") == [(0,)]
        assert local(store, "SELECT name FROM mtcache.objects") == []
    finally:
        store.close()


def test_what_a_backend_lacks_for_the_stream_is_named_with_its_change() -> None:
    assert all(r.met for r in stream_requirements("logical", True, 3))
    wal, role, slots = (r.change for r in stream_requirements("replica", False, 0) if not r.met)
    assert "wal_level is replica" in wal and "wal_level = logical" in wal
    assert "ALTER ROLE ... REPLICATION" in role and "max_replication_slots" in slots


def test_changes_reach_the_views_through_the_stream(setup: Setup) -> None:
    store, dsn, consumer = setup
    maintainer = Maintainer(store, dsn)
    maintainer.admit("authorlist_pct", [(1,), (2,)])
    city = pg(dsn, "SELECT city FROM authors WHERE authorid = 5")[0][0]
    maintainer.admit("citylist_cpct", [(city,)])
    maintainer.refresh("salescopy")
    consumer.catch_up()
    mirrors_backend(store, dsn)

    two = pg(dsn, "SELECT isbn FROM books WHERE authorid = 2 ORDER BY isbn")
    elsewhere = pg(
        dsn,
        "SELECT isbn FROM books WHERE authorid NOT IN (1, 2) "
        "AND authorid NOT IN (SELECT authorid FROM authors WHERE city = %s) "
        "ORDER BY isbn LIMIT 1",
        (city,),
    )[0][0]
    writes = [
        "UPDATE authors SET name = name || ' Jr.' WHERE authorid = 1",
        "UPDATE books SET title = 'Retitled', price = 12.34 WHERE authorid = 1",
        "INSERT INTO books VALUES ('stream-1', 2, 'Fresh', 1, 'fiction', 7.50)",
        f"UPDATE books SET authorid = 3 WHERE isbn = '{two[0][0]}'",  # leaves the cache
        f"UPDATE books SET authorid = 2 WHERE isbn = '{elsewhere}'",  # moves in whole
        "UPDATE books SET price = price + 1 WHERE authorid = 4",  # not cached: dropped
        f"DELETE FROM sales WHERE isbn = '{two[1][0]}'",
        f"DELETE FROM reviews WHERE isbn = '{two[1][0]}'",
        f"DELETE FROM books WHERE isbn = '{two[1][0]}'",
        "INSERT INTO sales SELECT max(saleid) + 1, 'stream-1', DATE '2026-11-23', 3 FROM sales",
        "UPDATE sales SET qty = qty * 2 WHERE saleid %% 7 = 0",
        # a new author in the complete city (and its book, same transaction): the stream
        # brings the row, admits its presence key and pulls its children
        "BEGIN; INSERT INTO authors VALUES (9001, 'New', 'F', "
        f"'{city}', 'WA'); INSERT INTO books VALUES ('stream-2', 9001, 'First', 1, 'poetry', "
        "9.99); COMMIT",
        # an author moving out of the complete city takes its books out with it
        f"UPDATE authors SET city = 'Nowhere' WHERE city = '{city}' AND authorid <> 9001",
    ]
    for sql in writes:
        pg(dsn, sql)
    applied = consumer.catch_up()
    assert applied >= len(writes) - 1  # reviews is not published
    assert consumer.upqueries == 1
    mirrors_backend(store, dsn)
    assert local(store, "SELECT count(*) FROM authorlist_pct WHERE authorid = 9001") == [(1,)]

    # every continuously maintained region shares the batch's snapshot, which names the
    # stream position
    ids = local(
        store,
        "SELECT DISTINCT snapshot_id FROM authorlist_pct UNION "
        "SELECT DISTINCT snapshot_id FROM citylist_cpct UNION "
        "SELECT snapshot_id FROM mtcache.view_state WHERE view = 'salescopy'",
    )
    assert len(ids) == 1
    engine, named = local(
        store, f"SELECT engine, pg_snapshot FROM mtcache.snapshots WHERE snapshot_id = {ids[0][0]}"
    )[0]
    row = stream.load_stream(store.con)
    assert row is not None
    assert engine == "stream" and named == f"lsn {lsn_text(row.applied_lsn)}"
    consumer.step()  # nothing new: confirms to the backend what the file holds
    assert slot_state(consumer.connection(), row.slot).confirmed_lsn == row.applied_lsn


def test_truncate_then_insert_in_one_transaction(setup: Setup) -> None:
    """TRUNCATE and the rows inserted after it in the same transaction arrive in order."""
    store, dsn, consumer = setup
    Maintainer(store, dsn).refresh("salescopy")
    consumer.catch_up()
    pg(
        dsn,
        "BEGIN; CREATE TEMP TABLE keep AS SELECT * FROM sales WHERE saleid <= 3; "
        "TRUNCATE sales; INSERT INTO sales SELECT * FROM keep; COMMIT",
    )
    consumer.catch_up()
    assert local(store, "SELECT count(*) FROM salescopy") == [(3,)]
    mirrors_backend(store, dsn)


def test_toasted_values_an_update_did_not_send(setup: Setup) -> None:
    """An update that leaves a TOASTed value alone does not send it: the row's value comes
    from the same transaction's earlier change of it, else from the cached copy, else (the
    row moves into a present region) from a pull of it."""
    store, dsn, consumer = setup
    pg(dsn, "CREATE TABLE docs (id int PRIMARY KEY, grp int, body text, note text)")
    big = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 400))"
    pg(dsn, f"INSERT INTO docs SELECT g, g %% 2, {big}, 'n' FROM generate_series(1, 4) g")
    ddl = (
        "CREATE CACHED VIEW doccopy AS SELECT * FROM docs REFRESH CONTINUOUSLY; "
        "CREATE CONTROL TABLE docgrp_pct (grp int); "
        "CREATE CACHED VIEW docsome AS SELECT id, grp, body FROM docs "
        "PRESENCE ON (grp) IN docgrp_pct REFRESH CONTINUOUSLY"
    )
    stream.apply_ddl(store, dsn, parse(ddl), fetch_catalog(dsn))
    try:
        maintainer = Maintainer(store, dsn)
        maintainer.refresh("doccopy")
        maintainer.admit("docgrp_pct", [(1,)])
        consumer.catch_up()
        upqueries = consumer.upqueries
        pg(dsn, "UPDATE docs SET note = 'from the cached copy' WHERE id = 1")
        pg(
            dsn,
            f"BEGIN; INSERT INTO docs VALUES (5, 0, {big}, 'new'); "
            "UPDATE docs SET note = 'from the insert before' WHERE id = 5; "
            "UPDATE docs SET grp = 1 WHERE id = 2; COMMIT",
        )  # (2 moves into docsome)
        consumer.catch_up()
        assert consumer.upqueries == upqueries + 1  # docsome pulled row 2's body
        docs = pg(dsn, "SELECT * FROM docs ORDER BY id")
        assert local(store, "SELECT * FROM doccopy ORDER BY id") == docs
        assert all(len(t.cast(str, r[2])) == 12_800 for r in docs)
        assert local(store, "SELECT * FROM docsome ORDER BY id") == [
            r[:3] for r in docs if r[1] == 1
        ]
    finally:
        stream.apply_ddl(
            store,
            dsn,
            parse(
                "DROP CACHED VIEW docsome; DROP CACHED VIEW doccopy; DROP CONTROL TABLE docgrp_pct"
            ),
            fetch_catalog(dsn),
        )


def test_a_pull_lines_up_with_the_stream(setup: Setup) -> None:
    """Transactions the pull's snapshot already holds are not applied to its regions again;
    the ones after it are."""
    store, dsn, consumer = setup
    maintainer = Maintainer(store, dsn)
    maintainer.refresh("salescopy")
    consumer.catch_up()
    pg(dsn, "UPDATE sales SET qty = 100 WHERE saleid = 1")
    pg(dsn, "UPDATE sales SET qty = 200 WHERE saleid = 1")
    maintainer.admit("authorlist_pct", [(1,)])  # pulls with the stream behind it
    maintainer.refresh("salescopy")  # holds qty = 200; the stream has 100 then 200 to come
    assert local(store, "SELECT qty FROM salescopy WHERE saleid = 1") == [(200,)]
    assert local(store, "SELECT count(*) FROM mtcache.stream_pulls") != [(0,)]
    pg(dsn, "UPDATE sales SET qty = 300 WHERE saleid = 2")
    consumer.catch_up()
    assert local(store, "SELECT qty FROM salescopy WHERE saleid = 1") == [(200,)]
    assert local(store, "SELECT qty FROM salescopy WHERE saleid = 2") == [(300,)]
    assert local(store, "SELECT count(*) FROM mtcache.stream_pulls") == [(0,)]
    mirrors_backend(store, dsn)


def test_ddl_on_a_cached_table_stops_the_stream_with_a_reason(
    setup: Setup,
) -> None:
    store, dsn, consumer = setup
    Maintainer(store, dsn).refresh("salescopy")
    consumer.catch_up()
    pg(dsn, "ALTER TABLE sales ADD COLUMN note text")
    pg(dsn, "UPDATE sales SET qty = 5 WHERE saleid = 1")
    with pytest.raises(OperationalError, match="sales changed at the backend"):
        consumer.catch_up()
    row = stream.load_stream(store.con)
    assert row is not None and row.problem is not None and "recreate" in row.problem
    before = local(store, "SELECT * FROM salescopy ORDER BY saleid")
    assert consumer.step() == 0  # stopped: nothing applied, nothing lost
    assert local(store, "SELECT * FROM salescopy ORDER BY saleid") == before
    # recreated (with the column), the view is maintained again
    stream.apply_ddl(
        store,
        dsn,
        parse(
            "DROP CACHED VIEW salescopy; CREATE CACHED VIEW "
            "salescopy AS SELECT * FROM sales REFRESH CONTINUOUSLY"
        ),
        fetch_catalog(dsn),
    )
    row = stream.load_stream(store.con)
    assert row is not None and row.problem is None
    Maintainer(store, dsn).refresh("salescopy")
    pg(dsn, "UPDATE sales SET qty = 6, note = 'again' WHERE saleid = 1")
    consumer.catch_up()
    assert local(store, "SELECT qty, note FROM salescopy WHERE saleid = 1") == [(6, "again")]


class Writer(Workers):
    """Sequential single-row transactions on sales: write n sets qty = n on sale (n % 5) + 1.
    After each commit it reads the WAL insert position, which brackets the commit: write n's
    commit ends after ``after[n - 1]`` and at or before ``after[n]``."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.after: list[int] = []
        self.initial = dict(pg(dsn, "SELECT saleid, qty FROM sales WHERE saleid <= 5"))
        super().__init__()

    def _run(self, index: int) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            n = 0
            while not self.stopping.is_set():
                n += 1
                conn.execute("UPDATE sales SET qty = %s WHERE saleid = %s", (n, n % 5 + 1))
                row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
                assert row is not None
                self.after.append(lsn_value(row[0]))
                time.sleep(0.005)

    def states_at(self, lsn: int) -> list[dict[int, int]]:
        """The sales states a stream applied up to ``lsn`` may show: after write k where k is
        exact unless a heartbeat's commit fell between a write's commit and its reading."""
        after = list(self.after)
        exact = sum(1 for a in after if a <= lsn)  # writes surely applied
        ambiguous = exact < len(after)  # the next one may be applied too
        return [self.state(k) for k in ([exact, exact + 1] if ambiguous else [exact])]

    def state(self, k: int) -> dict[int, int]:
        state = dict(self.initial)
        for n in range(1, k + 1):
            state[n % 5 + 1] = n
        return state


@pytest.mark.parametrize("beating", ["thread", "mtcache heartbeat"])
def test_bounded_queries_are_answered_locally_under_writes(
    setup: Setup, beating: str, mtcache_bin: str, clean_env: dict[str, str]
) -> None:
    """The owning process runs the consumer, and the heartbeat beats (a thread of it, or
    the `mtcache heartbeat` process): a CURRENCY BOUND 5 SEC query is answered from the cache
    while writes go on, and each local answer is the backend's state at the stream position
    its provenance names."""
    import subprocess

    import cache

    store, dsn, _ = setup
    Maintainer(store, dsn).refresh("salescopy")
    path = store.path
    store.close()
    query = (
        "SELECT s.saleid, s.qty FROM sales s WHERE s.saleid <= 5 ORDER BY s.saleid "
        "CURRENCY BOUND 5 SEC ON (s)"
    )
    local_answers = 0
    answers = 0
    beater = None
    if beating != "thread":
        beater = subprocess.Popen(
            [mtcache_bin, "--backend", dsn, "heartbeat", "--interval", "0.5"],
            env=clean_env,
            stdout=subprocess.DEVNULL,
        )
    with contextlib.ExitStack() as running:
        if beater is not None:
            running.callback(beater.wait, 30)
            running.callback(beater.terminate)
        conn = running.enter_context(
            cache.connect(
                dsn, path, heartbeat=0.5 if beating == "thread" else None, autocommit=True
            )
        )
        writer = running.enter_context(Writer(dsn))
        time.sleep(1.0)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            cur = conn.execute(query)
            rows = cur.fetchall()
            answers += 1
            access = cur.provenance[0]
            if access["route"] != "local":
                continue
            local_answers += 1
            assert access["currency_seconds"] <= 5
            [snapshot] = access["snapshot_ids"]
            # the snapshot the provenance names, as the cache file records it
            [(named,)] = local(
                conn.engine.store,
                f"SELECT pg_snapshot FROM mtcache.snapshots WHERE snapshot_id = {snapshot}",
            )
            assert named.startswith("lsn ")
            position = lsn_value(named[4:])
            assert dict(rows) in writer.states_at(position), (snapshot, named)
            time.sleep(0.05)
    assert len(writer.after) > 100, "the writer wrote"
    assert local_answers >= 0.8 * answers, (local_answers, answers)


OWNER = """
import sys, time
import cache
conn = cache.connect(sys.argv[1], sys.argv[2], autocommit=True)
time.sleep(float(sys.argv[3]))
conn.close()
"""


class Churn(Workers):
    """Concurrent writers on the continuously maintained tables: books of cached and
    uncached authors updated, moved between authors, inserted and deleted; sales updated."""

    def __init__(self, dsn: str, threads: int = 2) -> None:
        self.dsn = dsn
        self.count = 0
        super().__init__(threads)

    def _run(self, seed: int) -> None:
        import random

        rng = random.Random(seed)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            n = 0
            while not self.stopping.is_set():
                n += 1
                author = rng.randint(1, 6)
                isbn = f"churn-{seed}-{n}"
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO books VALUES (%s, %s, 'Churned', 1, 'x', %s)",
                        (isbn, author, rng.randint(1, 9999) / 100),
                    )
                    conn.execute(
                        "UPDATE books SET price = price + 0.01, authorid = %s "
                        "WHERE isbn = (SELECT isbn FROM books WHERE isbn LIKE "
                        "'churn-%%' ORDER BY random() LIMIT 1)",
                        (rng.randint(1, 6),),
                    )
                    conn.execute(
                        "UPDATE sales SET qty = qty + 1 WHERE saleid = %s", (rng.randint(1, 20),)
                    )
                if n % 3 == 0:
                    conn.execute(
                        "DELETE FROM books WHERE isbn = (SELECT isbn FROM books WHERE "
                        "isbn LIKE 'churn-%%' ORDER BY random() LIMIT 1)"
                    )
                self.count += 1
                time.sleep(0.002)


@pytest.mark.parametrize("point", ["stream_apply", "stream_advance"])
def test_sigkill_while_applying_loses_nothing(setup: Setup, point: str, tmp_path: Path) -> None:
    """The owning process killed (SIGKILL) in the middle of applying a batch, or after its
    commit before the slot is advanced, with writers going on: reopened, the views equal the
    backend's rows."""
    import os
    import subprocess
    import sys

    store, dsn, consumer = setup
    maintainer = Maintainer(store, dsn)
    maintainer.admit("authorlist_pct", [(1,), (2,), (3,)])
    maintainer.refresh("salescopy")
    consumer.close()
    path = store.path
    store.close()
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    env = {**os.environ, "MTCACHE_FAULTS": f"{point}:kill"}
    with Churn(dsn) as churn:
        time.sleep(0.5)
        run = [sys.executable, str(script), dsn, str(path)]
        owner = subprocess.run(
            [*run, "30"], env=env, timeout=120, capture_output=True, text=True, check=False
        )
        assert owner.returncode == -9, owner.stderr  # killed at the fault point
        time.sleep(0.5)
        # reopened (without the fault) while the writers go on
        owner = subprocess.run(
            [*run, "2"], timeout=120, capture_output=True, text=True, check=False
        )
        assert owner.returncode == 0, owner.stderr
    assert churn.count > 50
    with CacheStore(path) as reopened, stream.Consumer(reopened, dsn) as catching_up:
        catching_up.catch_up()
        mirrors_backend(reopened, dsn)


def _wait_for(condition: t.Callable[[], bool], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_the_consumer_rides_out_an_outage_and_a_dropped_slot(
    setup: Setup, pg_cluster: EmbeddedPostgres
) -> None:
    """The consumer thread keeps going across a backend restart, and makes the slot again
    (pulling the views anew) when it was dropped at the backend."""
    store, dsn, _ = setup
    Maintainer(store, dsn).refresh("salescopy")
    qty = "SELECT qty FROM salescopy WHERE saleid = 1"
    runner = stream.Consumer(store.for_thread(), dsn, poll=0.05)
    runner.start()
    try:
        pg(dsn, "UPDATE sales SET qty = 41 WHERE saleid = 1")
        _wait_for(lambda: local(store, qty) == [(41,)])
        pg_cluster.stop()
        time.sleep(2.5)  # the consumer fails, says so once, and retries
        pg_cluster.ensure_running()
        pg(dsn, "UPDATE sales SET qty = 42 WHERE saleid = 1")
        _wait_for(lambda: local(store, qty) == [(42,)])

        row = stream.load_stream(store.con)
        assert row is not None
        drop_slot(dsn, row.slot)  # as an administrator would: its session ended first
        pg(dsn, "UPDATE sales SET qty = 43 WHERE saleid = 1")  # the stream never carries it
        _wait_for(lambda: local(store, qty) == [(43,)])  # the views were pulled anew
        pg(dsn, "UPDATE sales SET qty = 44 WHERE saleid = 1")  # the new slot carries it
        _wait_for(lambda: local(store, qty) == [(44,)])
    finally:
        runner.stop()
        runner.store.close()
    assert pg(
        dsn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (row.slot,)
    ) == [(1,)]


def test_ddl_while_the_owning_process_streams(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    """The consumer thread's streaming session holds the slot: the cache DDL ends it before
    it changes the publication or drops the slot, and the thread goes on from the file's
    position with the relations as they are now, without a warning."""
    import logging

    store, dsn, _ = setup
    Maintainer(store, dsn).refresh("salescopy")
    qty = "SELECT qty FROM salescopy WHERE saleid = 1"
    runner = stream.Consumer(store.for_thread(), dsn, poll=0.05)
    caplog.set_level(logging.WARNING, logger="mtcache.stream")
    runner.start()
    try:
        pg(dsn, "UPDATE sales SET qty = 51 WHERE saleid = 1")
        _wait_for(lambda: local(store, qty) == [(51,)])  # streaming
        stream.apply_ddl(
            store,
            dsn,
            parse(
                "DROP CACHED VIEW salescopy; CREATE CACHED VIEW "
                "salescopy AS SELECT * FROM sales REFRESH "
                "CONTINUOUSLY"
            ),
            fetch_catalog(dsn),
        )
        Maintainer(store, dsn).refresh("salescopy")
        pg(dsn, "UPDATE sales SET qty = 52 WHERE saleid = 1")
        _wait_for(lambda: local(store, qty) == [(52,)])
        row = stream.load_stream(store.con)
        assert row is not None
        # the last continuous views dropped while the thread streams: the slot goes too
        stream.apply_ddl(
            store,
            dsn,
            parse(
                "DROP CACHED VIEW bookcopy; DROP CACHED VIEW authorcopy; DROP CACHED VIEW salescopy"
            ),
            fetch_catalog(dsn),
        )
        assert pg(
            dsn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (row.slot,)
        ) == [(0,)]
        time.sleep(0.5)  # the thread, idle: no stream to apply
    finally:
        runner.stop()
        runner.store.close()
    assert [r.getMessage() for r in caplog.records] == []
    views = SCHEMA.split(";", 2)[2]  # the three views again, for the fixture to drop
    stream.apply_ddl(store, dsn, parse(views), fetch_catalog(dsn))


def test_status_shows_the_stream_and_its_lag(
    setup: Setup, mtcache_bin: str, clean_env: dict[str, str]
) -> None:
    import subprocess

    store, dsn, consumer = setup
    Maintainer(store, dsn).refresh("salescopy")
    consumer.catch_up()
    tight = stream.Consumer(store.for_thread(), dsn, lag_limit=1)
    tight.start()  # an owning process with a 1-byte lag limit ran here
    tight.stop()
    tight.store.close()
    pg(dsn, "UPDATE sales SET qty = qty + 1")  # not applied: the slot holds it
    document = stream.stream_status(store, lambda: dsn)
    assert document is not None
    assert document["slot_exists"] and document["lag_bytes"] > 1 and document["over_limit"]
    assert document["problem"] is None and document["lag_limit_bytes"] == 1
    path = store.path
    consumer.close()
    store.close()
    shown = subprocess.run(
        [mtcache_bin, "--backend", dsn, "--cache", str(path), "status"],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "salescopy (sales, white, view-level, refreshed continuously)" in shown.stdout
    assert "continuously from the WAL" in shown.stdout
    line = next(x for x in shown.stdout.splitlines() if x.strip().startswith("stream:"))
    assert "bytes of WAL behind - OVER THE LAG LIMIT" in line
