"""The bounds drive the work (issue 56): `REFRESH AUTO` against fixed `REFRESH EVERY` intervals,
and `mtcache advise --apply` on a cache with no schema.

    python -m experiments.bench_bounds [--sf 0.01] [--seconds 600] [--advice-seconds 120]
        [--seed 56] [--backend DSN]

Part 1, side by side in one run: the same workload goes to five caches at once (each query is
sent to every cache in turn): one per fixed interval of the sweep {5 s, 30 s, 2 min, 10 min},
every view kept `REFRESH EVERY` it, and one with every view `REFRESH AUTO`. The views hold
TPC-H's customer, orders, part and supplier whole; the workload is point and range shapes over
them, each shape's bound drawn (seeded) from {5 s, 30 s, 2 min, 10 min}, keys Zipf (s = 1.1),
while a writer updates orders and customer at the backend. Each cache's refresh scheduler runs
as deployed, in its own thread. Per cache: the share of queries answered locally, the share of
their backend cost (the planner's estimate of the whole statement) answered locally, and the
rows its refreshes pulled from the backend (each refresh of a view: the rows it holds).
Target: AUTO's local share at least the best fixed interval's, with at most half its rows.

Part 2: the same workload on a cache with no schema at all for ``--advice-seconds``: the
backend answers every read and the cache counts them; then `advise --apply` (as
`mtcache advise --apply` does it) and the workload again: the share of the first run's backend
time whose statements are now answered locally. Target: at least 80%.
"""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import random
import shutil
import tempfile
import threading
import time
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

import cache
from cache.engine.advice import apply_script
from cache.maintenance.engines import InlineEngine
from cache.maintenance.scheduler import RefreshScheduler
from cache.store.cache_file import CacheStore
from experiments import tpch
from experiments.provenance import append_rows

TABLES = ("customer", "orders", "part", "supplier")
BOUNDS = (5.0, 30.0, 120.0, 600.0)
SWEEP = (5.0, 30.0, 120.0, 600.0)  # the fixed intervals
ZIPF = 1.1
WRITES_PER_SECOND = 20


@dataclass(frozen=True)
class Shape:
    sql: str  # with %s for its key
    table: str
    key: str  # the column its keys are drawn from
    bound: float = 0.0


SHAPES = (
    Shape(
        "SELECT c.c_name, c.c_acctbal FROM customer c WHERE c.c_custkey = %s",
        "customer",
        "c_custkey",
    ),
    Shape(
        "SELECT count(*), sum(c.c_acctbal) FROM customer c WHERE c.c_nationkey = %s",
        "customer",
        "c_nationkey",
    ),
    Shape(
        "SELECT o.o_totalprice, o.o_orderstatus FROM orders o WHERE o.o_orderkey = %s",
        "orders",
        "o_orderkey",
    ),
    Shape(
        "SELECT count(*), sum(o.o_totalprice) FROM orders o WHERE o.o_custkey = %s",
        "orders",
        "o_custkey",
    ),
    Shape(
        "SELECT p.p_name, p.p_retailprice FROM part p WHERE p.p_partkey = %s",
        "part",
        "p_partkey",
    ),
    Shape(
        "SELECT s.s_name, s.s_acctbal FROM supplier s WHERE s.s_suppkey = %s",
        "supplier",
        "s_suppkey",
    ),
)


@dataclass
class Cache:
    """One cache of the comparison: its connection, its scheduler and what it did."""

    name: str
    conn: t.Any
    scheduler: RefreshScheduler | None
    store: CacheStore | None
    queries: int = 0
    local: int = 0
    cost: float = 0.0
    local_cost: float = 0.0
    # per shape: calls, calls answered locally, the backend's time for the others (ms)
    calls: dict[str, int] = field(default_factory=dict)
    local_calls: dict[str, int] = field(default_factory=dict)
    backend_ms: dict[str, float] = field(default_factory=dict)


def zipf_picker(keys: list[t.Any], rng: random.Random) -> t.Callable[[], t.Any]:
    """Draw from ``keys`` with Zipf's law (s = ZIPF) over a seeded shuffle of them."""
    order = keys[:]
    rng.shuffle(order)
    weights = [1.0 / (rank + 1) ** ZIPF for rank in range(len(order))]
    total, running, cumulative = sum(weights), 0.0, []
    for weight in weights:
        running += weight
        cumulative.append(running / total)
    return lambda: order[min(bisect.bisect(cumulative, rng.random()), len(order) - 1)]


def keys_of(dsn: str) -> dict[tuple[str, str], list[t.Any]]:
    with psycopg.connect(dsn) as pg:
        return {
            (s.table, s.key): [r[0] for r in pg.execute(f"SELECT DISTINCT {s.key} FROM {s.table}")]
            for s in SHAPES
        }


