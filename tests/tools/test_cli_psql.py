"""`mtcache psql` (issue 53): psql on the backend, its URL printed with --dsn, psql's own
arguments after --, and --server refused in one line when no server serves the file."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import cli_home


def test_psql_reaches_the_backend_and_says_when_no_server_serves(
    backend_dsn: str, mtcache_bin: str, clean_env: dict[str, str]
) -> None:
    env = dict(clean_env)
    home = cli_home(env, backend_dsn, "mtcache-psql-")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [mtcache_bin, "psql", *args],
            env=env,
            cwd=home,
            text=True,
            capture_output=True,
            timeout=120,
            check=False,
        )

    dsn = run("--dsn")
    assert (dsn.returncode, dsn.stdout) == (0, backend_dsn + "\n")
    done = run("-c", "SELECT 40 + 2 AS answer")
    assert done.returncode == 0 and " 42\n" in done.stdout, done.stderr
    raw = run("--", "-At", "-c", "SELECT current_database()")
    assert raw.stdout.strip() == backend_dsn.rsplit("/", 1)[1], raw.stderr
    passed = run("-At", "-c", "SELECT 6 * 7")  # (psql's own options, without --)
    assert passed.stdout == "42\n", passed.stderr
    # psql's arguments reach it as given, in their order, values beside their options
    (home / "first.sql").write_text("SELECT 'from the file';\n")
    ordered = run("-v", "ON_ERROR_STOP=1", "-At", "-f", "first.sql", "-c", "SELECT 'then -c'")
    assert ordered.stdout == "from the file\nthen -c\n", ordered.stderr
    stopped = run("-v", "ON_ERROR_STOP=1", "-c", "SELECT nonsense")
    assert stopped.returncode != 0 and "nonsense" in stopped.stderr
    refused = run("--server", "-c", "SELECT 1")
    assert refused.returncode == 1
    assert refused.stderr.startswith("mtcache: ProgrammingError: no server serves ")
    assert "start one with `mtcache serve`" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1
    assert Path(env["MTCACHE_CACHE"]).parent == home


def test_one_runs_flags_are_no_settings(mtcache_bin: str, clean_env: dict[str, str]) -> None:
    """`psql --dsn` and `--server` are flags of one run: an MTCACHE_DSN that a user exports
    for something else is none of mtcache's business."""
    env = dict(
        clean_env, MTCACHE_DSN="postgresql://app@db.example/shop", MTCACHE_THROUGH_SERVER="x"
    )
    done = subprocess.run(
        [mtcache_bin, "parse", "SELECT 1 CURRENCY BOUND 1 MIN"],
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_server_names_a_role_and_database_and_the_backend_stays_its_own(
    mtcache_bin: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """`--server HOST:PORT` alone says to name the role and database; a command that needs the
    backend itself asks for --backend instead of starting an embedded PostgreSQL here."""
    env = dict(clean_env, MTCACHE_CACHE=str(tmp_path / "cache.duckdb"))

    def refused(*args: str) -> str:
        done = subprocess.run(
            [mtcache_bin, *args], env=env, text=True, capture_output=True, timeout=60, check=False
        )
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        return done.stderr

    assert "postgresql://ROLE@HOST:PORT/DATABASE" in refused("--server", "127.0.0.1:9", "status")
    url = "postgresql://app@127.0.0.1:9/shop"
    for command in (["doctor"], ["heartbeat"]):
        assert "needs the backend itself" in refused("--server", url, *command)
    assert "needs the cache file itself" in refused("--server", url, "init")
    assert not (tmp_path / "pg").exists()  # (no embedded cluster made here)
