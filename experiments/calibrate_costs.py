"""The measurements behind the optimizer's cost constants (optimizer/rules/estimate_cost.py).

    python -m experiments.calibrate_costs [--sf 1] [--backend DSN] [--no-tpch]

On TPC-H customer (with the dissertation's secondary index on c_acctbal) and orders: for each
query, PostgreSQL's own cost estimate and its measured time (microseconds per cost unit), and
the time DuckDB takes for the same query on a cached copy (nanoseconds per row scanned). Then
the 22 TPC-H queries with every table cached (as in experiments/bench_tpch.py): per query
PostgreSQL's estimate and time, the time of the cache's own local statement run by DuckDB and
the rows the cost model says it scans, and their ratio: the PostgreSQL cost units one
scanned row is worth (``LOCAL_ROW_COST``; the median over the queries is the constant), and
what decoding one text value costs (``LOCAL_TEXT_COST``: a selective range with and without
``c_name``). Last,
the time to move backend rows into DuckDB through Arrow (microseconds per row). Medians of
warm repetitions; compare the columns of one run, not numbers across runs. Rows are appended
to experiments/results/calibrate_costs.csv with their provenance.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import psycopg
from rich.console import Console
from rich.table import Table

import cache
from cache.backend.copy_arrow import copy_to_arrow
from cache.backend.describe import describe_result
from cache.backend.estimates import backend_estimates
from experiments import tpch
from experiments.provenance import append_rows
from experiments.tpch_queries import QUERIES, query
from optimizer.analysis.analyze import analyze
from optimizer.plan import PlanInputs
from optimizer.planner import plan_query
from optimizer.rules.estimate_cost import LOCAL_ROW_COST, LOCAL_TEXT_COST, scanned_rows

CUSTOMER = [
    ("c_custkey", "INTEGER"),
    ("c_name", "VARCHAR"),
    ("c_nationkey", "INTEGER"),
    ("c_acctbal", "DECIMAL(15,2)"),
]
ORDERS = [
    ("o_custkey", "INTEGER"),
    ("o_orderkey", "INTEGER"),
    ("o_totalprice", "DECIMAL(15,2)"),
    ("o_orderdate", "DATE"),
    ("o_orderstatus", "VARCHAR"),
]
SCANS = [
    ("point on the key", "SELECT c_name FROM customer WHERE c_custkey = 77", 300),
    (
        "range, ~40 rows",
        "SELECT c_custkey, c_name FROM customer WHERE c_acctbal BETWEEN 1000 AND 1003",
        200,
    ),
    # the same without the text column: the difference is decoding c_name (LOCAL_TEXT_COST)
    (
        "range, ~40 rows, no text",
        "SELECT c_custkey FROM customer WHERE c_acctbal BETWEEN 1000 AND 1003",
        200,
    ),
    (
        "range, ~1.3k rows",
        "SELECT c_custkey, c_name FROM customer WHERE c_acctbal BETWEEN 1000 AND 1100",
        50,
    ),
    (
        "range, ~14k rows",
        "SELECT c_custkey, c_name FROM customer WHERE c_acctbal BETWEEN 1000 AND 2000",
        20,
    ),
    ("count customer", "SELECT count(*) FROM customer WHERE c_acctbal > 0", 20),
    (
        "orders by status",
        "SELECT o_orderstatus, count(*), sum(o_totalprice) FROM orders GROUP BY 1",
        5,
    ),
    (
        "orders of a year",
        "SELECT sum(o_totalprice) FROM orders WHERE o_orderdate >= "
        "DATE '1994-01-01' AND o_orderdate < DATE '1995-01-01'",
        5,
    ),
]


def median_ms(action: Callable[[], object], repeat: int) -> float:
    action()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e3


def pg_cost(dsn: str, sql: str) -> float:
    """PostgreSQL's total cost estimate of a statement, as the planner gets it."""
    return backend_estimates(dsn, [(sql, None)])[sql][0]


