"""SQLAlchemy's dialect compliance suite (``sqlalchemy.testing.suite``) against
``postgresql+mtcache`` on the session's cluster, run as SQLAlchemy's README.dialects.rst
describes: a pytest session of its own with SQLAlchemy's plugin (tests/sqla_suite). Every
test passes or is skipped by a requirement tests/sqla_suite/requirements.py declares."""

from __future__ import annotations

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import URL

from cache.backend.embedded_pg import EmbeddedPostgres
from cache.sqla import engine_url
from tests.conftest import reachable_tempdir
from tests.paths import TESTS
from tests.serving import server_of

SUITE = TESTS / "sqla_suite"


# (with a session bound only: every read is planned, and what is not answered locally goes
# to PostgreSQL as written, which is all a run without a bound does; the two runs without one
# took 90 s of make test, docs/decisions/sqlalchemy.md)
@pytest.mark.parametrize("currency_bound", ["10 min"], ids=["session-bound"])
def test_the_compliance_suite_passes(
    pg_cluster: EmbeddedPostgres, currency_bound: str | None
) -> None:
    """With a session bound every read is planned first (SQLAlchemy's reflection queries of
    pg_catalog, temporary tables, names with %, ...) and must come out as PostgreSQL's."""
    dsn = _suite_database(
        pg_cluster, "sqla_suite" if currency_bound is None else "sqla_suite_bound"
    )
    work = reachable_tempdir("mtcache-sqla-suite-")
    try:
        _run_suite(dsn, work, currency_bound)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("options", ["-c mtcache.currency_bound=600"], ids=["session-bound"])
def test_the_compliance_suite_passes_over_the_server(
    pg_cluster: EmbeddedPostgres, options: str | None
) -> None:
    """The same suite over SQLAlchemy's own ``postgresql+psycopg`` dialect connected to
    `mtcache serve`: nothing of ours in the client, the bound (if any) given by the
    connection string's startup options."""
    name = "sqla_suite_server" if options is None else "sqla_suite_server_bound"
    dsn = _suite_database(pg_cluster, name)
    work = reachable_tempdir("mtcache-sqla-suite-")
    try:
        with server_of(dsn, work / "cache.duckdb") as served:
            query = {} if options is None else {"options": options}
            url = URL.create(
                "postgresql+psycopg",
                username="postgres",
                host=served.host,
                port=served.port,
                database=name,
                query=query,
            )
            _run_pytest(url, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _suite_database(pg_cluster: EmbeddedPostgres, name: str) -> str:
    dsn = pg_cluster.create_database(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in ("test_schema", "test_schema_2"):  # the suite's other schemas
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    return dsn


def _run_suite(dsn: str, work: Path, currency_bound: str | None) -> None:
    bound = {} if currency_bound is None else {"currency_bound": currency_bound}
    _run_pytest(engine_url(dsn, work / "cache.duckdb", background=False, **bound), work)


def _run_pytest(url: URL, work: Path) -> None:
    report = work / "junit.xml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(SUITE / "setup.cfg"),
            "--rootdir",
            str(SUITE),
            str(SUITE / "suite_compliance.py"),
            "--dburi",
            url.render_as_string(hide_password=False),
            "-q",
            f"--junitxml={report}",
        ],
        cwd=SUITE,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None, done.stdout[-3000:]
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    assert done.returncode == 0 and counts["failures"] == counts["errors"] == 0, (
        f"{summary}\n{done.stdout[-6000:]}"
    )
    assert counts["tests"] - counts["skipped"] > 1000, summary  # the suite did run
