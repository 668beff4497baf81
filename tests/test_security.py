"""The security review's claims (docs/security.md), tested: odd identifiers work end to end (all
generated SQL quotes them with the one helper), passwords in DSNs never show, the files the
cache creates are private, the embedded cluster listens on loopback only."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import socket
import stat
import subprocess
import typing as t
from pathlib import Path

import psycopg
import pytest

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from tests.answers import typed

ODD_TABLE = '"odd ""table"" ü"'
ODD_DDL = f'''
CREATE CONTROL TABLE "key list ""pct""" ("select" INTEGER);
CREATE CONTROL TABLE "grp ü" ("Grp" TEXT);
CREATE CACHED VIEW "view ""q"" ü" AS SELECT "select", "a b", "ç""q", "Grp" FROM {ODD_TABLE}
    PRESENCE ON ("select") IN "key list ""pct"""
    REFRESH EVERY 5 MIN;
CREATE CACHED VIEW "all of it" AS SELECT * FROM {ODD_TABLE}
    CONSISTENCY ON ("Grp") IN "grp ü" REFRESH EVERY 5 MIN
'''


@pytest.fixture(scope="module")
def odd_dsn(backend_dsn: str) -> str:
    """A backend table whose name and columns need quoting: quotes, spaces, unicode, a keyword
    and a mixed-case name."""
    with psycopg.connect(backend_dsn, autocommit=True) as pg:
        pg.execute(
            f'CREATE TABLE {ODD_TABLE} ("select" int PRIMARY KEY, "a b" text NOT NULL, '
            '"ç""q" numeric(6,2), "Grp" text)'
        )
        pg.execute(
            f"INSERT INTO {ODD_TABLE} SELECT g, 'v' || g, g * 1.5, CASE WHEN g % 2 = 0 "
            "THEN 'é x' ELSE 'b\"q' END FROM generate_series(1, 20) g"
        )
    return backend_dsn


@pytest.mark.parametrize("engine", ["inline", "spark"])
def test_odd_names_work_end_to_end(
    odd_dsn: str, tmp_path: Path, engine: str, request: pytest.FixtureRequest
) -> None:
    if engine == "spark":
        request.getfixturevalue("spark_engine")
    queries = [
        f'SELECT t."select", t."a b", t."ç""q" FROM {ODD_TABLE} t WHERE t."select" = 2',
        f'SELECT t."Grp", count(*), sum(t."ç""q") FROM {ODD_TABLE} t GROUP BY t."Grp" ORDER BY 1',
    ]
    with psycopg.connect(odd_dsn) as pg:
        expected = [typed(pg.execute(q).fetchall()) for q in queries]
    with cache.connect(
        odd_dsn, tmp_path / "odd.duckdb", admit_on_miss=False, autocommit=True
    ) as conn:
        conn.admin.apply_ddl(ODD_DDL)
        conn.admin.admit('key list "pct"', [2, 3])
        conn.admin.admit("grp ü", ["é x"])
        conn.admin.refresh("all of it", engine=engine)
        conn.admin.refresh('view "q" ü', engine=engine)
        for query, want in zip(queries, expected, strict=True):
            cur = conn.execute(f"{query} CURRENCY BOUND 10 MIN ON (t)")
            assert typed(cur.fetchall()) == want
            assert {p["route"] for p in cur.provenance} == {"local"}
        conn.admin.evict('key list "pct"', [3])
        status = conn.admin.status()
        names = {v["name"]: v for v in status["views"]}
        assert names['view "q" ü']["rows"] == 1
        assert names["all of it"]["rows"] == 20
        assert {r["control"] for r in names["all of it"]["regions"]} >= {"grp ü"}


SECRET = "S3cret-pw-never-shown"


@pytest.fixture(scope="module")
def secret_dsn(backend_dsn: str) -> str:
    """The test database through a role with a password (the cluster trusts loopback
    connections, so the password only has to appear in the DSN to be tested)."""
    with psycopg.connect(backend_dsn, autocommit=True) as pg:
        pg.execute(f"CREATE ROLE secret_user LOGIN SUPERUSER PASSWORD '{SECRET}'")
    info = psycopg.conninfo.conninfo_to_dict(backend_dsn)
    return f"postgresql://secret_user:{SECRET}@{info['host']}:{info['port']}/{info['dbname']}"


def test_passwords_never_show(
    secret_dsn: str, tmp_path: Path, mtcache_bin: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    path = tmp_path / "secret.duckdb"

    def attempt(action: t.Callable[[], object]) -> None:
        try:
            seen.append(repr(action()))
        except Exception as exc:  # errors are what is being checked
            seen.append(f"{type(exc).__name__}: {exc!r} {exc.__cause__!r}")

    wrong_db = secret_dsn.rsplit("/", 1)[0] + "/no_such_database"
    attempt(lambda: cache.connect(wrong_db, path))
    attempt(lambda: cache.connect(secret_dsn.replace("127.0.0.1", "127.0.0.1:1"), path))
    attempt(lambda: cache.connect(secret_dsn + "?sslmode=bogus", path))
    conn = cache.connect(secret_dsn, path, admit_on_miss=True)
    try:
        conn.admin.apply_ddl('CREATE CACHED VIEW oddall AS SELECT * FROM "odd ""table"" ü"')
        conn.admin.refresh("oddall")
        cur = conn.execute('SELECT * FROM "odd ""table"" ü" t CURRENCY BOUND 10 MIN ON (t)')
        seen += [repr(cur.fetchall()), repr(cur.provenance), repr(cur.plan)]
        seen.append(json.dumps(conn.admin.status(), default=str))
        seen.append(repr(conn.explain("SELECT 1")))
        attempt(lambda: conn.execute("SELEC 1"))
        attempt(lambda: conn.execute("SELECT * FROM no_such_table"))
        conn.rollback()
        with psycopg.connect(secret_dsn, autocommit=True) as pg:  # the session's backend dies
            pg.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE usename = 'secret_user' AND pid <> pg_backend_pid()"
            )
        attempt(lambda: conn.execute("SELECT 1").fetchall())
    finally:
        attempt(conn.close)
    env = {**os.environ, "MTCACHE_BACKEND": secret_dsn, "MTCACHE_CACHE": str(path)}
    for argv in (
        ["status"],
        ["status", "--json"],
        ["query", "SELECT 1"],
        ["query", "SELEC 1"],
        ["--backend", wrong_db, "query", "SELECT 1"],
        ["explain", "SELECT 1"],
        ["refresh", "--view", "oddall"],
    ):
        result = subprocess.run(
            [mtcache_bin, *argv], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        seen += [result.stdout, result.stderr]
    seen += [record.getMessage() for record in caplog.records]
    seen.append(path.read_bytes().decode("latin-1"))  # nothing in the cache file either
    leaks = [text for text in seen if SECRET in text]
    assert not leaks, leaks[0][:500]
    assert any("no_such_database" in text for text in seen)  # the errors were there to check


def _server_group() -> int | None:
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres").pw_gid
    except KeyError:
        return None


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_files_the_cache_creates_are_private(backend_dsn: str, tmp_path: Path) -> None:
    path = tmp_path / "new" / "deeper" / "cache.duckdb"
    with cache.connect(backend_dsn, path) as conn:
        conn.execute("SELECT 1")
    assert _mode(path) == 0o600
    # run as root, the embedded server (the postgres OS user) may pass through, not list
    server_group = _server_group()
    for created in (path.parent, path.parent.parent):
        if server_group is None:
            assert _mode(created) == 0o700
        else:
            assert (_mode(created), created.stat().st_gid) == (0o710, server_group)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    with cache.connect(backend_dsn, shared / "cache.duckdb"):
        pass
    assert _mode(shared) == 0o755  # a directory the user made stays as they made it
    assert _mode(shared / "cache.duckdb") == 0o600


def test_the_embedded_cluster_is_private_and_on_loopback_only(
    pg_cluster: EmbeddedPostgres,
) -> None:
    assert _mode(pg_cluster.root) == 0o700
    assert _mode(pg_cluster.data_dir) == 0o700
    for name in ("port", "server.log", ".lock"):
        assert _mode(pg_cluster.root / name) & 0o077 == 0, name
    with psycopg.connect(pg_cluster.dsn("postgres")) as pg:
        assert pg.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert pg.execute("SHOW unix_socket_directories").fetchone() == ("",)
    port = int(pg_cluster.port_file.read_text())
    for address in _other_addresses():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(2)
            assert probe.connect_ex((address, port)) != 0, f"listening on {address}"


def _other_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (may be none)."""
    found = set()
    with contextlib.suppress(OSError):
        found.update(socket.gethostbyname_ex(socket.gethostname())[2])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        try:
            udp.connect(("10.255.255.255", 1))  # no packet is sent; picks the outward address
            found.add(udp.getsockname()[0])
        except OSError:
            pass
    return sorted(a for a in found if not a.startswith("127."))
