"""Refresh pipeline throughput: pull a TPC-H orders view with each engine against a baseline.

    python -m experiments.bench_refresh [--sf 1] [--runs 3] [--backend DSN]

Baseline: one ``COPY (SELECT ...) TO STDOUT`` streamed into DuckDB through Arrow, into a table
identical to the cached view's (same columns, same primary key): the raw transfer with none of
the cache's machinery. Engines: a full refresh of the fully materialized view ``orders_copy``
into an empty cache file (one backend snapshot, closure, one DuckDB transaction, region
bookkeeping), inline and on Spark with a warm session. Methods are interleaved run by run and
compared by their medians measured in this one run; the ratios go to the console and, with
provenance, to experiments/results/bench_refresh.csv.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from cache.backend.copy_arrow import copy_to_arrow
from cache.backend.reflect import connect_backend, fetch_catalog
from cache.maintenance.engines import InlineEngine
from cache.maintenance.pipeline import Maintainer
from cache.maintenance.spark import SparkEngine, spark_session, stop_sessions
from cache.store.cache_file import CacheStore
from control_tables.types import select_list
from experiments import tpch
from experiments.provenance import append_rows
from sql_ext import parse

VIEW = "CREATE CACHED VIEW orders_copy AS SELECT * FROM orders"


def fresh_store(work: Path, dsn: str, name: str) -> CacheStore:
    path = work / f"{name}.duckdb"
    for leftover in work.glob(f"{name}.duckdb*"):
        leftover.unlink()
    store = CacheStore(path)
    store.save_catalog(fetch_catalog(dsn))
    store.apply_ddl(parse(VIEW), store.load_catalog())
    return store


def timed(action: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    rows = action()
    return time.perf_counter() - started, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per method (default 3)")
    parser.add_argument("--backend", help="PostgreSQL DSN (default: the embedded cluster)")
    args = parser.parse_args(argv)
    console = Console()

    dsn = tpch.backend(args.backend)
    console.print(f"loading TPC-H orders at SF {args.sf} ...")
    rows = tpch.load(dsn, args.sf, ["orders"])["orders"]
    work = Path(tempfile.mkdtemp(prefix="mtcache-bench-"))
    console.print(f"{rows} rows; warming the Spark session ...")
    spark_session()

    def baseline() -> int:
        store = fresh_store(work, dsn, "baseline")
        view = store.load_schema().views["orders_copy"]
        types = {r[0]: r[1] for r in store.con.execute("DESCRIBE orders_copy").fetchall()}
        columns = [(c, types[c]) for c in view.columns]
        started = time.perf_counter()
        with connect_backend(dsn) as conn:
            table = copy_to_arrow(conn, f"SELECT {select_list(columns)} FROM orders", columns)
        store.con.register("incoming", table)
        store.con.execute("INSERT INTO orders_copy SELECT * FROM incoming")
        elapsed = time.perf_counter() - started
        store.close()
        return int(elapsed * 1e9)

    def engine_run(engine: object, name: str) -> Callable[[], int]:
        def run() -> int:
            store = fresh_store(work, dsn, name)
            started = time.perf_counter()
            Maintainer(store, dsn, engine).refresh("orders_copy")  # type: ignore[arg-type]
            elapsed = time.perf_counter() - started
            count = store.con.execute("SELECT count(*) FROM orders_copy").fetchone()
            store.close()
            assert count is not None and count[0] == rows, "the view must hold every row"
            return int(elapsed * 1e9)

        return run

    methods = {
        "baseline (COPY -> Arrow -> DuckDB)": baseline,
        "inline engine": engine_run(InlineEngine(), "inline"),
        "spark engine (warm session)": engine_run(SparkEngine(), "spark"),
    }
    for method in methods.values():  # warm-up: page cache, JIT of the Python workers
        method()
    samples: dict[str, list[float]] = {name: [] for name in methods}
    for run in range(args.runs):
        for name, method in methods.items():
            samples[name].append(method() / 1e9)
        console.print(f"run {run + 1}/{args.runs} done")

    base = statistics.median(samples["baseline (COPY -> Arrow -> DuckDB)"])
    table = Table(title=f"Pulling TPC-H orders SF {args.sf} ({rows} rows), median of {args.runs}")
    for column in ("method", "median s", "ratio to baseline", "runs s"):
        table.add_column(column)
    records = []
    for name, values in samples.items():
        median = statistics.median(values)
        table.add_row(
            name, f"{median:.2f}", f"{median / base:.2f}x", " ".join(f"{v:.2f}" for v in values)
        )
        records.append(
            {
                "experiment": "bench_refresh",
                "scale_factor": args.sf,
                "rows": rows,
                "method": name,
                "median_seconds": round(median, 4),
                "ratio_to_baseline": round(median / base, 4),
                "runs": args.runs,
            }
        )
    console.print(table)
    path = append_rows("bench_refresh", records)
    console.print(f"results appended to {path}")
    stop_sessions()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
