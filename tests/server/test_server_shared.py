"""One cache, many processes: `mtcache serve` owns the file; two application processes
(``cache.connect(server=...)``), SQLAlchemy (``?server=``) and every `mtcache` command use it at
the same time through the server. Answers are compared with PostgreSQL's (values and types),
provenance and bounds travel with the session."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import typing as t
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

import cache
from cache.store.counters import Counter
from cache.store.served import note_path, served_at
from tests.conftest import cli_home
from tests.paths import ROOT
from tests.schemas import AUTHORS_AND_BOOKS

SCHEMA = AUTHORS_AND_BOOKS

BOOKS = "SELECT isbn, title, price, authorid FROM books WHERE authorid = %s ORDER BY isbn"

# an application process: cached reads compared with PostgreSQL's, a write it reads back
APP = """
import sys
import cache, psycopg
from tests.answers import typed

server, backend, worker = sys.argv[1], sys.argv[2], int(sys.argv[3])
sql = "SELECT isbn, title, price, authorid FROM books WHERE authorid = %s ORDER BY isbn"
with cache.connect(backend, server=server, currency_bound="10 min") as conn, \\
        psycopg.connect(backend, autocommit=True) as pg:
    cur = conn.cursor()
    for round in range(20):
        author = 1 + (round + worker) % 2
        cur.execute(sql, [author])
        assert typed(cur.fetchall()) == typed(pg.execute(sql, [author]).fetchall())
        assert [p["route"] for p in cur.provenance] == ["local"], cur.provenance
    isbn = f"isbn-app-{worker}"
    cur.execute("INSERT INTO books (isbn, authorid, title, publisherid, type, price) "
                "VALUES (%s, 1, 'app', 1, 'x', 1)", [isbn])
    cur.execute("SELECT title FROM books WHERE isbn = %s", [isbn])
    assert cur.fetchall() == [("app",)]  # its own write, not the cache's older rows
    assert [p["route"] for p in cur.provenance] == ["remote"]
    conn.rollback()
