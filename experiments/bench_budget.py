"""The cache within its resources (issue 30): bulk admission against a pull of the same rows,
and status at many regions.

    python -m experiments.bench_budget [--keys 100000] [--backend DSN]

A table of ``2 * --keys`` rows at the backend; a presence-controlled view of it. Side by
side in one run:
- admitting ``--keys`` keys in one call (seconds, rows/s), and the same rows pulled by a
  refresh of a fully materialized view of them (rows/s): the ratio;
- `mtcache status` of the whole cache with those regions (seconds);
- evicting them all in one call (seconds).
Each admission is checked: the view holds exactly the backend's rows of the keys.

Not measured yet (issue 30 is not done): the size budget's policy against LRU and the
offline optimum, and big transactions from the stream.
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


def prepare(dsn: str, rows: int) -> None:
    """The backend's table of ``rows`` rows (kept when it is there already)."""
    with psycopg.connect(dsn, autocommit=True) as pg:
        found = pg.execute("SELECT obj_description(to_regclass('bench_items'), 'pg_class')")
        if (found.fetchone() or (None,))[0] == f"rows={rows}":
            return
        pg.execute("DROP TABLE IF EXISTS bench_items")
        pg.execute("CREATE TABLE bench_items (id integer PRIMARY KEY, grp integer NOT NULL, "
                   "val text NOT NULL, amount numeric(12,2) NOT NULL)")  # fmt: skip
        pg.execute("INSERT INTO bench_items SELECT g, g %% 1000, md5(g::text), g / 100.0 "
                   "FROM generate_series(1, %s) g", (rows,))  # fmt: skip
        pg.execute("ANALYZE bench_items")
        pg.execute(f"COMMENT ON TABLE bench_items IS 'rows={rows}'")


def measure(dsn: str, keys: int) -> dict[str, t.Any]:
    prepare(dsn, 2 * keys)
    work = Path(tempfile.mkdtemp(prefix="mtcache-bench-budget-"))
    try:
        with cache.connect(dsn, work / "c.duckdb", background=False,
                           admit_on_miss=False) as conn:  # fmt: skip
            conn.admin.apply_ddl(
                "CREATE CONTROL TABLE item_pct (id integer); CREATE CACHED VIEW items_some AS "
                "SELECT * FROM bench_items PRESENCE ON (id) IN item_pct; CREATE CACHED VIEW "
                f"items_first AS SELECT * FROM bench_items WHERE id <= {keys}")  # fmt: skip
            wanted = [(i,) for i in range(1, keys + 1)]
            started = time.perf_counter()
            conn.admin.admit("item_pct", wanted)
            admit_s = time.perf_counter() - started
            started = time.perf_counter()
            conn.admin.refresh("items_first", engine="inline")
            pull_s = time.perf_counter() - started
            admin = conn.admin
            assert isinstance(admin, cache.Admin)
            con = admin.store.con
            same = con.execute("SELECT count(*) FROM (SELECT * FROM items_some EXCEPT ALL "
                               "SELECT * FROM items_first)").fetchone()  # fmt: skip
            held = con.execute("SELECT count(*) FROM items_some").fetchone()
            assert same == (0,) and held == (keys,), "the admitted rows are not the backend's"
            started = time.perf_counter()
            status = conn.admin.status()
            status_s = time.perf_counter() - started
            regions = sum(v["region_count"] for v in status["views"])
            started = time.perf_counter()
            conn.admin.evict("item_pct", wanted)
            evict_s = time.perf_counter() - started
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"experiment": "bench_budget", "part": "bulk admission", "keys": keys,
            "admit_s": admit_s, "admit_rows_per_s": keys / admit_s, "pull_s": pull_s,
            "pull_rows_per_s": keys / pull_s, "admit_vs_pull": pull_s / admit_s,
            "status_s": status_s, "regions": regions, "evict_s": evict_s}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, nargs="+", default=[100_000],
                        help="keys admitted in one call (default 100000; several: one run each)")
    parser.add_argument("--backend", help="PostgreSQL DSN (default: the embedded cluster)")
    args = parser.parse_args(argv)
    console = Console(width=140)
    dsn = tpch.backend(args.backend)
    rows = []
    for keys in args.keys:
        console.print(f"admitting {keys:,} keys ...")
        rows.append(measure(dsn, keys))
    table = Table(title="Bulk admission, side by side with a pull of the same rows")
    for column in ("keys", "admit", "rows/s", "pull", "rows/s", "admit / pull speed",
                   "status", "regions", "evict"):
        table.add_column(column)
    for r in rows:
        table.add_row(f"{r['keys']:,}", f"{r['admit_s']:.2f} s", f"{r['admit_rows_per_s']:,.0f}",
                      f"{r['pull_s']:.2f} s", f"{r['pull_rows_per_s']:,.0f}",
                      f"{r['admit_vs_pull']:.2f}x", f"{r['status_s']:.2f} s",
                      f"{r['regions']:,}", f"{r['evict_s']:.2f} s")  # fmt: skip
    console.print(table)
    console.print("targets: 10^5 keys admitted within 10 s, status under 1 s at 10^6 regions")
    console.print(f"results appended to {append_rows('bench_budget', rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
