"""Session fixtures: one private PostgreSQL cluster per test run, a fresh database per module.

The cluster comes from the same module as the embedded default (cache.backend.embedded_pg). If it
cannot start, every test that needs it errors: nothing is skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cache.backend.embedded_pg import EmbeddedPostgres, ServerSettings
from cache.backend.pool import close_all
from cache.backend.reflect import fetch_catalog
from cache.tools import bookstore
from sql_ext.catalog import Catalog


def reachable_tempdir(prefix: str) -> Path:
    """A temp dir the postgres OS user can enter (pytest's own tmp dirs are mode 700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


def cli_home(env: dict[str, str], dsn: str, prefix: str) -> Path:
    """Point the command line's environment at ``dsn`` and a cache file of its own, in a
    fresh directory the postgres user can enter (returned)."""
    home = reachable_tempdir(prefix)
    env["MTCACHE_BACKEND"] = dsn
    env["MTCACHE_CACHE"] = str(home / "cache.duckdb")
    return home


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[EmbeddedPostgres]:
    root = reachable_tempdir("mtcache-test-pg-")
    # (300 connections: the suite's servers, pools and clients of many modules at once)
    settings = ServerSettings(durable=False, max_connections=300)
    cluster = EmbeddedPostgres(root / "pg", settings=settings)
    cluster.ensure_running()
    try:
        yield cluster
    finally:
        close_all()  # the process's backend pools would keep reconnecting to a gone cluster
        cluster.destroy()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def backend_dsn(pg_cluster: EmbeddedPostgres, request: pytest.FixtureRequest) -> str:
    module = request.module.__name__.rsplit(".", 1)[-1]
    return pg_cluster.create_database("t_" + re.sub(r"\W", "_", module)[:40])


@pytest.fixture(scope="module")
def bookstore_dsn(backend_dsn: str) -> str:
    bookstore.load_into(backend_dsn)
    return backend_dsn


@pytest.fixture(scope="module")
def bookstore_catalog(bookstore_dsn: str) -> Catalog:
    return fetch_catalog(bookstore_dsn)


@pytest.fixture(scope="session")
def mtcache_bin() -> str:
    """The installed console script (tests run inside the project's virtualenv)."""
    import sys

    script = Path(sys.executable).parent / "mtcache"
    assert script.exists(), f"{script} is missing: install the project (make test does)"
    return str(script)


@pytest.fixture
def clean_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MTCACHE_BACKEND", None)
    env.pop("MTCACHE_CACHE", None)
    return env


@pytest.fixture(scope="session")
def spark_engine() -> Iterator[object]:
    """One local Spark session for the whole test run."""
    from cache.maintenance.spark import SparkEngine, spark_session, stop_sessions

    engine = SparkEngine(min_pages_per_task=64)
    spark_session(engine.master)
    try:
        yield engine
    finally:
        stop_sessions()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the PostgreSQL cluster (directly or through another fixture) is a
    `backend` test: `pytest -m "not backend"` runs the rest with no database anywhere."""
    for item in items:
        if "pg_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.backend)