print("ok", worker)
"""


class Serving(t.NamedTuple):
    process: subprocess.Popen[str]
    env: dict[str, str]
    cache_path: Path
    address: str
    backend: str


def mtcache(
    bin: str, env: dict[str, str], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [bin, *args], env=env, text=True, capture_output=True, timeout=300, input=stdin, check=False
    )


@pytest.fixture(scope="module")
def serving(bookstore_dsn: str, mtcache_bin: str) -> Iterator[Serving]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTCACHE_")}
    home = cli_home(env, bookstore_dsn, "mtcache-shared-")
    cache_path = Path(env["MTCACHE_CACHE"])
    (home / "schema.sql").write_text(SCHEMA)
    for args in (("ddl", str(home / "schema.sql")), ("admit", "authorlist_pct", "1", "2")):
        done = mtcache(mtcache_bin, env, *args)
        assert done.returncode == 0, done.stderr
    process = subprocess.Popen(
        [
            mtcache_bin,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--cache-size-limit",
            "50MB",
            "--doorkeeper",
            "30",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    logs = process.stderr
    assert logs is not None
    for line in iter(logs.readline, ""):  # the server says where it listens once it does
        if "listening on" in line:
            break
    else:
        raise AssertionError(f"the server stopped: exit {process.wait(60)}")
    reader = threading.Thread(target=logs.read, daemon=True)  # its logs, drained
    reader.start()
    served = served_at(cache_path)  # published before it says it listens
    assert served is not None and served.pid == process.pid
    try:
        yield Serving(process, env, cache_path, served.address, bookstore_dsn)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
        reader.join(60)
        logs.close()


def test_two_application_processes_and_status_at_once(serving: Serving, mtcache_bin: str) -> None:
    root = ROOT
    env = dict(serving.env, PYTHONPATH=str(root))
    apps = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                textwrap.dedent(APP),
                serving.address,
                serving.backend,
                str(worker),
            ],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for worker in (0, 1)
    ]
    status = mtcache(mtcache_bin, serving.env, "status", "--json")
    outputs = [app.communicate(timeout=300) for app in apps]
    for worker, (app, (out, err)) in enumerate(zip(apps, outputs, strict=True)):
        assert app.returncode == 0, err
        assert out.strip() == f"ok {worker}"
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)
    assert [v["name"] for v in document["views"]] == ["authorcopy", "bookcopy"]
    assert document["control_keys"] == {"authorlist_pct": ["authorid"]}
    # the server's budget (`mtcache serve --cache-size-limit`), the data well within it
    assert document["resources"]["cache_size_limit"] == 50_000_000
    assert 0 < document["resources"]["data_bytes"] < 50_000_000
    assert document["counters"][Counter.EVICTIONS] == 0


def test_an_in_process_connection_is_told_where_the_server_is(
    serving: Serving, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MTCACHE_BACKEND", raising=False)
    monkeypatch.delenv("MTCACHE_CACHE", raising=False)
    with pytest.raises(cache.OperationalError, match="server='postgresql://") as told:
        cache.connect(serving.backend, serving.cache_path)
    assert f"@{serving.address}/" in str(told.value)
    # the call it gives works as pasted: nothing else named (no backend, no environment)
    call = re.search(r"cache\.connect\((server='[^']+')\)", str(told.value))
    assert call is not None, told.value
    url = call.group(1).removeprefix("server=").strip("'")
    with cache.connect(server=url) as conn:
        cur = conn.cursor()
        cur.execute("SELECT title FROM books WHERE authorid = %s ORDER BY isbn", [1])
        with psycopg.connect(serving.backend) as pg:
            want = pg.execute("SELECT title FROM books WHERE authorid = 1 ORDER BY isbn")
            assert cur.fetchall() == want.fetchall()


def test_every_command_goes_through_the_server(
    serving: Serving, mtcache_bin: str, tmp_path: Path
) -> None:
    env = serving.env
    query = mtcache(
        mtcache_bin,
        env,
        "query",
        "--json",
        "SELECT isbn, price FROM books WHERE authorid = 1 ORDER BY isbn CURRENCY BOUND 10 MIN",
    )
    assert query.returncode == 0, query.stderr
    answer = json.loads(query.stdout)
    with psycopg.connect(serving.backend) as pg:
        want = pg.execute("SELECT isbn, price FROM books WHERE authorid = 1 ORDER BY isbn")
        assert answer["rows"] == [[isbn, str(price)] for isbn, price in want.fetchall()]
    assert [p["route"] for p in answer["provenance"]] == ["local"]

    explain = mtcache(
        mtcache_bin,
        env,
        "explain",
        "SELECT title FROM books WHERE authorid = 2 CURRENCY BOUND 10 MIN",
    )
    assert explain.returncode == 0, explain.stderr
    assert "normalized C&C constraint:" in explain.stdout and "SwitchUnion" in explain.stdout
    plain = mtcache(mtcache_bin, env, "explain", "--json", "SELECT title FROM books")
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["constraint"][0]["bound_seconds"] == 0

    admit = mtcache(mtcache_bin, env, "admit", "--json", "authorlist_pct", "3")
    assert admit.returncode == 0, admit.stderr
    assert json.loads(admit.stdout)["operation"].startswith("admit")
    refresh = mtcache(
        mtcache_bin, env, "refresh", "--engine", "inline", "--view", "authorcopy", "--key", "3"
    )
    assert refresh.returncode == 0, refresh.stderr
    assert refresh.stdout.startswith("refresh authorcopy")
    evict = mtcache(mtcache_bin, env, "evict", "authorlist_pct", "3")
    assert evict.returncode == 0, evict.stderr
    status = json.loads(mtcache(mtcache_bin, env, "status", "--json").stdout)
    assert [r["key"] for r in status["views"][0]["regions"]] == [[1], [2]]
    # a view's regions listed however many, through the server too (SHOW CACHE STATUS FOR VIEW)
    viewed = mtcache(mtcache_bin, env, "status", "--json", "--view", "authorcopy")
    assert viewed.returncode == 0, viewed.stderr
    listed = {v["name"]: v["regions"] for v in json.loads(viewed.stdout)["views"]}
    assert [r["key"] for r in listed["authorcopy"]] == [[1], [2]]

    # a DDL script applies all or nothing through the server too
    script = tmp_path / "more.sql"
    script.write_text(
        "CREATE CONTROL TABLE pubs_pct (publisherid INTEGER);\n"
        "CREATE CACHED VIEW ghostcopy AS SELECT * FROM no_such_table;\n"
    )
    failed = mtcache(mtcache_bin, env, "ddl", str(script))
    assert failed.returncode == 1 and failed.stderr.count("\n") == 1, failed.stderr
    assert "no_such_table" in failed.stderr
    status = json.loads(mtcache(mtcache_bin, env, "status", "--json").stdout)
    assert status["control_tables"] == ["authorlist_pct"]  # nothing of the script applied
    script.write_text(
        "CREATE CONTROL TABLE pubs_pct (publisherid INTEGER);\nDROP CONTROL TABLE pubs_pct;\n"
    )
    done = mtcache(mtcache_bin, env, "ddl", str(script))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["dropped pubs_pct", "created pubs_pct"]

    for args, says in (
        (("init",), "served by `mtcache serve`"),
        (("serve", "--listen", "127.0.0.1:0"), "served by `mtcache serve`"),
        (("admit", "nonsense", "1"), "not a control table"),
    ):
        refused = mtcache(mtcache_bin, env, *args)
        assert refused.returncode == 1 and says in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1


def test_every_command_from_another_machine_with_server(
    serving: Serving, mtcache_bin: str, tmp_path: Path
) -> None:
    """No cache file and no note here, as on another machine: `--server URL` (or
    MTCACHE_SERVER) sends each command to the server; the backend DSN is not needed."""
    served = served_at(serving.cache_path)
    assert served is not None
    env = {k: v for k, v in serving.env.items() if not k.startswith("MTCACHE_")}
    env["MTCACHE_CACHE"] = str(tmp_path / "elsewhere" / "cache.duckdb")  # (none there)
    flag = ["--server", served.url]
    status = mtcache(mtcache_bin, env, *flag, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert [v["name"] for v in json.loads(status.stdout)["views"]] == ["authorcopy", "bookcopy"]
    query = mtcache(
        mtcache_bin,
        env,
        *flag,
        "query",
        "--json",
        "SELECT name FROM authors a WHERE a.authorid = 2 CURRENCY BOUND 10 MIN",
    )
    assert query.returncode == 0, query.stderr
    with psycopg.connect(serving.backend) as pg:
        want = pg.execute("SELECT name FROM authors a WHERE a.authorid = 2").fetchall()
    answer = json.loads(query.stdout)
    assert answer["rows"] == [list(row) for row in want]
    assert [p["route"] for p in answer["provenance"]] == ["local"]
    # the environment's MTCACHE_SERVER, and HOST:PORT alone (the role and database: the
    # server's own)
    refresh = mtcache(
        mtcache_bin,
        dict(env, MTCACHE_SERVER=served.url),
        "refresh",
        "--engine",
        "inline",
        "--view",
        "authorcopy",
        "--key",
        "2",
    )
    assert refresh.returncode == 0 and refresh.stdout.startswith("refresh authorcopy"), refresh
    psql = mtcache(
        mtcache_bin, env, *flag, "psql", "--server", "-At", "-c", "SHOW mtcache.currency_bound"
    )
    assert psql.returncode == 0, psql.stderr
    refused = mtcache(mtcache_bin, env, *flag, "init")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "needs the cache file itself; run it on the server's machine" in refused.stderr
    assert not (tmp_path / "elsewhere").exists()  # nothing made here


def test_sqlalchemy_through_the_server(serving: Serving) -> None:
    """A URL parameter moves an application onto the server: provenance and bounds (a clause,
    the currency_bound execution option) behave as in-process."""
    url = sa.make_url(serving.backend).set(
        drivername="postgresql+mtcache", query={"server": serving.address}
    )
    books = sa.table("books", sa.column("title"), sa.column("authorid"), sa.column("isbn"))
    query = sa.select(books.c.title).where(books.c.authorid == 2).order_by(books.c.isbn)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn, psycopg.connect(serving.backend) as pg:
            want = pg.execute("SELECT title FROM books WHERE authorid = 2 ORDER BY isbn")
            expected = want.fetchall()
            result = conn.execute(
                sa.text(
                    "SELECT title FROM books WHERE authorid = :a ORDER BY "
                    "isbn CURRENCY BOUND 10 MIN"
                ),
                {"a": 2},
            )
            assert [tuple(r) for r in result] == expected
            assert [p["route"] for p in cache.sqla.provenance(result)] == ["local"]
            bounded = conn.execute(query, execution_options={"currency_bound": "10 min"})
            assert [tuple(r) for r in bounded] == expected
            assert [p["route"] for p in cache.sqla.provenance(bounded)] == ["local"]
            plain = conn.execute(query)
            assert [tuple(r) for r in plain] == expected
            assert [p["route"] for p in cache.sqla.provenance(plain)] == ["remote"]
    finally:
        engine.dispose()
    # no host needed: the URL's role and database are asked of the server
    backend = sa.make_url(serving.backend)
    bare = sa.make_url(
        f"postgresql+mtcache://{backend.username}@/{backend.database}?server={serving.address}"
    )
    engine = sa.create_engine(bare)
    try:
        with engine.connect() as conn:
            found = conn.execute(query, execution_options={"currency_bound": "10 min"})
            assert [tuple(r) for r in found] == expected
            assert [p["route"] for p in cache.sqla.provenance(found)] == ["local"]
    finally:
        engine.dispose()


def test_sigterm_stops_the_server_and_withdraws_its_note(
    serving: Serving, mtcache_bin: str
) -> None:
    """Last in the module: the server stops cleanly, and the file is the commands' again."""
    process = serving.process
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0
    assert not note_path(serving.cache_path).exists()
    status = mtcache(mtcache_bin, serving.env, "status", "--json")
    assert status.returncode == 0, status.stderr  # the file opened directly again
    assert os.path.exists(serving.cache_path)
