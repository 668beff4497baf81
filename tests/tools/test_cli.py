"""The `mtcache` command line, run as a real process."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cache.backend.embedded_pg import EmbeddedPostgres
from cache.store.cache_file import CacheStore
from cache.tools import bookstore
from sql_ext import parse
from tests.conftest import cli_home, reachable_tempdir

# a cache file of this module's own, never the checkout's default one
_PRIVATE_CACHE = Path(tempfile.mkdtemp(prefix="mtcache-cli-")) / "cache.duckdb"


def run(
    mtcache_bin: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    if env is None:
        env = {**os.environ, "MTCACHE_CACHE": str(_PRIVATE_CACHE)}
    return subprocess.run(
        [mtcache_bin, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_parse_json_needs_no_backend(mtcache_bin: str, clean_env: dict[str, str]) -> None:
    clean_env["MTCACHE_BACKEND"] = "postgresql://nobody@127.0.0.1:1/none"
    result = run(
        mtcache_bin,
        "parse",
        "--json",
        "SELECT o.id FROM orders o JOIN lines l ON o.id = l.oid "
        "CURRENCY BOUND 90 SEC ON (o, l) BY o.id",
        env=clean_env,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "kind": "query",
        "sql": "SELECT o.id FROM orders AS o JOIN lines AS l ON o.id = l.oid",
        "clauses": [
            {"block": 0, "specs": [{"bound_seconds": 90.0, "on": ["o", "l"], "by": ["o.id"]}]}
        ],
    }


def test_a_refresh_with_the_default_engine_starts_no_jvm(
    bookstore_dsn: str, tmp_path: Path
) -> None:
    """One key's refresh on the default engine (auto) is pulled inline: Spark, and its JVM, is
    not even imported (a JVM took 12-17 s for it)."""
    probe = f"""
import sys
import cache
with cache.connect({bookstore_dsn!r}, {str(tmp_path / "c.duckdb")!r}, background=False) as conn:
    cur = conn.cursor()
    cur.execute("CREATE CONTROL TABLE authorlist_pct (authorid INTEGER)")
    cur.execute("CREATE CACHED VIEW authorcopy AS SELECT * FROM authors "
                "PRESENCE ON (authorid) IN authorlist_pct")
    cur.execute("INSERT INTO authorlist_pct VALUES (4)")
    report = conn.admin.refresh("authorcopy", [4])
