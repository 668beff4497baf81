"""The command line under bad input (issue 10's table): one line on stderr naming what to do,
exit 1, never a traceback - or the right result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cache.maintenance.spark import descendants
from cache.tools import bookstore

SCHEMA = bookstore.CACHE_SCHEMA_FILE


@pytest.fixture
def env(bookstore_dsn: str, tmp_path: Path) -> dict[str, str]:
    return cli_environment(bookstore_dsn, tmp_path)


def cli_environment(backend: str, directory: Path) -> dict[str, str]:
    """The environment of a command on ``backend`` with a cache file in ``directory``."""
    return {
        **os.environ,
        "MTCACHE_BACKEND": backend,
        "MTCACHE_CACHE": str(directory / "cli.duckdb"),
    }


def run(
    mtcache_bin: str, env: dict[str, str], *args: str | bytes
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [mtcache_bin, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("mtcache: "), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("command", ["query", "parse", "explain"])
def test_a_statement_that_is_not_utf8(mtcache_bin: str, env: dict[str, str], command: str) -> None:
    result = run(mtcache_bin, env, command, b"SELECT \xff\xfe 1 CURRENCY BOUND 1 MIN")
    one_line_error(result, "not valid UTF-8", "byte 0xff at offset 7")


def test_a_spark_master_that_is_no_url_or_does_not_answer(
    mtcache_bin: str, env: dict[str, str]
) -> None:
    """Refused at once, whichever engine would pull, the cache file unchanged."""
    assert run(mtcache_bin, env, "ddl", str(SCHEMA)).returncode == 0
    assert run(mtcache_bin, env, "admit", "authorlist_pct", "2").returncode == 0
    before = regions(mtcache_bin, env)
    result = run(mtcache_bin, env, "--spark-master", "spark//x", "refresh")
    one_line_error(result, "ProgrammingError", "unknown Spark master 'spark//x'", "sc://HOST")
    result = run(
        mtcache_bin, env, "refresh", "--engine", "spark", "--spark-master", "spark://127.0.0.1:1"
    )
    one_line_error(result, "OperationalError", "no Spark master answers at spark://127.0.0.1:1")
    assert regions(mtcache_bin, env) == before


def test_a_backend_that_is_not_a_dsn(mtcache_bin: str, env: dict[str, str]) -> None:
    result = run(mtcache_bin, env, "--backend", "this is not a dsn", "query", "SELECT 1")
    one_line_error(result, "InterfaceError", "--backend", "this is not a dsn")


@pytest.mark.parametrize(
    "path", ["/proc/nowhere/cache.duckdb", "/proc/cache.duckdb", "/sys/cache.duckdb"]
)
@pytest.mark.parametrize(
    "command", [("init",), ("query", "SELECT 1"), ("ddl", str(SCHEMA)), ("status",)]
)
def test_a_cache_file_that_cannot_be_created(
    mtcache_bin: str, env: dict[str, str], path: str, command: tuple[str, ...]
) -> None:
    one_line_error(run(mtcache_bin, env, "--cache", path, *command), path)


def test_a_corrupt_cache_file(mtcache_bin: str, env: dict[str, str]) -> None:
    assert run(mtcache_bin, env, "ddl", str(SCHEMA)).returncode == 0
    assert run(mtcache_bin, env, "admit", "authorlist_pct", "2").returncode == 0
    path = Path(env["MTCACHE_CACHE"])
    data = bytearray(path.read_bytes())
    for offset in range(8192, len(data), 262144):  # a byte in every block after the headers
        data[offset + 100 : offset + 164] = os.urandom(64)
    path.write_bytes(bytes(data))
    failed = 0
    for command in (
        ("query", "SELECT name FROM authors a WHERE a.authorid = 2 CURRENCY BOUND 10 MIN"),
        ("admit", "authorlist_pct", "4"),
        ("status",),
    ):
        result = run(mtcache_bin, env, *command)
        if result.returncode != 0:
            one_line_error(result, f"the cache file {path} is damaged", "move it aside")
            failed += 1
    assert failed, "the damage went unnoticed: damage more of the file"


def test_output_into_a_closed_pipe(mtcache_bin: str, env: dict[str, str]) -> None:
    """`mtcache status | head -1`: the reader goes away; no traceback."""
    assert run(mtcache_bin, env, "ddl", str(SCHEMA)).returncode == 0
    process = subprocess.Popen(
        [mtcache_bin, "status"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before the command has written anything
    error = process.stderr.read().decode()
    process.stderr.close()
    assert process.wait(timeout=120) == 1
    assert error == ""


@pytest.mark.parametrize("clause", ["1e400 SEC", "1e306 DAY", "1e400 MS"])
def test_a_bound_too_large_to_hold(mtcache_bin: str, env: dict[str, str], clause: str) -> None:
    result = run(
        mtcache_bin, env, "parse", "--json", f"SELECT a.name FROM authors a CURRENCY BOUND {clause}"
    )
    one_line_error(result, "SqlSyntaxError", "line 1, column 45", "too large")


def test_json_output_is_json_for_every_bound(mtcache_bin: str, env: dict[str, str]) -> None:
    result = run(
        mtcache_bin, env, "parse", "--json", "SELECT a.name FROM authors a CURRENCY BOUND 1e300 SEC"
    )
    assert result.returncode == 0, result.stderr
    bound = json.loads(result.stdout)["clauses"][0]["specs"][0]["bound_seconds"]
    assert bound == 1e300


@pytest.mark.parametrize("sql", ["", ";", "  ;  ; ", "-- nothing"])
def test_an_empty_statement(mtcache_bin: str, env: dict[str, str], sql: str) -> None:
    one_line_error(run(mtcache_bin, env, "query", sql), "empty statement")


@pytest.mark.parametrize("command", ["query", "parse", "explain"])
def test_a_nul_byte_on_standard_input_is_refused_at_it(
    mtcache_bin: str, env: dict[str, str], command: str
) -> None:
    """libpq would send the backend the text up to it (``column "name" does not exist``)."""
    done = subprocess.run(
        [mtcache_bin, command, "-"],
        input="SELECT 'a\0b' AS name",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    one_line_error(done, "line 1, column 10", "holds a NUL byte")


@pytest.mark.parametrize("sql", ["hello", "hello world"])
def test_a_word_alone_is_no_statement(mtcache_bin: str, env: dict[str, str], sql: str) -> None:
    one_line_error(run(mtcache_bin, env, "parse", sql), "'hello' does not begin a statement")


def test_a_misspelled_keyword_is_pointed_at(mtcache_bin: str, env: dict[str, str]) -> None:
    result = run(mtcache_bin, env, "query", "SELCT name FROM authors CURRENCY BOUND 10 MIN")
    one_line_error(result, "line 1, column 1: 'SELCT' does not begin a statement")


def test_query_json_is_faithful_for_every_type(
    mtcache_bin: str, env: dict[str, str], bookstore_dsn: str
) -> None:
    """docs/json-outputs.md: decimals and dates as strings; json as JSON; intervals as ISO 8601
    durations; bytea as PostgreSQL's hex text; floats that JSON cannot hold as PostgreSQL
    prints them."""
    import psycopg

    with psycopg.connect(bookstore_dsn, autocommit=True) as pg:
        pg.execute("DROP TABLE IF EXISTS odd")
        pg.execute(
            'CREATE TABLE odd AS SELECT 1 AS id, \'{"a": 1, "b": [true, null]}\'::json AS j, '
            "'[1, \"x\"]'::jsonb AS jb, interval '1 day 2 hours 3.5 seconds' AS i, "
            "interval '-1 second' AS neg, '\\x78ff'::bytea AS b, 1.50::numeric(5,2) AS n, "
            "date '2024-02-29' AS d, 'NaN'::float8 AS nan, '-Infinity'::float8 AS inf, "
            "ARRAY[1, 2] AS arr, '00000000-0000-0000-0000-000000000001'::uuid AS u"
        )
    result = run(mtcache_bin, env, "query", "--json", "SELECT * FROM odd")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    row = dict(zip(document["columns"], document["rows"][0], strict=True))
    assert row == {
        "id": 1,
        "j": {"a": 1, "b": [True, None]},
        "jb": [1, "x"],
        "i": "P1DT2H3.5S",
        "neg": "-PT1S",
        "b": "\\x78ff",
        "n": "1.50",
        "d": "2024-02-29",
        "nan": "NaN",
        "inf": "-Infinity",
        "arr": [1, 2],
        "u": "00000000-0000-0000-0000-000000000001",
    }


def regions(mtcache_bin: str, env: dict[str, str]) -> list[tuple[object, ...]]:
    """Every cached region: view, key, rows, snapshot and refresh time (not its age)."""
    status = run(mtcache_bin, env, "status", "--json")
    assert status.returncode == 0, status.stderr
    return [
        (v["name"], v["rows"], r["key"], r["rows"], r["snapshot_id"], r["refreshed_at"])
        for v in json.loads(status.stdout)["views"]
        for r in v["regions"]
    ]


@pytest.mark.parametrize("when", ["starting the JVM", "running a Spark task"])
def test_ctrl_c_during_a_spark_refresh(mtcache_bin: str, env: dict[str, str], when: str) -> None:
    """Ctrl-C stops a Spark refresh at once, whatever it is doing: exit 130, one line, no
    traceback (py4j's included), the cache as it was."""
    interrupt_a_spark_refresh(mtcache_bin, env, when)


def interrupt_a_spark_refresh(
    mtcache_bin: str, env: dict[str, str], when: str, *options: str
) -> None:
    """Ctrl-C a ``refresh --engine spark`` (with ``options`` before the command: a
    ``--spark-master``) while it starts its JVM or while its task runs; it must end at once
    with exit 130 and one line, the cache unchanged."""
    assert run(mtcache_bin, env, "ddl", str(SCHEMA)).returncode == 0
    assert run(mtcache_bin, env, "admit", "authorlist_pct", "2").returncode == 0
    before = regions(mtcache_bin, env)
    mark = Path(env["MTCACHE_CACHE"]).parent / "stalled"
    stalled = {**env, "MTCACHE_FAULTS": "task:stall", "MTCACHE_FAULT_MARK": str(mark)}
    # SIGINT handled as under a terminal (a shell's background job, such as CI's, would start
    # the test run with it ignored, and an ignored signal stays ignored across exec)
    default_sigint = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            default_sigint,
            mtcache_bin,
            *options,
            "refresh",
            "--engine",
            "spark",
        ],
        env=stalled,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 180  # (a JVM, or a cluster's executors, to start)
        if when == "starting the JVM":
            while not any("java" in c for _, c in descendants(proc.pid)):
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
        else:
            while not mark.exists():  # the task is running: it stalls
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        # the task stalls for a minute: an exit before is the interrupt's doing
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "ERROR" not in err, err
    ours = [line for line in err.splitlines() if line.startswith("mtcache:")]
    assert ours == ["mtcache: interrupted"], err
    assert err.strip().splitlines()[-1] == "mtcache: interrupted"
    assert regions(mtcache_bin, env) == before
