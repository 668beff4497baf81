"""The embedded PostgreSQL module: the same one the session fixture and `mtcache` use."""

from __future__ import annotations

import os
import shutil

import psycopg
import pytest

from cache.backend.embedded_pg import EmbeddedPostgres, ServerSettings, find_pg_bin
from sql_ext.errors import EmbeddedBackendError
from tests.conftest import reachable_tempdir


def test_session_cluster_is_loopback_only_with_logical_wal(pg_cluster: EmbeddedPostgres) -> None:
    with psycopg.connect(pg_cluster.dsn("postgres")) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('listen_addresses', 'wal_level', 'unix_socket_directories')"
            ).fetchall()
        )
    assert settings == {
        "listen_addresses": "127.0.0.1",
        "wal_level": "logical",
        "unix_socket_directories": "",
    }


def test_ensure_running_reuses_a_running_cluster(pg_cluster: EmbeddedPostgres) -> None:
    port = pg_cluster.running_port()
    assert port is not None
    assert pg_cluster.ensure_running() == pg_cluster.dsn()
    assert pg_cluster.running_port() == port


def test_create_database_gives_an_empty_database(pg_cluster: EmbeddedPostgres) -> None:
    dsn = pg_cluster.create_database("scratch_db")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE leftover (x int)")
    dsn = pg_cluster.create_database("scratch_db")
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT to_regclass('leftover')").fetchone()
    assert row == (None,)


@pytest.mark.backend
def test_stop_and_restart_keep_the_data_and_port() -> None:
    home = reachable_tempdir("mtcache-pg-restart-")
    cluster = EmbeddedPostgres(home / "pg", settings=ServerSettings(durable=False))
    try:
        dsn = cluster.ensure_running()
        port = cluster.running_port()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (x int)")
            conn.execute("INSERT INTO kept VALUES (42)")
        assert cluster.stop() is True
        assert cluster.running_port() is None
        assert cluster.stop() is False
        with pytest.raises(EmbeddedBackendError, match="is not running"):
            cluster.dsn()
        dsn = cluster.ensure_running()
        assert cluster.running_port() == port
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT x FROM kept").fetchall() == [(42,)]
    finally:
        cluster.destroy()
        shutil.rmtree(home, ignore_errors=True)


def test_missing_binaries_say_how_to_install(tmp_path: pytest.TempPathFactory) -> None:
    empty = reachable_tempdir("mtcache-nobin-")
    try:
        cluster = EmbeddedPostgres(empty / "pg", bin_dir=empty)
        with pytest.raises(EmbeddedBackendError) as info:
            cluster.ensure_running()
        assert "apt-get install postgresql" in str(info.value)
        assert "--backend" in str(info.value)
    finally:
        shutil.rmtree(empty, ignore_errors=True)


def test_binary_search_reports_where_it_looked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(EmbeddedBackendError) as info:
        find_pg_bin(search_dirs=("/nonexistent/postgresql",))
    assert "/nonexistent/postgresql/*/bin" in str(info.value)
    assert "apt-get install postgresql" in str(info.value)


@pytest.mark.backend
def test_the_machine_has_binaries_found_by_the_default_search() -> None:
    directory = find_pg_bin()
    assert (directory / "initdb").is_file() and (directory / "pg_ctl").is_file()


@pytest.mark.backend
def test_unreachable_directory_is_reported_when_running_as_root() -> None:
    """As root the server runs as `postgres`, which cannot enter a mode-700 root directory."""
    home = reachable_tempdir("mtcache-private-")
    private = home / "private"
    private.mkdir(mode=0o700)
    cluster = EmbeddedPostgres(private / "pg", settings=ServerSettings(durable=False))
    try:
        if os.geteuid() == 0:
            with pytest.raises(EmbeddedBackendError, match="postgres OS user cannot reach"):
                cluster.ensure_running()
        else:
            # Not root: the server runs as this user, who owns the directory.
            assert cluster.ensure_running().startswith("postgresql://")
    finally:
        cluster.destroy()
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.backend
@pytest.mark.parametrize("cache_file_first", [False, True], ids=["cluster-first", "file-first"])
def test_a_fresh_checkout_gets_its_cluster_beside_the_cache_file(cache_file_first: bool) -> None:
    """`make demo` in a fresh clone: mtcache creates `.mtcache` and the cluster in it, with the
    cache file there before the cluster or not (`make test` then `make demo`). Run as root,
    the server (as postgres) must pass through the `.mtcache` mtcache made."""
    from cache.store.cache_file import CacheStore

    home = reachable_tempdir("mtcache-fresh-")
    cache_dir = home / "checkout" / ".mtcache"
    if cache_file_first:
        CacheStore(cache_dir / "cache.duckdb").close()
    cluster = EmbeddedPostgres(cache_dir / "pg", settings=ServerSettings(durable=False))
    try:
        with psycopg.connect(cluster.ensure_running()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        cluster.destroy()
        shutil.rmtree(home, ignore_errors=True)
