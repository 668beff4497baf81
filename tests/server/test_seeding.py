"""A cache server added from a peer (`mtcache clone --from`, `mtcache serve --seed-from`): the
new file is the peer's consistent copy, its regions stamped as the peer's, answering locally
what the peer answers locally, then catching up from a change stream of its own; the backend
sends it no view's rows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import typing as t
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from cache.maintenance.stream import Consumer
from cache.tools import bookstore
from experiments.bench_cluster import copy_rows, reset_statements
from tests.answers import assert_same_answer, typed
from tests.schemas import AUTHORS_AND_BOOKS
from tests.serving import Served, serve_process, server_of
from tests.tools.test_json_documents import validate
from tests.writers import committing

REVIEWERS = "CREATE CACHED VIEW reviewercopy AS SELECT * FROM reviewers REFRESH CONTINUOUSLY"
AUTHORS = (1, 2, 3)


@pytest.fixture
def backend(pg_cluster: EmbeddedPostgres, request: pytest.FixtureRequest) -> str:
    dsn = pg_cluster.create_database("seed_" + request.node.name[:40])
    bookstore.load_into(dsn)
    return dsn


@pytest.fixture
def peer(backend: str, tmp_path: Path) -> Iterator[Served]:
    """A server whose cache holds three authors' regions (pulled) and every reviewer (kept
    from the stream)."""
    with server_of(backend, tmp_path / "peer.duckdb") as served:
        with psycopg.connect(served.dsn, autocommit=True) as conn:
            for statement in (AUTHORS_AND_BOOKS, REVIEWERS):
                conn.execute(statement)
            conn.execute(
                f"INSERT INTO authorlist_pct VALUES {', '.join(f'({a})' for a in AUTHORS)}"
            )
            conn.execute("REFRESH CACHED VIEW reviewercopy")
        yield served


def writing_reviewers(backend: str) -> t.ContextManager[None]:
    """New reviewers inserted, one transaction each, until the block ends."""
    insert = "INSERT INTO reviewers VALUES (%s, 'new', 'F', 'Madison')"
    return committing(backend, insert, range(1001, 6001))


def regions(conn: t.Any) -> list[tuple[t.Any, ...]]:
    """Every region of every view with its stamps (not its age)."""
    document = conn.admin.status()
    return sorted(
        (v["name"], r["key"], r["rows"], r["snapshot_id"], r["refreshed_at"])
        for v in document["views"]
        for r in v["regions"]
    )


def clone_command(
    mtcache_bin: str, backend: str, target: Path, source: str, *options: str
) -> subprocess.CompletedProcess[str]:
    """``mtcache clone --from source`` into ``target``."""
    argv = ["--backend", backend, "--cache", str(target), "clone", "--from", source, *options]
    return subprocess.run(
        [mtcache_bin, *argv], capture_output=True, text=True, timeout=300, check=False
    )


def clone_cli(mtcache_bin: str, backend: str, target: Path, peer: Served) -> dict[str, t.Any]:
    done = clone_command(mtcache_bin, backend, target, f"{peer.host}:{peer.port}", "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    validate(document, "clone")
    return t.cast(dict[str, t.Any], document)


QUERIES = [
    "SELECT * FROM authors WHERE authorid = 2",
    "SELECT b.title, a.name FROM books b JOIN authors a ON a.authorid = b.authorid "
    "WHERE a.authorid = 3 ORDER BY b.title",
]
BOUND = " CURRENCY BOUND 1 HOUR"


def test_a_seeded_cache_answers_locally_without_rows_from_the_backend(
    backend: str, peer: Served, tmp_path: Path, mtcache_bin: str
) -> None:
    target = tmp_path / "new" / "cache.duckdb"
    reset_statements(backend)
    with writing_reviewers(backend):  # (transactions before, around and after the copy)
        seeded = clone_cli(mtcache_bin, backend, target, peer)
    assert seeded["views"] == 3 and seeded["bytes"] > 0 and seeded["stream_position"]
    with cache.connect(backend, target, background=False, admit_on_miss=False) as clone:
        with cache.connect(backend, peer.engine.cache_path, background=False) as theirs:
            # the pulled regions' stamps are the peer's (the stream has moved the peer's
            # reviewers on since the copy, as it moves the new server's from the copy on)
            pulled = [r for r in regions(theirs) if r[0] != "reviewercopy"]
            assert [r for r in regions(clone) if r[0] != "reviewercopy"] == pulled
        for query in QUERIES:
            assert assert_same_answer(clone, backend, query + BOUND, query).route == "local"
        # a key the peer never held is not local here either: its guard fails
        missed = "SELECT * FROM authors WHERE authorid = 9"
        assert assert_same_answer(clone, backend, missed + BOUND, missed).route == "remote"
        # a stream of its own: every change committed after the copy reaches it, once (the
        # copy is behind the backend now, by the writer's inserts: within its bound)
        with psycopg.connect(backend, autocommit=True) as pg:
            pg.execute("UPDATE reviewers SET name = 'seeded' WHERE reviewerid = 1")
        with Consumer(clone.engine.store.for_thread(), backend) as consumer:
            consumer.catch_up()
        changed = "SELECT * FROM reviewers WHERE name = 'seeded'"
        answer = assert_same_answer(clone, backend, changed + BOUND, changed)
        assert answer.route == "local" and len(answer.rows) == 1
        every = "SELECT * FROM reviewers ORDER BY reviewerid"
        assert assert_same_answer(clone, backend, every + BOUND, every).route == "local"
    assert copy_rows(backend) == 0, "the backend sent view rows to the seeded cache"
    with cache.connect(backend, target, background=False) as clone:  # (what a pull counts)
        clone.admin.refresh("authorcopy")
    assert copy_rows(backend) > 0


def test_serve_seeds_a_missing_file_and_serves_an_existing_one_as_it_is(
    backend: str, peer: Served, tmp_path: Path, mtcache_bin: str
) -> None:
    target = tmp_path / "new.duckdb"
    argv = [
        mtcache_bin,
        "--backend",
        backend,
        "--cache",
        str(target),
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--seed-from",
        f"{peer.host}:{peer.port}",
    ]
    reset_statements(backend)
    for seeded in (True, False):
        with serve_process(argv, dict(os.environ)) as served:
            assert any("seeded" in line for line in served.log.lines) == seeded
            dsn = f"host=127.0.0.1 port={served.port} user=postgres dbname={peer.dbname}"
            with psycopg.connect(dsn, autocommit=True) as conn:
                query = "SELECT * FROM authors WHERE authorid = 3"
                cur = conn.execute(query + BOUND)
                got = typed(cur.fetchall())
                route = conn.execute("EXPLAIN LAST STATEMENT").fetchall()
                with psycopg.connect(backend) as pg:
                    assert got == typed(pg.execute(query).fetchall())
            assert route and all(r[1] == "local" for r in route), route
    assert copy_rows(backend) == 0


def test_a_seed_is_refused_clearly_and_leaves_nothing(
    backend: str, peer: Served, tmp_path: Path, mtcache_bin: str
) -> None:
    target = tmp_path / "new.duckdb"
    slots = "SELECT (SELECT count(*) FROM pg_replication_slots), count(*) FROM pg_publication"
    with psycopg.connect(backend, autocommit=True) as pg:
        before = pg.execute(slots).fetchone()
        pg.execute("CREATE ROLE seeder LOGIN")
    peer_at = f"{peer.host}:{peer.port}"
    cases = [
        # another role than the cache's own: the copy holds every cached row
        (f"host={peer.host} port={peer.port} user=seeder dbname={peer.dbname}", "42501|own role"),
        ("127.0.0.1:1", "cannot reach the cache server at 127.0.0.1:1"),
    ]
    for source, message in cases:
        done = clone_command(mtcache_bin, backend, target, source)
        assert done.returncode == 1, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and re.search(message, lines[0]), done.stderr
        assert not list(tmp_path.glob("new.duckdb*"))
    target.write_bytes(b"")  # an existing file is never overwritten
    done = clone_command(mtcache_bin, backend, target, peer_at)
    assert done.returncode == 1 and "exists" in done.stderr, done.stderr
    assert target.read_bytes() == b""
    with psycopg.connect(backend, autocommit=True) as pg:
        assert pg.execute(slots).fetchone() == before  # no slot or publication left behind
