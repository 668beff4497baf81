"""Continuous maintenance from the WAL against pull refreshes, on TPC-H orders.

    python -m experiments.bench_maintenance [--sf 1] [--runs 3] [--rate 500] [--seconds 20]

One cache file with ``orders_copy AS SELECT * FROM orders REFRESH CONTINUOUSLY`` (one
replication slot), measured side by side in one run:

1. **Propagation lag** (first, as an application runs it): writers commit ``--rate``
   single-row transactions a second for ``--seconds`` while the consumer runs as in the
   owning process (a thread, with the heartbeat); 20 times a second one of them marks an
   order with a sequence number, and a reader asks the cache (DB-API, ``CURRENCY BOUND 10
   SEC``, answered locally) until the mark (or a later one) shows: lag = that answer's time
   - the writer's commit returned. p50 and p99.
2. **Refresh after 1,000 updates**: 1,000 single-row transactions change ``o_clerk`` of random
   orders; bringing the view current by applying the stream (`Consumer.catch_up`) against a
   full pull of the same view (`Maintainer.refresh`, inline), interleaved run by run; medians.
   The pull goes to a second cache file holding the same view without the stream (pulling the
   streamed file's view would leave its table and index cold on disk, which the next stream
   batch pays for: a continuously maintained view is not pulled in between).
3. **Apply throughput**: one transaction updating every 15th order (~100,000 rows at SF 1),
   applied from the stream, in rows/s, against the full pull's rows/s.

Results go to the console and, with provenance, to experiments/results/bench_maintenance.csv.
The benchmark changes ``o_clerk`` of the orders it touches (no TPC-H query reads it).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import threading
import time
import typing as t
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

import cache
from cache.backend.reflect import connect_backend, fetch_catalog
from cache.maintenance import stream
from cache.maintenance.engines import InlineEngine
from cache.maintenance.pipeline import Maintainer
from cache.store.cache_file import CacheStore
from experiments import tpch
from experiments.provenance import append_rows
from experiments.workers import Workers
from sql_ext import parse

VIEW = "CREATE CACHED VIEW orders_copy AS SELECT * FROM orders REFRESH CONTINUOUSLY"
PULLED = "CREATE CACHED VIEW orders_copy AS SELECT * FROM orders"  # the pull's own file
DROP = "DROP CACHED VIEW orders_copy"
MARK_ORDER = 1  # o_orderkey of the order the lag marks go to


def update_singly(dsn: str, keys: list[int], tag: str) -> None:
    with connect_backend(dsn, autocommit=True) as conn:
        for number, key in enumerate(keys):
            conn.execute(
                "UPDATE orders SET o_clerk = %s WHERE o_orderkey = %s", (f"{tag}{number}", key)
            )


def equal_to_backend(store: CacheStore, dsn: str, keys: list[int]) -> bool:
    with connect_backend(dsn) as conn:
        backend = conn.execute(
            "SELECT o_orderkey, o_clerk::text FROM orders WHERE o_orderkey = ANY(%s) ORDER BY 1",
            (keys,),
        ).fetchall()
    cached = store.con.execute(
        "SELECT o_orderkey, o_clerk FROM orders_copy WHERE o_orderkey IN "
        f"({', '.join(map(str, keys))}) ORDER BY 1"
    ).fetchall()
    return cached == backend


class Writers(Workers):
    """``rate`` single-row transactions a second over two connections; every
    ``rate / 20``-th one marks MARK_ORDER with its sequence number."""

    def __init__(self, dsn: str, rate: float, keys: list[int]) -> None:
        super().__init__(2)
        self.dsn, self.rate, self.keys = dsn, rate, keys
        self.committed: dict[int, float] = {}  # mark -> monotonic time its commit returned
        self.count = 0
        self._lock = threading.Lock()
        self._next = 0
        self.started = 0.0

    def __enter__(self) -> t.Self:
        self.started = time.monotonic()
        return super().__enter__()

    def _run(self, index: int) -> None:
        rng = random.Random(index)
        every = max(1, round(self.rate / 20))
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stopping.is_set():
                with self._lock:
                    number = self._next
                    self._next += 1
                due = self.started + number / self.rate
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if number % every == 0:
                    conn.execute(
                        "UPDATE orders SET o_clerk = %s WHERE o_orderkey = %s",
                        (f"M{number}", MARK_ORDER),
                    )
                    self.committed[number] = time.monotonic()
                else:
                    conn.execute(
                        "UPDATE orders SET o_clerk = %s WHERE o_orderkey = %s",
                        (f"W{number}", rng.choice(self.keys)),
                    )
                with self._lock:
                    self.count += 1


def propagation_lag(
    dsn: str, path: Path, rate: float, seconds: float, keys: list[int], console: Console
) -> dict[str, float]:
    """Writers at ``rate`` for ``seconds``; the owning process's consumer thread applies."""
    query = "SELECT o.o_clerk FROM orders o WHERE o.o_orderkey = 1 CURRENCY BOUND 10 SEC ON (o)"
    seen: list[tuple[float, int]] = []  # (when, the mark a local answer showed)
    local = remote = 0
    with cache.connect(dsn, path, autocommit=True, heartbeat=1.0) as conn:
        time.sleep(1.0)
        with Writers(dsn, rate, keys) as writers:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                cur = conn.execute(query)
                [(clerk,)] = cur.fetchall()
                now = time.monotonic()
                if cur.provenance[0]["route"] != "local":
                    remote += 1
                    continue
                local += 1
                if clerk.startswith("M"):
                    seen.append((now, int(clerk[1:])))
                time.sleep(0.001)
        achieved = writers.count / (time.monotonic() - writers.started)
        committed = dict(writers.committed)
    # mark m is visible once an answer shows m or a later mark (which overwrote it): marks
    # overwritten within one applied batch count too, from their own commits
    lags = []
    at = 0
    for mark in sorted(committed):
        while at < len(seen) and seen[at][1] < mark:
            at += 1
        if at == len(seen):
            break  # committed as the measurement ended
        lags.append(seen[at][0] - committed[mark])
    lags.sort()
    if len(lags) < 10:
        raise SystemExit(f"only {len(lags)} marks seen: the consumer did not keep up")
    console.print(
        f"writers: {achieved:.0f} transactions/s achieved; {len(lags)} marks seen; "
        f"answers local {local}, remote {remote}"
    )
    return {
        "achieved_rate": achieved,
        "lag_p50": statistics.quantiles(lags, n=100)[49],
        "lag_p99": statistics.quantiles(lags, n=100)[98],
        "marks": len(lags),
        "local_share": local / max(1, local + remote),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per method (default 3)")
    parser.add_argument("--rate", type=float, default=500, help="writes per second (default 500)")
    parser.add_argument("--seconds", type=float, default=20, help="lag measurement (default 20)")
    parser.add_argument("--backend", help="PostgreSQL DSN (default: the embedded cluster)")
    args = parser.parse_args(argv)
    console = Console()

    dsn = tpch.backend(args.backend)
    console.print(f"loading TPC-H orders at SF {args.sf} ...")
    rows = tpch.load(dsn, args.sf, ["orders"])["orders"]
    with connect_backend(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE orders")  # earlier runs' dead rows would slow the pulls
        keys = [r[0] for r in conn.execute("SELECT o_orderkey FROM orders").fetchall()]
    work = Path(tempfile.mkdtemp(prefix="mtcache-bench-"))
    path = work / "cache.duckdb"
    store = CacheStore(path)
    stream.apply_ddl(store, dsn, parse(VIEW), fetch_catalog(dsn))
    records = []
    try:
        maintainer = Maintainer(store, dsn, InlineEngine())
        consumer = stream.Consumer(store, dsn)
        console.print(f"{rows} rows; first pull ...")
        maintainer.refresh("orders_copy")
        consumer.catch_up()
        consumer.close()
        store.close()
        # first: steady state, as an application would run (the owning process's consumer)
        lag = propagation_lag(dsn, path, args.rate, args.seconds, keys, console)
        store = CacheStore(path)
        consumer = stream.Consumer(store, dsn)
        consumer.catch_up()
        rng = random.Random(11)
        full: list[float] = []
        applied: list[float] = []
        with CacheStore(work / "pulled.duckdb") as pulled:
            pulled.apply_ddl(parse(PULLED), fetch_catalog(dsn))
            maintainer = Maintainer(pulled, dsn, InlineEngine())
            maintainer.refresh("orders_copy")  # as the stream's file: the view held
            for run in range(args.runs):
                chosen = rng.sample(keys, 1000)
                update_singly(dsn, chosen, f"R{run}-")
                started = time.perf_counter()
                consumer.catch_up()
                applied.append(time.perf_counter() - started)
                assert equal_to_backend(store, dsn, chosen), "the stream left the view behind"
                started = time.perf_counter()
                maintainer.refresh("orders_copy")
                full.append(time.perf_counter() - started)
                assert equal_to_backend(pulled, dsn, chosen), "the pull left the view behind"
                console.print(
                    f"run {run + 1}/{args.runs}: stream {applied[-1]:.3f} s, "
                    f"full pull {full[-1]:.3f} s"
                )
        full_median, applied_median = statistics.median(full), statistics.median(applied)

        with connect_backend(dsn, autocommit=True) as conn:
            changed = conn.execute(
                "UPDATE orders SET o_clerk = 'Bulk' || o_orderkey::text WHERE o_orderkey % 15 = 0"
            ).rowcount
        started = time.perf_counter()
        consumer.catch_up(timeout=600)
        bulk_seconds = time.perf_counter() - started
        sample = rng.sample([k for k in keys if k % 15 == 0], 1000)
        assert equal_to_backend(store, dsn, sample), "the bulk update did not arrive"
        consumer.close()
        store.close()

        table = Table(
            title=f"Continuous maintenance vs pull, TPC-H orders SF {args.sf} ({rows} rows)"
        )
        for column in ("measure", "stream", "pull", "ratio"):
            table.add_column(column)
        table.add_row(
            "bring current after 1,000 single-row updates (median s)",
            f"{applied_median:.3f}",
            f"{full_median:.3f}",
            f"{applied_median / full_median:.2%}",
        )
        table.add_row(
            "apply throughput (rows/s)",
            f"{changed / bulk_seconds:,.0f}",
            f"{rows / full_median:,.0f}",
            f"{(changed / bulk_seconds) / (rows / full_median):.2f}x",
        )
        table.add_row(
            f"propagation lag at {lag['achieved_rate']:.0f} tx/s, p50 / p99 (s)",
            f"{lag['lag_p50']:.3f} / {lag['lag_p99']:.3f}",
            "-",
            "-",
        )
        console.print(table)
        common = {
            "experiment": "bench_maintenance",
            "scale_factor": args.sf,
            "rows": rows,
            "runs": args.runs,
            "rate": round(lag["achieved_rate"], 1),
        }
        records = [
            {
                **common,
                "measure": "refresh_after_1000_updates_s",
                "stream": applied_median,
                "pull": full_median,
                "ratio": applied_median / full_median,
            },
            {
                **common,
                "measure": "apply_rows_per_s",
                "stream": changed / bulk_seconds,
                "pull": rows / full_median,
                "ratio": (changed / bulk_seconds) / (rows / full_median),
            },
            {
                **common,
                "measure": "lag_p50_s",
                "stream": lag["lag_p50"],
                "pull": None,
                "ratio": None,
            },
            {
                **common,
                "measure": "lag_p99_s",
                "stream": lag["lag_p99"],
                "pull": None,
                "ratio": None,
            },
        ]
        console.print(f"results appended to {append_rows('bench_maintenance', records)}")
    finally:
        with CacheStore(path) as again:  # the slot goes with the view
            stream.apply_ddl(again, dsn, parse(DROP), fetch_catalog(dsn))
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
