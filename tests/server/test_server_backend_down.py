"""`mtcache serve` started while the backend is down (issue 53): it listens, answers what its
guards allow from the cache file, fails what needs the backend with SQLSTATE 08006, says
so on /readyz (503) and in its log, and becomes ready once the backend starts; it logs an
outage after that and the recovery."""

from __future__ import annotations

import re
import subprocess
import typing as t
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from cache.store.served import served_at
from cache.tools import bookstore
from tests.answers import typed
from tests.serving import Serving, serve_process

AUTHOR = "SELECT a.authorid, a.name FROM authors a WHERE a.authorid = {}"
BOUND = " CURRENCY BOUND 10 MIN"
WAIT = 60.0  # seconds a state change may take to show, at most (the probe runs every second)


def ready(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]


def serve(mtcache_bin: str, dsn: str, path: Path, env: dict[str, str]) -> t.ContextManager[Serving]:
    """`mtcache serve` on free loopback ports."""
    argv = [mtcache_bin, "--backend", dsn, "--cache", str(path), "serve"]
    return serve_process([*argv, "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"], env)


def test_serve_starts_with_the_backend_down_and_becomes_ready_when_it_starts(
    pg_cluster: EmbeddedPostgres, tmp_path: Path, mtcache_bin: str, clean_env: dict[str, str]
) -> None:
    dsn = pg_cluster.create_database("serve_backend_down")
    bookstore.load_into(dsn)
    path = tmp_path / "cache.duckdb"
    with cache.connect(dsn, path, background=False) as conn:
        conn.admin.apply_ddl(bookstore.CACHE_SCHEMA_FILE.read_text())
        conn.admin.admit("authorlist_pct", [4])  # author 4 is cached, 5 is not
    with psycopg.connect(dsn) as pg:
        expected = pg.execute(AUTHOR.format(4))
        rows = typed(expected.fetchall())
        description = [(d.name, d.type_code) for d in expected.description or []]
        remote_rows = typed(pg.execute(AUTHOR.format(5)).fetchall())
    pg_cluster.stop()
    try:
        # a new cache file cannot start without the backend (its catalog): one line, exit 1
        fresh = subprocess.run(
            [mtcache_bin, "--backend", dsn, "--cache", str(tmp_path / "new.duckdb"), "serve"],
            env=clean_env,
            text=True,
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert fresh.returncode == 1 and fresh.stderr.count("\n") == 1, fresh.stderr
        assert "connect once while the backend is up" in fresh.stderr
        with serve(mtcache_bin, dsn, path, clean_env) as started:
            log, url = started.log, started.metrics
            assert served_at(path) is not None  # (published: the CLI finds it)
            assert "the backend is unreachable" in log.wait_for("at start: answering locally")
            assert ready(url) == 503
            assert metric(url, "mtcache_backend_up") == 0
            port = served_at(path).port  # type: ignore[union-attr]
            client = f"host=127.0.0.1 port={port} user=postgres dbname=serve_backend_down"
            with psycopg.connect(client, autocommit=True) as through:
                cur = through.execute(AUTHOR.format(4) + BOUND)  # from the cache file
                assert typed(cur.fetchall()) == rows  # values and Python types
                assert [(d.name, d.type_code) for d in cur.description or []] == description
                with pytest.raises(psycopg.OperationalError) as refused:
                    through.execute(AUTHOR.format(5) + BOUND)  # needs the backend
                assert refused.value.sqlstate == "08006"
                assert "cannot reach the PostgreSQL backend" in str(refused.value)
            # a session whose startup parameters need the backend at once: refused, never
            # told the defaults kept for the server's own settings
            with pytest.raises(psycopg.OperationalError) as refused:
                psycopg.connect(client, options="-c DateStyle=German").close()
            # (psycopg keeps no SQLSTATE of a refused login; the server sends 08006)
            assert "FATAL:  the backend is unreachable" in str(refused.value)
            assert "need its backend connection at once" in str(refused.value)
            pg_cluster.ensure_running()
            assert "after" in log.wait_for("the backend is reachable again")
            assert ready(url) == 200 and metric(url, "mtcache_backend_up") == 1
            with psycopg.connect(client, autocommit=True) as through:
                cur = through.execute(AUTHOR.format(5) + BOUND)
                assert typed(cur.fetchall()) == remote_rows
            # an outage after that: logged, the server stays ready (it answers locally)
            pg_cluster.stop()
            line = log.wait_for(r"unreachable \(.*\): answering locally")
            assert "Connection refused" in line or "connection failed" in line, line
            assert ready(url) == 200
            with psycopg.connect(client, autocommit=True) as through:
                cur = through.execute(AUTHOR.format(4) + BOUND)
                assert typed(cur.fetchall()) == rows
            pg_cluster.ensure_running()
            log.wait_for("the backend is reachable again")
    finally:
        pg_cluster.ensure_running()
