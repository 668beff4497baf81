"""`pip install .` into a fresh virtualenv (issue 53): the product alone (no pyspark, no
Java, none of the experiments' libraries), and with it a cached query answered locally over
the embedded backend, through the CLI and the DB-API, a one-key refresh run inline (there is
no Spark to start), every answer compared with PostgreSQL's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import reachable_tempdir
from tests.paths import ROOT

QUERY = "SELECT id, name, price FROM items WHERE id = 4"
SCRIPT = """\
import cache, psycopg

with cache.connect(background=False) as conn:
    cur = conn.execute({query!r} + " CURRENCY BOUND 10 MIN")
    rows, route = cur.fetchall(), cur.provenance[0]["route"]
with psycopg.connect({dsn!r}) as pg:
    expected = pg.execute({query!r}).fetchall()
types = [[type(v).__name__ for v in found[0]] for found in (rows, expected)]
print(repr((route, rows == expected, *types)))
"""


@pytest.mark.backend
def test_a_fresh_virtualenv_gets_the_product_alone_and_answers_locally() -> None:
    home = reachable_tempdir("mtcache-install-")
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTCACHE_")}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            list(args),
            cwd=home,
            env=env,
            text=True,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"{args}: {done.stderr}"
        return done

    run("pip", "install", "--quiet", "--disable-pip-version-check", str(ROOT), timeout=900)
    listed = json.loads(run("pip", "list", "--format", "json").stdout)
    names = {item["name"].lower() for item in listed}
    assert {"mtcache", "duckdb", "psycopg", "sqlglot"} <= names
    assert names & {"pyspark", "py4j", "matplotlib", "tpchgen-cli"} == set()
    try:
        run(
            "mtcache",
            "psql",
            "-c",
            "CREATE TABLE items (id integer PRIMARY KEY, name text, price numeric(8,2))",
            "-c",
            "INSERT INTO items SELECT i, 'item ' || i, i * 0.5 FROM generate_series(1, 100) i",
        )
        dsn = run("mtcache", "psql", "--dsn").stdout.strip()
        (home / "schema.sql").write_text(
            "CREATE CONTROL TABLE hot (id integer);\n"
            "CREATE CACHED VIEW items_cache AS SELECT * FROM items\n"
            "    PRESENCE ON (id) IN hot REFRESH EVERY 10 MIN;\n"
        )
        run("mtcache", "ddl", "schema.sql")
        admitted = run("mtcache", "admit", "hot", "4").stdout
        assert "(inline," in admitted, admitted
        refreshed = run("mtcache", "refresh", "--view", "items_cache", "--key", "4").stdout
        assert "(inline," in refreshed and "engine inline:" in refreshed, refreshed
        answered = run("mtcache", "query", QUERY + " CURRENCY BOUND 10 MIN").stdout
        assert "provenance: items: local via items_cache" in answered, answered
        script = textwrap.dedent(SCRIPT.format(query=QUERY, dsn=dsn))
        found = run(str(venv / "bin" / "python"), "-c", script).stdout.strip()
        assert found == repr(("local", True, ["int", "str", "Decimal"], ["int", "str", "Decimal"]))
    finally:
        subprocess.run(["mtcache", "stop"], cwd=home, env=env, timeout=120, check=False)