def writer(
    dsn: str, stop: threading.Event, rng: random.Random, keys: dict[t.Any, list[t.Any]]
) -> None:
    """Updates orders and customer rows at the backend, WRITES_PER_SECOND a second."""
    orders, customers = keys["orders", "o_orderkey"], keys["customer", "c_custkey"]
    with psycopg.connect(dsn, autocommit=True) as pg:
        while not stop.wait(1.0 / WRITES_PER_SECOND):
            pg.execute(
                "UPDATE orders SET o_totalprice = o_totalprice + 1 WHERE o_orderkey = %s",
                (rng.choice(orders),),
            )
            pg.execute(
                "UPDATE customer SET c_acctbal = c_acctbal + 1 WHERE c_custkey = %s",
                (rng.choice(customers),),
            )


def open_cache(dsn: str, directory: Path, name: str, refresh: str | None) -> Cache:
    path = directory / f"{name}.duckdb"
    conn = cache.connect(dsn, path, autocommit=True, background=False, admit_on_miss=False)
    if refresh is None:
        return Cache(name, conn, None, None)
    conn.admin.apply_ddl(
        ";\n".join(f"CREATE CACHED VIEW {t}_copy AS SELECT * FROM {t} {refresh}" for t in TABLES)
    )
    store = CacheStore(path)
    scheduler = RefreshScheduler(store, dsn, InlineEngine(), tick=1.0)
    scheduler.start()
    return Cache(name, conn, scheduler, store)


@dataclass(frozen=True)
class Bench:
    """What both parts share: the backend, a directory for the cache files, the workload's
    shapes with their bounds, their keys and estimated costs, and the options."""

    console: Console
    dsn: str
    work: Path
    shapes: list[Shape]
    keys: dict[t.Any, list[t.Any]]
    costs: dict[str, float]
    args: argparse.Namespace


def run(caches: list[Cache], bench: Bench, seconds: float, rng: random.Random) -> None:
    """The workload for ``seconds``: a shape at random, a Zipf key, sent to every cache."""
    shapes, keys, costs = bench.shapes, bench.keys, bench.costs
    pickers = {s.sql: zipf_picker(keys[s.table, s.key], rng) for s in shapes}
    cursors = [c.conn.cursor() for c in caches]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        shape = rng.choice(shapes)
        sql = f"{shape.sql} CURRENCY BOUND {shape.bound:g} SEC"
        key = pickers[shape.sql]()
        for one, cur in zip(caches, cursors, strict=True):
            started = time.perf_counter()
            cur.execute(sql, (key,))
            cur.fetchall()
            spent = (time.perf_counter() - started) * 1000.0
            local = all(p["route"] == "local" for p in cur.provenance)
            one.queries += 1
            one.local += local
            one.cost += costs[shape.sql]
            one.local_cost += costs[shape.sql] if local else 0.0
            one.calls[shape.sql] = one.calls.get(shape.sql, 0) + 1
            if local:
                one.local_calls[shape.sql] = one.local_calls.get(shape.sql, 0) + 1
            else:
                one.backend_ms[shape.sql] = one.backend_ms.get(shape.sql, 0.0) + spent


def estimated_costs(
    dsn: str, shapes: list[Shape], keys: dict[t.Any, list[t.Any]]
) -> dict[str, float]:
    """The backend's estimate of each shape (with its first key): what a local answer saves."""
    found = {}
    with psycopg.connect(dsn) as pg:
        for shape in shapes:
            bound = psycopg.ClientCursor(pg).mogrify(shape.sql, (keys[shape.table, shape.key][0],))
            row = pg.execute(f"EXPLAIN (FORMAT JSON) {bound}").fetchone()
            found[shape.sql] = float(row[0][0]["Plan"]["Total Cost"]) if row else 0.0
    return found


def rows_pulled(one: Cache) -> int:
    """The rows the cache's scheduler pulled: per refresh of a view, the rows it holds."""
    assert one.scheduler is not None and one.store is not None
    held = {
        t: int(one.store.con.execute(f"SELECT count(*) FROM {t}_copy").fetchone()[0])  # type: ignore[index]
        for t in TABLES
    }
    return sum(
        held[r.operation.removeprefix("refresh ").removesuffix("_copy")]
        for r in one.scheduler.reports
        if r.operation.startswith("refresh ")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sf", type=float, default=0.01)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--advice-seconds", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=56)
    parser.add_argument("--backend")
    args = parser.parse_args(argv)
    console = Console()
    dsn = tpch.backend(args.backend)
    console.print(f"loading TPC-H {', '.join(TABLES)} at SF {args.sf} ...")
    tpch.load(dsn, args.sf, TABLES)
    rng = random.Random(args.seed)
    shapes = [Shape(s.sql, s.table, s.key, rng.choice(BOUNDS)) for s in SHAPES]
    keys = keys_of(dsn)
    costs = estimated_costs(dsn, shapes, keys)
    work = Path(tempfile.mkdtemp(prefix="mtcache-bounds-"))
    results: list[dict[str, t.Any]] = []
    try:
        bench = Bench(console, dsn, work, shapes, keys, costs, args)
        results += compare(bench)
        results += advise(bench)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    append_rows("bench_bounds", results)
    return 0


