"""The 22 TPC-H queries with every table cached (issue 9's figure).

    python -m experiments.bench_tpch [--sf 1] [--runs 3] [--backend DSN] [--queries 1,3,6]

Every TPC-H table is cached as a fully materialized view, refreshed before the run; the
connection has a session currency bound of 10 min and its result memo off, so DuckDB computes
every local answer. Per query: each answer is checked against PostgreSQL's (values and Python
types) first; then the cache, PostgreSQL (psycopg) and DuckDB running the plan's own local
statement directly on the cache file (the physical limit of a local answer) are timed in
rotation, ``runs`` times each (medians). Printed and appended to results/bench_tpch.csv: the
route, the speedup over PostgreSQL, the ratio to DuckDB direct (target <= 1.1x), and the
geometric means over the queries answered locally.

The backend gets the secondary indexes TPC-H implementations usually add (foreign keys,
`experiments.tpch.INDEXES`), so that PostgreSQL runs the correlated subqueries of Q2, Q17 and
Q20 by index.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

import cache
from experiments import tpch
from experiments.provenance import append_rows
from experiments.tpch_queries import QUERIES, query


def typed(rows: list[tuple[object, ...]]) -> list[tuple[tuple[str, str], ...]]:
    return [tuple((type(v).__name__, repr(v)) for v in row) for row in rows]


def rotated(actions: list[Callable[[], object] | None], runs: int) -> list[float | None]:
    """Median seconds of each action, run in rotation (the order shifts every round)."""
    samples: list[list[float]] = [[] for _ in actions]
    for round_ in range(runs):
        for offset in range(len(actions)):
            which = (round_ + offset) % len(actions)
            action = actions[which]
            if action is None:
                continue
            started = time.perf_counter()
            action()
            samples[which].append(time.perf_counter() - started)
    return [statistics.median(s) if s else None for s in samples]


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def measure(
    dsn: str,
    sf: float,
    runs: int,
    numbers: list[int],
    on_step: Callable[[str, dict[str, object] | None], None] | None = None,
) -> tuple[list[dict[str, object]], dict[str, float]]:
    """Cache every table (a fresh cache file), check and time ``numbers``: one row per query
    (route, medians of the cache, PostgreSQL and DuckDB direct, speedup, ratio, reason) and
    the geometric means. ``on_step`` is told of each step done: "loaded", "cached", then each
    query with its row."""
    step = on_step or (lambda label, row: None)
    tpch.load(dsn, sf, list(tpch.TABLES))
    tpch.add_indexes(dsn)
    step("loaded", None)
    work = Path(tempfile.mkdtemp(prefix="mtcache-bench-tpch-"))
    conn = cache.connect(
        backend=dsn,
        cache_path=work / "cache.duckdb",
        admit_on_miss=False,
        background=False,
        currency_bound="10 min",
        result_memo_bytes=0,
    )
    raw = psycopg.connect(dsn)  # the same transaction mode as the DB-API connection
    try:
        tpch.cache_every_table(conn)
        step("cached", None)
        duck = conn.engine.store.con.cursor()  # the cache file, as the executor reads it
        cur = conn.cursor()
        rows: list[dict[str, object]] = []
        for number in numbers:
            sql = query(number, sf)
            cur.execute(sql)
            got = cur.fetchall()
            want = raw.execute(sql).fetchall()
            raw.rollback()
            assert typed(got) == typed(want), f"Q{number}: the cache's answer differs"
            routes = {p["route"] for p in cur.provenance}
            route = "local" if routes == {"local"} else "mixed" if "local" in routes else "remote"
            local_sql = cur.plan.local_sql if cur.plan is not None and route == "local" else None

            def via_cache(s: str = sql) -> object:
                return cur.execute(s).fetchall()

            def via_pg(s: str = sql) -> object:
                result = raw.execute(s).fetchall()
                raw.rollback()
                return result

            direct = (lambda s=local_sql: duck.execute(s).fetchall()) if local_sql else None
            cache_s, pg_s, duck_s = rotated([via_cache, via_pg, direct], runs)
            assert cache_s is not None and pg_s is not None
            row: dict[str, object] = {
                "query": f"Q{number}",
                "route": route,
                "cache_s": cache_s,
                "postgres_s": pg_s,
                "duckdb_s": duck_s,
                "speedup": pg_s / cache_s,
                "ratio_vs_duckdb": cache_s / duck_s if duck_s else None,
                "reason": ""
                if route == "local"
                else (cur.plan.reason or "")
                if cur.plan is not None
                else "",
            }
            rows.append(row)
            step(f"Q{number}", row)
    finally:
        raw.close()
        conn.close()
        shutil.rmtree(work, ignore_errors=True)
    local = [r for r in rows if r["route"] == "local"]
    summary = {
        "queries": float(len(rows)),
        "local": float(len(local)),
        "speedup_geomean_all": geomean([float(r["speedup"]) for r in rows]),  # type: ignore[arg-type]
        "speedup_geomean_local": geomean([float(r["speedup"]) for r in local]),  # type: ignore[arg-type]
        "ratio_vs_duckdb_geomean": geomean(
            [
                float(r["ratio_vs_duckdb"])
                for r in local  # type: ignore[arg-type]
                if r["ratio_vs_duckdb"]
            ]
        ),
    }
    return rows, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sf", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--backend")
    parser.add_argument("--queries", help="comma-separated query numbers (default: all 22)")
    args = parser.parse_args(argv)
    numbers = [int(n) for n in args.queries.split(",")] if args.queries else list(QUERIES)
    console = Console()
    dsn = tpch.backend(args.backend)
    console.print(f"TPC-H at SF {args.sf}: loading, caching every table, then the queries ...")

    def said(label: str, row: dict[str, object] | None) -> None:
        if row is None:
            console.print(f"  {label}")
            return
        console.print(
            f"  {label}: {row['route']}, {float(row['cache_s']) * 1e3:.1f} ms vs "  # type: ignore[arg-type]
            f"PostgreSQL {float(row['postgres_s']) * 1e3:.1f} ms"
        )  # type: ignore[arg-type]

    rows, summary = measure(dsn, args.sf, args.runs, numbers, said)
    table = Table(
        title=f"TPC-H SF {args.sf}, every table cached, session bound 10 min "
        f"(medians of {args.runs})"
    )
    for column in (
        "query",
        "route",
        "cache ms",
        "PostgreSQL ms",
        "DuckDB ms",
        "speedup",
        "vs DuckDB",
    ):
        table.add_column(column)
    for r in rows:
        table.add_row(
            str(r["query"]),
            str(r["route"]),
            f"{float(r['cache_s']) * 1e3:.1f}",  # type: ignore[arg-type]
            f"{float(r['postgres_s']) * 1e3:.1f}",  # type: ignore[arg-type]
            f"{float(r['duckdb_s']) * 1e3:.1f}" if r["duckdb_s"] else "-",  # type: ignore[arg-type]
            f"{float(r['speedup']):.1f}x",  # type: ignore[arg-type]
            f"{float(r['ratio_vs_duckdb']):.2f}x" if r["ratio_vs_duckdb"] else "-",
        )  # type: ignore[arg-type]
    console.print(table)
    console.print(
        f"{summary['local']:.0f}/{summary['queries']:.0f} answered locally; speedup over "
        f"PostgreSQL: geomean {summary['speedup_geomean_all']:.1f}x (all), "
        f"{summary['speedup_geomean_local']:.1f}x (local); cache vs DuckDB direct: "
        f"geomean {summary['ratio_vs_duckdb_geomean']:.2f}x (target <= 1.1x)"
    )
    path = append_rows(
        "bench_tpch",
        [
            {
                "experiment": "bench_tpch",
                "scale_factor": args.sf,
                "runs": args.runs,
                **{k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()},
            }
            for r in [
                *rows,
                {
                    "query": "geomean",
                    "route": f"{summary['local']:.0f} local",
                    "speedup": summary["speedup_geomean_all"],
                    "ratio_vs_duckdb": summary["ratio_vs_duckdb_geomean"],
                },
            ]
        ],
    )
    console.print(f"results appended to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