print(report.engine, "pyspark" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["inline", "False"]


def test_parse_human_output(mtcache_bin: str) -> None:
    result = run(mtcache_bin, "parse", "SELECT * FROM t CURRENCY BOUND 90 SEC ON (t) BY t.k")
    assert result.returncode == 0
    assert "block 0: 90 sec ON (t) BY t.k" in result.stdout


def test_parse_error_is_one_line_with_position(mtcache_bin: str) -> None:
    result = run(mtcache_bin, "parse", "--json", "SELECT *\nFROM t CURRENCY BOUND 5 EONS")
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("mtcache: SqlSyntaxError: line 2, column 25: unknown unit 'EONS'")
    assert "Traceback" not in result.stderr


def test_explain_json_prints_the_constraint(mtcache_bin: str, bookstore_dsn: str) -> None:
    result = run(
        mtcache_bin,
        "--backend",
        bookstore_dsn,
        "explain",
        "--json",
        "SELECT s.qty FROM sales s, (SELECT b.isbn FROM books b, reviews r WHERE b.isbn = r.isbn "
        "CURRENCY BOUND 10 MIN ON (b, r)) t WHERE s.isbn = t.isbn CURRENCY BOUND 5 MIN ON (s, t)",
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["constraint"] == [
        {"bound_seconds": 300.0, "tables": ["books", "reviews", "sales"], "by": []}
    ]
    assert set(document) == {"constraint", "plan", "accesses", "estimated_cost"}
    assert document["plan"]["op"] == "RemoteQuery"  # nothing is cached in this cache file
    assert {a["route"] for a in document["accesses"]} == {"remote"}


def test_explain_reads_the_backend_from_the_environment(
    mtcache_bin: str, bookstore_dsn: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    clean_env["MTCACHE_BACKEND"] = bookstore_dsn
    clean_env["MTCACHE_CACHE"] = str(tmp_path / "cache.duckdb")  # not the checkout's .mtcache
    result = run(
        mtcache_bin,
        "explain",
        "SELECT * FROM authors a CURRENCY BOUND 2 MIN BY a.city",
        env=clean_env,
    )
    assert result.returncode == 0, result.stderr
    assert "class 1 (authors): at most 2 min stale, one snapshot per group of (authors.city)" in (
        result.stdout
    )
    assert "plan:" in result.stdout and "RemoteQuery" in result.stdout


def test_explain_unknown_table(mtcache_bin: str, bookstore_dsn: str) -> None:
    result = run(mtcache_bin, "--backend", bookstore_dsn, "explain", "SELECT * FROM nope")
    assert result.returncode == 1
    assert "CatalogError: line 1, column 15: unknown table or view 'nope'" in result.stderr


def test_explain_with_backend_down(mtcache_bin: str, tmp_path: Path) -> None:
    """A cache file that never saw its backend cannot plan without it (one line, what to do);
    tests/engine/test_backend_down.py explains from a catalog on file while the backend is down."""
    result = run(
        mtcache_bin,
        "--backend",
        "postgresql://postgres@127.0.0.1:1/x",
        "--cache",
        str(tmp_path / "new.duckdb"),
        "explain",
        "SELECT 1",
    )
    assert result.returncode == 1
    assert result.stderr.startswith("mtcache: BackendUnavailableError: cannot reach the PostgreSQL")
    assert "127.0.0.1:1/x" in result.stderr
    assert "connect once while the backend is up" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_explain_rejects_ddl(mtcache_bin: str, bookstore_dsn: str) -> None:
    result = run(
        mtcache_bin, "--backend", bookstore_dsn, "explain", "CREATE CONTROL TABLE p (k int)"
    )
    assert result.returncode == 1
    assert "explain takes a query; this is a ddl statement" in result.stderr


def test_usage_error_exits_2(mtcache_bin: str) -> None:
    result = run(mtcache_bin, "frobnicate")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


@pytest.mark.backend
def test_embedded_default_starts_reuses_and_stops(
    mtcache_bin: str, clean_env: dict[str, str]
) -> None:
    """With no backend, explain starts a private cluster beside the cache file; stop ends it."""
    home = reachable_tempdir("mtcache-cli-")
    cache = str(home / "cache.duckdb")
    try:
        first = run(mtcache_bin, "--cache", cache, "explain", "--json", "SELECT 1", env=clean_env)
        assert first.returncode == 0, first.stderr
        assert json.loads(first.stdout)["constraint"] == []
        assert (home / "pg" / "data" / "PG_VERSION").is_file()
        port = (home / "pg" / "port").read_text().strip()

        again = run(mtcache_bin, "--cache", cache, "explain", "--json", "SELECT 1", env=clean_env)
        assert again.returncode == 0, again.stderr
        assert (home / "pg" / "port").read_text().strip() == port

        stopped = run(mtcache_bin, "--cache", cache, "stop", env=clean_env)
        assert stopped.returncode == 0
        assert "stopped the embedded PostgreSQL" in stopped.stdout
        assert not (home / "pg" / "data" / "postmaster.pid").exists()

        twice = run(mtcache_bin, "--cache", cache, "stop", env=clean_env)
        assert "was not running" in twice.stdout
    finally:
        from cache.backend.embedded_pg import EmbeddedPostgres

        EmbeddedPostgres(home / "pg").destroy()
        import shutil

        shutil.rmtree(home, ignore_errors=True)


def test_pass_through_statements_print_no_warnings(mtcache_bin: str) -> None:
    result = run(mtcache_bin, "parse", "--json", "VACUUM ANALYZE books")
    assert result.returncode == 0
    assert result.stderr == ""
    assert json.loads(result.stdout)["sql"] == "VACUUM ANALYZE books"


def test_cache_store_commands_end_to_end(
    mtcache_bin: str, pg_cluster: object, clean_env: dict[str, str]
) -> None:
    """init, ddl, admit, evict, refresh and status against a real backend, as a user runs them."""
    from cache.backend.embedded_pg import EmbeddedPostgres
    from cache.tools import bookstore

    assert isinstance(pg_cluster, EmbeddedPostgres)
    dsn = pg_cluster.create_database("cli_store")
    bookstore.load_into(dsn)
    home = cli_home(clean_env, dsn, "mtcache-cli-store-")
    schema_file = bookstore.CACHE_SCHEMA_FILE

    def ok(*args: str) -> str:
        result = run(mtcache_bin, *args, env=clean_env)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert "shadow catalog of 5 backend tables and 1 view" in ok("init")
    assert "created reviewcopy" in ok("ddl", str(schema_file))
    assert "admit citylist_csct at snapshot 1" in ok("admit", "citylist_csct", "Madison")
    report = json.loads(ok("admit", "--json", "authorlist_pct", "4", "8"))
    assert report["rows_inserted"]["authorcopy"] == 2 and report["snapshot_id"] == 2
    assert "authorcopy -1/+0" in ok("evict", "authorlist_pct", "8")
    assert json.loads(ok("refresh", "--view", "authorcopy", "--key", "4", "--json"))["rounds"] == 1
    # an integer key as SQL writes it (it came as text), not as Python's [('4',)]; the
    # default engine pulls one key inline, and says why
    refreshed = ok("refresh", "--view", "authorcopy", "--key", "4")
    assert refreshed.startswith("refresh authorcopy keys (4) ") and "(inline, " in refreshed
    assert "engine inline: its largest pull reads " in refreshed and "Spark pays from" in refreshed
    document = json.loads(ok("status", "--json"))
    views = {v["name"]: v for v in document["views"]}
    assert views["authorcopy"]["rows"] == 1 and views["bookcopy"]["rows"] == 5
    human = ok("status")
    assert "authorcopy (authors, white, group-level under authorlist_pct" in human
    assert "presence     authorlist_pct(4): 1 row," in human
    # each view's last and next refresh (authorcopy: REFRESH EVERY 5 MIN; bookcopy is gray)
    assert re.search(
        r"authorcopy .*: 1 row; refreshed [\d.]+ sec ago \(landing [\d.]+ sec old\), "
        r"engine inline \(its largest pull reads \d+ pages? of the backend; Spark pays from "
        r"16,384\), next in [\d.]+ sec",
        human,
    )
    # the engine of the last refresh and why, in the document too
    assert views["authorcopy"]["last_engine"] == "inline"
    assert "Spark pays from" in views["authorcopy"]["last_engine_reason"]
    assert "bookcopy (books, gray" in human and "with authorcopy" in human
    assert views["authorcopy"]["last_refresh"] is not None
    # a gray view is refreshed with its root, and says so (not "never refreshed")
    assert views["bookcopy"]["last_refresh"] == views["authorcopy"]["last_refresh"]
    assert re.search(r"bookcopy .*: 5 rows; refreshed [\d.]+ sec ago .*with authorcopy", human)
    next_refresh = dt.datetime.fromisoformat(views["authorcopy"]["next_refresh"])
    oldest = min(
        dt.datetime.fromisoformat(r["refreshed_at"]) for r in views["authorcopy"]["regions"]
    )
    assert next_refresh == oldest + dt.timedelta(minutes=5)

    bad = run(mtcache_bin, "admit", "authorlist_pct", env=clean_env)
    assert bad.returncode == 2  # argparse: VALUE is required
    bad = run(mtcache_bin, "refresh", "--view", "bookcopy", env=clean_env)
    assert bad.returncode == 1 and "refresh authorcopy instead" in bad.stderr
    bad = run(mtcache_bin, "ddl", str(home / "missing.sql"), env=clean_env)
    assert bad.returncode == 1 and "cannot read the DDL script" in bad.stderr
    shutil.rmtree(home, ignore_errors=True)


def test_the_owner_fills_what_it_creates_and_says_what_nothing_fills(
    mtcache_bin: str, pg_cluster: EmbeddedPostgres, clean_env: dict[str, str]
) -> None:
    """`mtcache ddl` fills the fully materialized views it creates (continuous and derived
    ones too), so their reads are local at once; a view never filled (its creator died before
    filling it) is named by EXPLAIN and status, with what fills it."""
    dsn = pg_cluster.create_database("cli_fill")
    bookstore.load_into(dsn)
    home = cli_home(clean_env, dsn, "mtcache-cli-fill-")

    def ok(*args: str) -> str:
        result = run(mtcache_bin, *args, env=clean_env)
        assert result.returncode == 0, result.stderr
        return result.stdout

    script = home / "views.sql"
    script.write_text(
        "CREATE CACHED VIEW author_books AS SELECT b.authorid, count(*) AS books "
        "FROM books b GROUP BY b.authorid REFRESH CONTINUOUSLY;\n"
        "CREATE CACHED VIEW salecopy AS SELECT * FROM sales;\n"
    )
    printed = ok("ddl", str(script))
    assert re.search(r"filled author_books: [\d,]+ rows in", printed), printed
    assert re.search(r"filled salecopy: [\d,]+ rows in", printed), printed
    query = "SELECT b.authorid, count(*) FROM books b GROUP BY b.authorid CURRENCY BOUND 10 MIN"
    document = json.loads(ok("query", "--json", query))
    assert {p["route"] for p in document["provenance"]} == {"local"}
    assert "note:" not in ok("explain", query)

    # a view its creator never filled: made in the file without the DDL's fill
    with CacheStore(home / "cache.duckdb") as store:
        store.apply_ddl(
            parse("CREATE CACHED VIEW reviewcopy AS SELECT * FROM reviews"), store.load_catalog()
        )
    unfilled = "SELECT * FROM reviews r WHERE r.rating > 3 CURRENCY BOUND 10 MIN"
    explained = json.loads(ok("explain", "--json", unfilled))
    assert explained["notes"] == [
        "reviewcopy was never filled: its guard fails and the backend answers; nothing fills "
        "it until REFRESH CACHED VIEW reviewcopy (mtcache refresh --view reviewcopy) or a "
        "refresh scheduler does"
    ]
    assert f"note: {explained['notes'][0]}" in ok("explain", unfilled)
    assert "read at the backend until `mtcache refresh --view reviewcopy` fills it" in ok("status")
    ok("refresh", "--view", "reviewcopy")
    assert "notes" not in json.loads(ok("explain", "--json", unfilled))
    ok("ddl", str(_script(home, "DROP CACHED VIEW author_books;")))  # (its replication slot)
    shutil.rmtree(home, ignore_errors=True)


def _script(home: Path, text: str) -> Path:
    path = home / "script.sql"
    path.write_text(text)
    return path


def test_query_prints_rows_and_provenance(mtcache_bin: str, bookstore_dsn: str) -> None:
    home = reachable_tempdir("mtcache-cli-query-")
    base = [mtcache_bin, "--backend", bookstore_dsn, "--cache", str(home / "c.duckdb")]
    sql = (
        "SELECT b.isbn, b.price, s.sold_on FROM books b JOIN sales s ON s.isbn = b.isbn "
        "WHERE s.saleid = 1 CURRENCY BOUND 1 MIN ON (b, s)"
    )
    result = subprocess.run(
        [*base, "query", "--json", sql], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["columns"] == ["isbn", "price", "sold_on"]
    _isbn, price, sold_on = document["rows"][0]
    assert isinstance(price, str) and isinstance(sold_on, str) and len(sold_on) == 10
    assert sorted(p["table"] for p in document["provenance"]) == ["books", "sales"]
    human = subprocess.run(
        [*base, "query", sql], capture_output=True, text=True, check=False, timeout=120
    )
    assert "1 row" in human.stdout and "provenance: books: remote" in human.stdout
    shutil.rmtree(home, ignore_errors=True)


def test_demo_shows_the_cache_at_work(
    mtcache_bin: str, pg_cluster: object, clean_env: dict[str, str]
) -> None:
    """`mtcache demo` (what `make demo` runs) on a backend of its own: the §2 examples, then
    local and remote answers with their provenance, a mixed plan, EXPLAIN, the counters."""
    from cache.backend.embedded_pg import EmbeddedPostgres

    assert isinstance(pg_cluster, EmbeddedPostgres)
    home = cli_home(clean_env, pg_cluster.create_database("cli_demo"), "mtcache-cli-demo-")
    try:
        for _ in range(2):  # a second run starts its demo cache afresh
            result = run(mtcache_bin, "demo", env=clean_env)
            assert result.returncode == 0, result.stderr
        out = result.stdout
        assert "normalized (books, reviews): at most 10 min stale, one snapshot" in out
        assert "authors: local from authorcopy" in out
        assert "authors: remote (PostgreSQL, current)" in out
        assert "sales: local from salescopy" in out and "books: remote" in out
        assert out.count("SwitchUnion (guard=") == 2
        # SQLAlchemy's ORM through postgresql+mtcache (its connect-time queries are remote)
        orm = out[out.index("SQLAlchemy ORM") :]
        assert "1 rows: ('Author 4', 'Madison')" in orm and "authors: local from authorcopy" in orm
        assert (
            "counters: budget_overruns 0, completeness_misses 0, consistency_misses 0, "
            "currency_misses 0, deferred_admissions 0, evictions 0, hits 6, memo_hits 0, "
            "memo_misses 4, presence_misses 2, remote 6, timeline_misses 0"
        ) in out
        assert (home / "demo.duckdb").exists() and not (home / "cache.duckdb").exists()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_statement_too_long_for_an_argument_is_read_from_stdin(mtcache_bin: str) -> None:
    """`-` reads the statement from standard input (Linux caps one argument at 128 KiB)."""
    keys = ", ".join(str(k) for k in range(40_000))
    sql = f"SELECT o.id FROM orders o WHERE o.id IN ({keys}) CURRENCY BOUND 1 MIN ON (o)"
    assert len(sql) > 128 * 1024
    result = subprocess.run(
        [mtcache_bin, "parse", "--json", "-"],
        input=sql,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["sql"] == f"SELECT o.id FROM orders AS o WHERE o.id IN ({keys})"
    assert document["clauses"] == [
        {"block": 0, "specs": [{"bound_seconds": 60.0, "on": ["o"], "by": []}]}
    ]


def test_the_duckdb_memory_limit_and_threads_of_a_command(
    mtcache_bin: str, bookstore_dsn: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """``--memory-limit``/``--threads`` (or MTCACHE_MEMORY_LIMIT/MTCACHE_THREADS) bound the
    cache file's DuckDB in the command's process: status shows them; a value DuckDB cannot
    take is one line on stderr, exit 1."""
    import json

    clean_env["MTCACHE_BACKEND"] = bookstore_dsn
    clean_env["MTCACHE_CACHE"] = str(tmp_path / "cache.duckdb")
    assert run(mtcache_bin, "init", env=clean_env).returncode == 0
    shown = run(
        mtcache_bin, "--memory-limit", "300MB", "--threads", "1", "status", "--json", env=clean_env
    )
    assert shown.returncode == 0, shown.stderr
    resources = json.loads(shown.stdout)["resources"]
    assert (resources["memory_limit"], resources["threads"]) == ("286.1 MiB", 1)
    clean_env["MTCACHE_THREADS"] = "1"
    text = run(mtcache_bin, "status", env=clean_env)
    assert text.returncode == 0 and "resources: DuckDB memory" in text.stdout
    assert "1 thread;" in text.stdout
    assert "budget: data 0 bytes, no cache_size_limit" in text.stdout
    limited = run(mtcache_bin, "--cache-size-limit", "5MB", "status", env=clean_env)
    assert "budget: data 0 bytes of 5,000,000 (cache_size_limit)" in limited.stdout
    for args, env, words in (
        (("--memory-limit", "lots"), {}, "DuckDB cannot take 'lots'"),
        ((), {"MTCACHE_THREADS": "many"}, "MTCACHE_THREADS must be a number"),
        ((), {"MTCACHE_CACHE_SIZE_LIMIT": "huge"}, "cache_size_limit must be a size"),
    ):
        failed = run(mtcache_bin, *args, "status", env={**clean_env, **env})
        assert failed.returncode == 1 and len(failed.stderr.splitlines()) == 1
        assert words in failed.stderr
