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
    refused = run("--server", "-c", "SELECT 1")
    assert refused.returncode == 1
    assert refused.stderr.startswith("mtcache: ProgrammingError: no server serves ")
    assert "start one with `mtcache serve`" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1
    assert Path(env["MTCACHE_CACHE"]).parent == home
