"""How a statement's cost grows with its size (issue 10: parsing and planning must be linear).

    python -m experiments.bench_statement_size [--max-kb 1024] [--backend DSN]

Statements of the shapes applications generate - a long IN list, a long OR of equalities, a
long AND of inequalities - at sizes doubling up to ``--max-kb``, each run once through the
cache with a clause (parsed, planned, answered locally), once without one (parsed, sent to
PostgreSQL whole) and once through psycopg, side by side in one run. Each size's literals
differ, so nothing is reused from the plan cache. Printed per shape: seconds per MB at each
size and the growth factor (seconds per MB at the largest size / at the smallest): 1.0 is
linear, 2.0 would mean twice the cost per byte at the largest size. Every cached answer is
checked against PostgreSQL's.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import typing as t
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

import cache
from experiments import tpch
from experiments.provenance import append_rows

SCHEMA = """
CREATE CACHED VIEW cust_prj AS SELECT c_custkey, c_name, c_nationkey FROM customer
    REFRESH EVERY 10 MIN
"""
CLAUSE = " CURRENCY BOUND 10 MIN ON (customer)"


def statement(shape: str, size: int, salt: int) -> str:
    """A statement of about ``size`` bytes; ``salt`` makes its literals differ per run."""
    head = "SELECT c_custkey, c_name FROM customer WHERE "
    terms: list[str] = []
    length = len(head)
    i = 0
    while length < size:
        value = salt * 10_000_000 + i
        term = {"in": str(value), "or": f"c_custkey = {value}", "and": f"c_custkey <> {value}"}
        terms.append(term[shape])
        length += len(terms[-1]) + 5
        i += 1
    if shape == "in":
        where = f"c_custkey IN (1, 2, 3, {', '.join(terms)})"
    elif shape == "or":
        where = " OR ".join(["c_custkey = 1", *terms])
    else:
        where = " AND ".join(["c_custkey < 4", *terms])
    return head + where + " ORDER BY c_custkey"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-kb", type=int, default=1024)
    parser.add_argument("--backend")
    args = parser.parse_args(argv)
    console = Console()
    dsn = tpch.backend(args.backend)
    console.print("loading TPC-H customer at SF 0.01 ...")
    tpch.load(dsn, 0.01, ["customer"])
    work = Path(tempfile.mkdtemp(prefix="mtcache-bench-size-"))
    conn = cache.connect(
        backend=dsn,
        cache_path=work / "cache.duckdb",
        admit_on_miss=False,
        background=False,
        result_memo_bytes=0,
    )
    raw = psycopg.connect(dsn, autocommit=True)
    conn.autocommit = True
    sizes = []
    size = 64 * 1024
    while size <= args.max_kb * 1024:
        sizes.append(size)
        size *= 2
    rows: list[dict[str, object]] = []
    try:
        conn.execute(SCHEMA)
        conn.admin.refresh("cust_prj")
        salt = 0
        for shape in ("in", "or", "and"):
            for size in sizes:
                salt += 1
                sql = statement(shape, size, salt)
                want = raw.execute(sql).fetchall()
                timing = {}
                for path, text in (
                    ("psycopg", sql),
                    ("cache_no_clause", sql),
                    ("cache_clause", sql + CLAUSE),
                ):
                    run = raw if path == "psycopg" else conn
                    start = time.perf_counter()
                    got = run.execute(text).fetchall()
                    timing[path] = time.perf_counter() - start
                    assert got == want, f"{shape} {size}: {path}'s answer differs"
                rows.append({"shape": shape, "bytes": len(sql), **timing})
                console.print(
                    f"{shape} {len(sql) // 1024} KB: "
                    + ", ".join(f"{k} {v:.2f} s" for k, v in timing.items())
                )
    finally:
        conn.close()
        raw.close()
        shutil.rmtree(work, ignore_errors=True)
    table = Table(title="seconds per MB of statement (growth: largest size / smallest)")
    table.add_column("shape")
    table.add_column("path")
    for size in sizes:
        table.add_column(f"{size // 1024} KB", justify="right")
    table.add_column("growth", justify="right")
    for shape in ("in", "or", "and"):
        mine = [r for r in rows if r["shape"] == shape]
        for path in ("cache_clause", "cache_no_clause", "psycopg"):
            per_mb = [t.cast(float, r[path]) / (t.cast(int, r["bytes"]) / 2**20) for r in mine]
            growth = per_mb[-1] / per_mb[0]
            table.add_row(shape, path, *(f"{v:.2f}" for v in per_mb), f"{growth:.2f}")
    console.print(table)
    append_rows("bench_statement_size", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