def compare(bench: Bench) -> list[dict[str, t.Any]]:
    console, dsn, shapes, args = bench.console, bench.dsn, bench.shapes, bench.args
    caches = [
        open_cache(dsn, bench.work, f"every_{f:g}s", f"REFRESH EVERY {f:g} SEC") for f in SWEEP
    ]
    caches.append(open_cache(dsn, bench.work, "auto", "REFRESH AUTO"))
    stop = threading.Event()
    writing = threading.Thread(
        target=writer, args=(dsn, stop, random.Random(args.seed + 1), bench.keys), daemon=True
    )
    console.print(
        f"part 1: {args.seconds:g} s of the workload on {len(caches)} caches at once; shapes' "
        "bounds: " + ", ".join(f"{s.table}.{s.key} {s.bound:g} s" for s in shapes)
    )
    writing.start()
    try:
        run(caches, bench, args.seconds, random.Random(args.seed + 2))
    finally:
        stop.set()
        writing.join()
    rows: list[dict[str, t.Any]] = []
    for one in caches:
        assert one.scheduler is not None
        one.scheduler.stop()
        pulled = rows_pulled(one)
        rows.append(
            {
                "part": "sweep",
                "cache": one.name,
                "queries": one.queries,
                "local_share": one.local / max(one.queries, 1),
                "local_cost_share": one.local_cost / max(one.cost, 1e-9),
                "rows_pulled": pulled,
                "refreshes": len(one.scheduler.reports),
            }
        )
    auto = caches[-1].conn.admin.status()
    chosen = {
        v["name"]: v["refresh_auto"]["interval_seconds"] for v in auto["views"] if v["refresh_auto"]
    }
    for one in caches:
        one.conn.close()
    fixed = rows[:-1]
    best = max(fixed, key=lambda r: (r["local_share"], -r["rows_pulled"]))
    mine = rows[-1]
    table = Table(
        title=f"REFRESH AUTO against fixed intervals, TPC-H SF {args.sf}, {args.seconds:g} s"
    )
    for column in (
        "cache",
        "local share",
        "local cost share",
        "rows pulled",
        "refreshes",
    ):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["cache"],
            f"{row['local_share']:.1%}",
            f"{row['local_cost_share']:.1%}",
            f"{row['rows_pulled']:,}",
            str(row["refreshes"]),
        )
    console.print(table)
    console.print(
        "AUTO's intervals: "
        + ", ".join(
            f"{v} {'not refreshed' if f is None else f'{f:.3g} s'}" for v, f in chosen.items()
        )
    )
    console.print(
        f"best fixed interval ({best['cache']}): local {best['local_share']:.1%}, "
        f"{best['rows_pulled']:,} rows; AUTO: local {mine['local_share']:.1%} "
        f"({mine['local_share'] - best['local_share']:+.1%}), rows pulled "
        f"{mine['rows_pulled'] / max(best['rows_pulled'], 1):.2f}x (targets: >= +0.0%, <= 0.50x)"
    )
    return rows


def advise(bench: Bench) -> list[dict[str, t.Any]]:
    console, dsn, work, args = bench.console, bench.dsn, bench.work, bench.args
    bare = open_cache(dsn, work, "advised", None)
    console.print(
        f"part 2: {args.advice_seconds:g} s of the workload on a cache with no schema ..."
    )
    run([bare], bench, args.advice_seconds, random.Random(args.seed + 3))
    # each shape's backend time per call, with no cache schema (every call remote)
    mean = {s: bare.backend_ms.get(s, 0.0) / n for s, n in bare.calls.items()}
    advice = bare.conn.admin.advice()
    applied = apply_script(advice)
    bare.conn.admin.apply_ddl(applied.script)
    console.print(f"applied: {', '.join(applied.views)}")
    # the views applied are kept as deployed: the file's refresh scheduler runs
    store = CacheStore(work / "advised.duckdb")
    scheduler = RefreshScheduler(store, dsn, InlineEngine(), tick=1.0)
    scheduler.start()
    again = Cache("advised again", bare.conn, scheduler, store)
    try:
        run([again], bench, args.advice_seconds, random.Random(args.seed + 3))
    finally:
        scheduler.stop()
    bare.conn.close()
    # the backend time the second run's calls took in the first, and the share of it answered
    # locally now
    whole = sum(n * mean.get(s, 0.0) for s, n in again.calls.items())
    share = sum(n * mean.get(s, 0.0) for s, n in again.local_calls.items()) / max(whole, 1e-9)
    console.print(
        f"after advise --apply: {share:.1%} of the first run's backend time is answered "
        f"locally (target >= 80%); {again.local / max(again.queries, 1):.1%} of the queries"
    )
    return [
        {
            "part": "advice",
            "cache": "advised",
            "queries": again.queries,
            "local_share": again.local / max(again.queries, 1),
            "backend_time_local_share": share,
            "applied": " ".join(applied.views),
            "at": dt.datetime.now(dt.UTC).isoformat(),
        }
    ]


if __name__ == "__main__":
    raise SystemExit(main())