def tpch_queries(dsn: str, scale: float, console: Console) -> list[dict[str, object]]:
    """Per TPC-H query: PostgreSQL's cost and time, the cache's local statement's time and
    scanned rows (whatever the cost model would choose: the guarded plan is made without
    estimates), and the cost units per scanned row that would make the model exact."""
    tpch.load(dsn, scale, list(tpch.TABLES))
    tpch.add_indexes(dsn)
    work = Path(tempfile.mkdtemp(prefix="mtcache-calibrate-tpch-"))
    conn = cache.connect(
        backend=dsn,
        cache_path=work / "cache.duckdb",
        admit_on_miss=False,
        background=False,
        currency_bound="10 min",
        result_memo_bytes=0,
    )
    pg = psycopg.connect(dsn, autocommit=True)
    try:
        console.print(f"caching every TPC-H table at SF {scale} ...")
        tpch.cache_every_table(conn)
        store, planner = conn.engine.store, conn.session.planner
        schema = store.load_schema()
        view_rows = store.row_counts(schema.views)
        duck = store.con.cursor()
        table = Table(title=f"Local statements vs PostgreSQL, TPC-H SF {scale}")
        for column in (
            "query",
            "pg cost",
            "pg ms",
            "us/cost",
            "duckdb ms",
            "rows scanned",
            "ns/row",
            "cost/row",
        ):
            table.add_column(column)
        results: list[dict[str, object]] = []
        skipped: list[str] = []
        for number in QUERIES:
            sql = query(number, scale)
            statement = conn.engine.statements.parse(sql)
            analysis = analyze(statement, planner.catalog, conn.currency_bound)  # type: ignore[arg-type]
            described = describe_result(dsn, sql, None)  # the types the cache's divisions need
            types = tuple(oid for oid, _ in described.types) if described else None
            plan = plan_query(
                analysis,
                PlanInputs(schema, planner.catalog, None, planner.delay, types),
                with_params=False,
            )
            if plan.local_sql is None:
                table.add_row(f"Q{number}", "-", "-", "-", "-", "-", "-", "remote")
                skipped.append(f"Q{number}: {plan.reason}")
                continue
            scanned = sum(
                scanned_rows(a.access, schema.views[a.guards[0].view], view_rows)
                for a in plan.guarded_accesses
            )
            cost = pg_cost(dsn, sql)
            pg_ms = median_ms(lambda s=sql: pg.execute(s).fetchall(), 3)  # type: ignore[misc]
            duck_ms = median_ms(lambda s=plan.local_sql: duck.execute(s).fetchall(), 3)  # type: ignore[misc]
            per_cost, per_row = pg_ms / cost * 1e3, duck_ms / scanned * 1e6
            units = per_row / 1e3 / per_cost  # PostgreSQL cost units worth one scanned row
            results.append(
                {
                    "measure": f"TPC-H Q{number}",
                    "pg_cost": cost,
                    "pg_ms": round(pg_ms, 4),
                    "us_per_cost": round(per_cost, 3),
                    "duckdb_ms": round(duck_ms, 4),
                    "rows_scanned": scanned,
                    "ns_per_row": round(per_row, 2),
                    "cost_per_row": round(units, 6),
                }
            )
            table.add_row(
                f"Q{number}",
                f"{cost:.0f}",
                f"{pg_ms:.1f}",
                f"{per_cost:.1f}",
                f"{duck_ms:.1f}",
                f"{scanned:.0f}",
                f"{per_row:.1f}",
                f"{units:.5f}",
            )
        console.print(table)
        for line in skipped:
            console.print(f"  not measured: {line}")
        ratios = [float(r["cost_per_row"]) for r in results]  # type: ignore[arg-type]
        if ratios:
            quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
            console.print(
                f"cost units per scanned row over {len(ratios)} queries: median "
                f"{statistics.median(ratios):.5f} (quartiles {quartiles[0]:.5f} .. "
                f"{quartiles[2]:.5f}); LOCAL_ROW_COST is {LOCAL_ROW_COST}"
            )
        return results
    finally:
        pg.close()
        conn.close()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sf", type=float, default=1.0)
    parser.add_argument("--backend")
    parser.add_argument(
        "--no-tpch", action="store_true", help="skip the 22 TPC-H queries (they cache every table)"
    )
    args = parser.parse_args(argv)
    console = Console()
    dsn = tpch.backend(args.backend)
    tpch.load(dsn, args.sf, ["customer", "orders"])
    work = Path(tempfile.mkdtemp(prefix="mtcache-calibrate-"))
    pg = psycopg.connect(dsn, autocommit=True)
    try:
        pg.execute("CREATE INDEX IF NOT EXISTS customer_acctbal ON customer (c_acctbal)")
        pg.execute("ANALYZE customer")
        pg.execute("ANALYZE orders")
        duck = duckdb.connect(str(work / "copy.duckdb"))
        for name, columns in (("customer", CUSTOMER), ("orders", ORDERS)):
            arrow = copy_to_arrow(
                pg, f"SELECT {', '.join(c for c, _ in columns)} FROM {name}", columns
            )
            duck.register("incoming", arrow)
            duck.execute(f"CREATE TABLE {name} AS SELECT * FROM incoming")
            duck.unregister("incoming")
        results: list[dict[str, object]] = []
        table = Table(title=f"Cost calibration, TPC-H SF {args.sf}")
        for column in (
            "query",
            "pg cost",
            "pg ms",
            "us/cost",
            "duckdb ms",
            "rows scanned",
            "ns/row",
        ):
            table.add_column(column)
        duck_times: dict[str, float] = {}
        unit_times: list[float] = []
        customers = int(duck.execute("SELECT count(*) FROM customer").fetchall()[0][0])
        for label, sql, repeat in SCANS:
            cost = pg_cost(dsn, sql)
            pg_ms = median_ms(lambda s=sql: pg.execute(s).fetchall(), repeat)  # type: ignore[misc]
            duck_ms = median_ms(lambda s=sql: duck.execute(s).fetchall(), repeat)  # type: ignore[misc]
            scanned = duck.execute(
                f"SELECT count(*) FROM {'orders' if 'orders' in sql else 'customer'}"
            ).fetchall()[0][0]
            per_cost, per_row = pg_ms / cost * 1e3, duck_ms / scanned * 1e6
            duck_times[label] = duck_ms
            unit_times.append(per_cost)
            results.append(
                {
                    "measure": label,
                    "pg_cost": cost,
                    "pg_ms": round(pg_ms, 4),
                    "us_per_cost": round(per_cost, 3),
                    "duckdb_ms": round(duck_ms, 4),
                    "rows_scanned": scanned,
                    "ns_per_row": round(per_row, 2),
                }
            )
            table.add_row(
                label,
                f"{cost:.1f}",
                f"{pg_ms:.3f}",
                f"{per_cost:.2f}",
                f"{duck_ms:.3f}",
                str(scanned),
                f"{per_row:.1f}",
            )
        console.print(table)
        decode_ns = (
            (duck_times["range, ~40 rows"] - duck_times["range, ~40 rows, no text"])
            * 1e6
            / customers
        )
        per_unit = statistics.median(unit_times)
        units = decode_ns / 1e3 / per_unit
        console.print(
            f"decoding a text value: {decode_ns:.1f} ns, {units:.4f} PostgreSQL "
            f"units at its median {per_unit:.2f} us per unit; "
            f"LOCAL_TEXT_COST is {LOCAL_TEXT_COST}"
        )
        moves = Table(title="Moving backend rows into DuckDB (COPY -> Arrow)")
        for column in ("rows", "ms", "us/row"):
            moves.add_column(column)
        for rows in (1_000, 10_000, 100_000):
            sql = f"SELECT c_custkey, c_name FROM customer WHERE c_custkey <= {rows}"
            ms = median_ms(lambda s=sql: copy_to_arrow(pg, s, CUSTOMER[:2]), 5)  # type: ignore[misc]
            moves.add_row(str(rows), f"{ms:.2f}", f"{ms / rows * 1e3:.3f}")
            results.append(
                {
                    "measure": f"copy {rows} rows to arrow",
                    "copy_ms": round(ms, 3),
                    "us_per_row": round(ms / rows * 1e3, 3),
                }
            )
        console.print(moves)
        if not args.no_tpch:
            results.extend(tpch_queries(dsn, args.sf, console))
        keys = list(dict.fromkeys(k for row in results for k in row))  # one header for all
        path = append_rows(
            "calibrate_costs",
            [
                {
                    "experiment": "calibrate_costs",
                    "scale_factor": args.sf,
                    **{k: row.get(k) for k in keys},
                }
                for row in results
            ],
        )
        console.print(f"results appended to {path}")
    finally:
        pg.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
