"""The command line starts without loading the engine (no database): building its parser, as
``--help`` and ``--version`` do, and importing `cache` import no driver, SQL parser or DuckDB,
which are loaded when a command or a name that needs them is first used."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

HEAVY = ("psycopg", "duckdb", "sqlglot", "pyarrow", "pyspark", "rich", "numpy")


def _loaded_after(code: str) -> set[str]:
    """The heavy modules loaded by ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    return set(done.stdout.split())


def test_building_the_parser_loads_no_engine() -> None:
    code = "from cache.tools.cli.wiring import build_parser\nbuild_parser()"
    assert _loaded_after(code) == set()


def test_importing_cache_loads_no_engine_until_a_name_needs_it() -> None:
    assert _loaded_after("import cache\ncache.ProgrammingError, cache.STRING.name") == set()
    assert "psycopg" in _loaded_after("import cache\ncache.Connection")
    assert "psycopg" in _loaded_after("import sql_ext.errors\nimport cache\ncache.adapters")
    assert "sqlglot" in _loaded_after("import sql_ext\nsql_ext.parse_one")


def test_the_names_cache_gives_are_those_it_gave() -> None:
    import psycopg

    import cache
    from cache.dbapi.connection import Connection
    from sql_ext import parse_one
    from sql_ext.parsing import parse_one as parsed_here

    assert cache.Connection is Connection and cache.adapters is psycopg.adapters
    assert cache.IsolationLevel is psycopg.IsolationLevel and parse_one is parsed_here
    assert psycopg.postgres.types["int4"].oid == cache.NUMBER and cache.STRING != 23
    assert all(getattr(cache, name) is not None for name in cache.__all__)


def test_version_and_help() -> None:
    for flag in ("--version", "--help"):
        done = subprocess.run(
            [sys.executable, "-m", "cache.tools.cli", flag],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr
        if flag == "--version":
            assert done.stdout == f"mtcache {version('mtcache')}\n"
        else:
            assert done.stdout.startswith("usage: mtcache") and "--version" in done.stdout
