"""The cache within its resources (issue 30): the size budget's policy on a Zipf workload,
bulk admission against a pull of the same rows, and status at many regions.

    python -m experiments.bench_budget [--zipf-keys 1000000] [--requests 2000000]
        [--live-keys 10000] [--live-requests 10000] [--keys 100000 ...] [--tx-rows 1000000]
        [--backend DSN]

Side by side in one run:
- the size budget's policy: a Zipf-distributed point workload (``--requests`` requests over
  ``--zipf-keys`` keys, s = 1, seeded) with room for 10% of the keys: the hit ratio of the
  cache's own policy (its code, `optimizer.rules.eviction_policy` and `cache.store.budget`, run
  offline on the trace, with and without the doorkeeper) against LRU and the offline optimum
  (Belady's, computed from the trace);
- the same policy live: ``--live-requests`` point queries of the same law over a table of
  ``--live-keys`` rows through the cache with ``cache_size_limit`` at 10% of the data, every
  answer compared with PostgreSQL's; its hit ratio, and the data's bytes, the file's and
  DuckDB's memory at their highest, against the budget;
- admitting ``--keys`` keys in one call (seconds, rows/s), and the same rows pulled by a
  refresh of a fully materialized view of them (rows/s): the ratio;
- `mtcache status` of the whole cache with those regions (seconds);
- evicting them all in one call (seconds).
Each admission is checked: the view holds exactly the backend's rows of the keys.

- one backend transaction of ``--tx-rows`` row changes applied by the stream to a
  continuously maintained view (streamed while in progress, spilled to disk in pieces), in a
  process of its own, against a pull of the same rows in another: the seconds from the
  backend's commit until the view holds it, with the consumer streaming it as it runs (as
  deployed) and reading it only after its commit (a backlog); each process's CPU seconds;
  the ratios to the pull, and each process's peak memory.
"""

from __future__ import annotations

import argparse
import collections
import heapq
import itertools
import multiprocessing
import random
import shutil
import tempfile
import time
import typing as t
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

import cache
from cache.backend.pgoutput.messages import lsn_value
from cache.engine.admission import Doorkeeper
from cache.maintenance.budget import ROOM
from cache.store.budget import RegionHits
from cache.store.counters import Counter
from experiments import tpch
from experiments.provenance import append_rows
from optimizer.rules.eviction_policy import Held, victims


def prepare(dsn: str, rows: int) -> None:
    """The backend's table of ``rows`` rows (kept when it is there already)."""
    with psycopg.connect(dsn, autocommit=True) as pg:
        found = pg.execute("SELECT obj_description(to_regclass('bench_items'), 'pg_class')")
        if (found.fetchone() or (None,))[0] == f"rows={rows}":
            return
        pg.execute("DROP TABLE IF EXISTS bench_items")
        pg.execute(
            "CREATE TABLE bench_items (id integer PRIMARY KEY, grp integer NOT NULL, "
            "val text NOT NULL, amount numeric(12,2) NOT NULL)"
        )
        pg.execute(
            "INSERT INTO bench_items SELECT g, g %% 1000, md5(g::text), g / 100.0 "
            "FROM generate_series(1, %s) g",
            (rows,),
        )
        pg.execute("ANALYZE bench_items")
        pg.execute(f"COMMENT ON TABLE bench_items IS 'rows={rows}'")


# -- the size budget's policy on a Zipf workload ----------------------------------------------

PARTS = ("policy", "bulk", "transaction")
ZIPF_S = 1.0  # the skew of the point workload (Zipf's law)
RATE = 1000.0  # requests per second the offline runs assume (the policy's hits decay in time)
SHARE = 0.10  # the budget: this share of the data
DOORKEEPER_SECONDS = 60.0


def zipf_trace(keys: int, requests: int, seed: int, s: float = ZIPF_S) -> list[int]:
    """``requests`` keys of 1..``keys`` drawn by Zipf's law, the ranks shuffled (the popular
    keys are not the smallest)."""
    rng = random.Random(seed)
    cumulative = list(itertools.accumulate(1 / k**s for k in range(1, keys + 1)))
    ranks = rng.choices(range(keys), cum_weights=cumulative, k=requests)
    order = list(range(1, keys + 1))
    rng.shuffle(order)
    return [order[r] for r in ranks]


def lru_hits(trace: list[int], capacity: int) -> int:
    held: collections.OrderedDict[int, None] = collections.OrderedDict()
    hits = 0
    for key in trace:
        if key in held:
            hits += 1
            held.move_to_end(key)
            continue
        held[key] = None
        if len(held) > capacity:
            held.popitem(last=False)
    return hits


def belady_hits(trace: list[int], capacity: int) -> int:
    """The offline optimum (Belady's MIN): on a miss with the cache full, evict the key whose
    next request is farthest (a key never asked again first)."""
    following = [0] * len(trace)
    seen: dict[int, int] = {}
    for i in range(len(trace) - 1, -1, -1):
        following[i] = seen.get(trace[i], len(trace) + i)
        seen[trace[i]] = i
    held: dict[int, int] = {}  # key -> its next request
    heap: list[tuple[int, int]] = []  # (-next request, key); entries gone stale are skipped
    hits = 0
    for i, key in enumerate(trace):
        if key in held:
            hits += 1
        elif len(held) >= capacity:
            while True:
                far, victim = heapq.heappop(heap)
                if held.get(victim) == -far:
                    del held[victim]
                    break
        held[key] = following[i]
        heapq.heappush(heap, (-following[i], key))
    return hits


def policy_hits(trace: list[int], capacity: int, doorkeeper: float | None) -> int:
    """The cache's own policy run offline on the trace by its own code: every request is a
    read of its key (`RegionHits`, kept past an eviction); a miss admits the key (with a
    doorkeeper, on its second miss within ``doorkeeper`` seconds); passing the capacity evicts
    the least worth (`victims`, down to the cache's room), one request every 1 / RATE
    seconds. Every key is one row of the same size, and a hit on any saves the same backend
    cost."""
    now = 0.0
    hits_of = RegionHits()
    gate = Doorkeeper(doorkeeper, clock=lambda: now) if doorkeeper is not None else None
    held: set[int] = set()
    hits = 0
    for i, key in enumerate(trace):
        now = i / RATE
        hits_of.hit("c", (key,), 1.0, now)
        if key in held:
            hits += 1
            continue
        if gate is not None and not gate.admits(key):
            continue
        held.add(key)
        if len(held) > capacity:
            others = [(k,) for k in held if k != key]
            candidates = [
                Held("c", k, 1, 1, *w)
                for k, w in zip(others, hits_of.worths("c", others, now), strict=True)
            ]
            for victim in victims(candidates, len(held) - int(capacity * (1 - ROOM))):
                held.discard(victim.key[0])
    return hits


def policy_offline(keys: int, requests: int, seed: int) -> dict[str, t.Any]:
    trace = zipf_trace(keys, requests, seed)
    capacity = int(keys * SHARE)
    found: dict[str, t.Any] = {
        "experiment": "bench_budget",
        "part": "policy offline",
        "keys": keys,
        "requests": requests,
        "capacity": capacity,
        "seed": seed,
    }
    for name, run in (
        ("lru", lambda: lru_hits(trace, capacity)),
        ("belady", lambda: belady_hits(trace, capacity)),
        ("policy", lambda: policy_hits(trace, capacity, None)),
        ("policy_doorkeeper", lambda: policy_hits(trace, capacity, DOORKEEPER_SECONDS)),
    ):
        started = time.perf_counter()
        found[f"{name}_hit_ratio"] = run() / requests
        found[f"{name}_s"] = time.perf_counter() - started
    return found


def policy_live(
    dsn: str, keys: int, requests: int, seed: int, doorkeeper: float | None
) -> dict[str, t.Any]:
    """The budget live: point queries by Zipf's law through the cache, its budget 10% of the
    data; each answer is PostgreSQL's; the highest data bytes, file bytes and memory seen."""
    prepare(dsn, keys)
    trace = zipf_trace(keys, requests, seed)
    work = Path(tempfile.mkdtemp(prefix="mtcache-bench-budget-"))
    ddl = (
        "CREATE CONTROL TABLE item_pct (id integer); CREATE CACHED VIEW items_some AS "
        "SELECT * FROM bench_items PRESENCE ON (id) IN item_pct"
    )
    sql = "SELECT id, grp, val FROM bench_items WHERE id = %s"  # (amount: see docs/limits.md)
    try:
        sample = min(keys, 2000)
        with cache.connect(dsn, work / "m.duckdb", background=False, admit_on_miss=False) as conn:
            conn.admin.apply_ddl(ddl)
            conn.admin.admit("item_pct", [(i,) for i in range(1, sample + 1)])
            per_key = conn.admin.status()["resources"]["data_bytes"] / sample
        limit = int(per_key * keys * SHARE)
        peaks = {"data_bytes": 0, "file_bytes": 0, "memory_in_use_bytes": 0}
        local = 0
        with (
            cache.connect(
                dsn,
                work / "c.duckdb",
                background=False,
                cache_size_limit=limit,
                doorkeeper_seconds=doorkeeper,
            ) as conn,
            psycopg.connect(dsn, autocommit=True) as pg,
        ):
            conn.admin.apply_ddl(ddl)
            cursor = conn.cursor()
            started = time.perf_counter()
            for i, key in enumerate(trace):
                cursor.execute(sql + " CURRENCY BOUND 10 MIN", (key,))
                if cursor.fetchall() != pg.execute(sql, (key,)).fetchall():
                    raise AssertionError(f"key {key}: the cache's answer is not PostgreSQL's")
                local += all(p["route"] == "local" for p in cursor.provenance)
                if i % 500 == 499:
                    conn.engine.admissions.wait()  # type: ignore[union-attr]
                    used = conn.admin.status()["resources"]
                    peaks = {name: max(value, used[name]) for name, value in peaks.items()}
            seconds = time.perf_counter() - started
            counters = conn.admin.status()["counters"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "experiment": "bench_budget",
        "part": "policy live",
        "keys": keys,
        "requests": requests,
        "seed": seed,
        "doorkeeper_s": doorkeeper,
        "cache_size_limit": limit,
        "hit_ratio": local / requests,
        "lru_hit_ratio": lru_hits(trace, int(keys * SHARE)) / requests,
        "belady_hit_ratio": belady_hits(trace, int(keys * SHARE)) / requests,
        "peak_data_bytes": peaks["data_bytes"],
        "peak_file_bytes": peaks["file_bytes"],
        "peak_memory_bytes": peaks["memory_in_use_bytes"],
        "evictions": counters[Counter.EVICTIONS],
        "seconds": seconds,
    }


def _measure_child(dsn: str, keys: int, out: t.Any) -> None:
    """`measure` in a process of its own: its peak memory is the admission's."""
    found = measure(dsn, keys)
    out.put({**found, "peak_rss": _peak_rss()})


def measure(dsn: str, keys: int) -> dict[str, t.Any]:
    prepare(dsn, 2 * keys)
    work = Path(tempfile.mkdtemp(prefix="mtcache-bench-budget-"))
    try:
        with cache.connect(dsn, work / "c.duckdb", background=False, admit_on_miss=False) as conn:
            conn.admin.apply_ddl(
                "CREATE CONTROL TABLE item_pct (id integer); CREATE CACHED VIEW items_some AS "
                "SELECT * FROM bench_items PRESENCE ON (id) IN item_pct; CREATE CACHED VIEW "
                f"items_first AS SELECT * FROM bench_items WHERE id <= {keys}"
            )
            wanted = [(i,) for i in range(1, keys + 1)]
            started = time.perf_counter()
            conn.admin.admit("item_pct", wanted)
            admit_s = time.perf_counter() - started
            admit_peak = _peak_rss()  # (the process's peak so far: the admission's)
            started = time.perf_counter()
            conn.admin.refresh("items_first", engine="inline")
            pull_s = time.perf_counter() - started
            admin = conn.admin
            assert isinstance(admin, cache.Admin)
            con = admin.store.con
            same = con.execute(
                "SELECT count(*) FROM (SELECT * FROM items_some EXCEPT ALL "
                "SELECT * FROM items_first)"
            ).fetchone()
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
    return {
        "experiment": "bench_budget",
        "part": "bulk admission",
        "keys": keys,
        "admit_s": admit_s,
        "admit_rows_per_s": keys / admit_s,
        "pull_s": pull_s,
        "pull_rows_per_s": keys / pull_s,
        "admit_vs_pull": pull_s / admit_s,
        "status_s": status_s,
        "regions": regions,
        "evict_s": evict_s,
        "admit_peak_rss": admit_peak,
    }


# -- a big transaction on a continuously maintained view ----------------------------------------


def _pull_child(dsn: str, path: str, rows: int, out: t.Any) -> None:
    """In a process of its own: the view made and pulled (the rows/s of a pull)."""
    from cache.backend.reflect import fetch_catalog
    from cache.maintenance import stream
    from cache.maintenance.pipeline import Maintainer
    from cache.store.cache_file import CacheStore
    from sql_ext import parse

    with CacheStore(path) as store:
        stream.apply_ddl(
            store,
            dsn,
            parse("CREATE CACHED VIEW bigcopy AS SELECT * FROM bench_big REFRESH CONTINUOUSLY"),
            fetch_catalog(dsn),
        )
        started, cpu = time.perf_counter(), time.process_time()
        Maintainer(store, dsn).refresh("bigcopy")
        out.put(
            {
                "pull_s": time.perf_counter() - started,
                "pull_cpu_s": time.process_time() - cpu,
                "pull_peak_rss": _peak_rss(),
            }
        )


def _apply_child(dsn: str, path: str, rows: int, out: t.Any) -> None:
    """In a process of its own (its peak memory is the transactions'): one backend
    transaction changing every row, twice, applied by the stream consumer:
    - streamed, as deployed: the consumer's thread reads it while it runs; timed from the
      backend's commit until the thread has applied it;
    - as a backlog: the consumer reads it only after its commit (a consumer that was away);
      timed from the commit too.
    The process's CPU seconds are counted from the transaction's start. (The backlog goes
    first: its session goes on as the thread's.)"""
    from cache.maintenance import stream
    from cache.store.cache_file import CacheStore

    with CacheStore(path) as store, stream.Consumer(store, dsn) as consumer:
        consumer.catch_up()
        found: dict[str, t.Any] = {"settled_rss": _peak_rss()}
        reader = store.con.cursor()

        def holds(suffix: str) -> bool:
            return reader.execute(
                "SELECT count(*) FROM bigcopy WHERE val LIKE ?", [f"%{suffix}"]
            ).fetchall() == [(rows,)]

        def update(suffix: str) -> tuple[float, int]:
            """The transaction: its CPU start; the position it committed after."""
            with psycopg.connect(dsn, autocommit=True) as pg:
                cpu = time.process_time()
                with pg.transaction():
                    pg.execute(
                        "UPDATE bench_big SET val = val || %s, amount = amount + 1", (suffix,)
                    )
                    before = pg.execute("SELECT pg_current_wal_insert_lsn()::text").fetchall()
            return cpu, lsn_value(before[0][0])

        # a backlog first: its session then goes on as the thread's (a session started
        # afresh has the backend decode again from the slot's restart point)
        cpu, _ = update("b")
        committed = time.perf_counter()
        consumer.catch_up(timeout=3600)
        found["backlog_s"] = time.perf_counter() - committed
        found["backlog_cpu_s"] = time.process_time() - cpu
        if not holds("b"):
            raise AssertionError("the view does not hold the transaction's change")
        consumer.start()  # as deployed
        try:
            cpu, before = update("s")
            committed = time.perf_counter()
            # until the consumer's thread has stored it and finished with it (DuckDB's
            # checkpoint after the commit included, as in the pull's seconds)
            while (consumer.position or 0) <= before:
                time.sleep(0.01)
            found["streamed_s"] = time.perf_counter() - committed
            found["streamed_cpu_s"] = time.process_time() - cpu
        finally:
            consumer.stop()
        if not holds("s"):
            raise AssertionError("the view does not hold the transaction's change")
        found |= {"spilled": consumer.spilled, "apply_peak_rss": _peak_rss()}
        out.put(found)


def _peak_rss() -> int:
    """This process's peak resident memory in bytes: VmHWM, which starts afresh at the exec
    of a spawned child (getrusage's maximum carries the forking parent's over)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def big_transaction(dsn: str, rows: int) -> dict[str, t.Any]:
    """One backend transaction of ``rows`` row changes applied to a continuously maintained
    view, against a pull of the same rows; each in a process of its own."""
    from cache.backend.reflect import fetch_catalog
    from cache.maintenance import stream
    from cache.store.cache_file import CacheStore
    from sql_ext import parse

    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute("DROP TABLE IF EXISTS bench_big")
        pg.execute(
            "CREATE TABLE bench_big (id integer PRIMARY KEY, grp integer NOT NULL, "
            "val text NOT NULL, amount numeric(12,2) NOT NULL)"
        )
        pg.execute(
            "INSERT INTO bench_big SELECT g, g %% 1000, md5(g::text), g / 100.0 "
            "FROM generate_series(1, %s) g",
            (rows,),
        )
    work = Path(tempfile.mkdtemp(prefix="mtcache-bench-bigtx-"))
    path = str(work / "c.duckdb")
    context = multiprocessing.get_context("spawn")
    found: dict[str, t.Any] = {
        "experiment": "bench_budget",
        "part": "big transaction",
        "rows": rows,
    }
    try:
        for child in (_pull_child, _apply_child):
            out = context.Queue()
            process = context.Process(target=child, args=(dsn, path, rows, out))
            process.start()
            found.update(out.get(timeout=7200))
            process.join()
            if process.exitcode != 0:
                raise RuntimeError(f"{child.__name__} failed ({process.exitcode})")
    finally:
        with CacheStore(path) as store:
            stream.apply_ddl(store, dsn, parse("DROP CACHED VIEW bigcopy"), fetch_catalog(dsn))
        shutil.rmtree(work, ignore_errors=True)
    found["decode_floor_s"] = _backend_decoding(dsn)
    for how in ("pull", "streamed", "backlog"):
        found[f"{how}_rows_per_s"] = rows / found[f"{how}_s"]
    for how in ("streamed", "backlog"):
        found[f"{how}_vs_pull"] = found["pull_s"] / found[f"{how}_s"]
        found[f"{how}_cpu_vs_pull"] = found["pull_cpu_s"] / found[f"{how}_cpu_s"]
    return found


def _backend_decoding(dsn: str) -> float:
    """The backend's own seconds to decode one more such transaction with pgoutput (through
    a temporary slot's SQL interface, nothing sent anywhere): the floor under any consumer
    that starts reading it after its commit."""
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute("DROP PUBLICATION IF EXISTS mtcache_bench_floor")
        pg.execute("CREATE PUBLICATION mtcache_bench_floor FOR TABLE bench_big")
        try:
            pg.execute(
                "SELECT pg_create_logical_replication_slot('mtcache_bench_floor', 'pgoutput', true)"
            )
            pg.execute("UPDATE bench_big SET val = val || 'f', amount = amount + 1")
            started = time.perf_counter()
            pg.execute(
                "SELECT count(*) FROM pg_logical_slot_peek_binary_changes("
                "'mtcache_bench_floor', NULL, NULL, 'proto_version', '1', "
                "'publication_names', 'mtcache_bench_floor')"
            ).fetchall()
            return time.perf_counter() - started
        finally:
            pg.execute("DROP PUBLICATION mtcache_bench_floor")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--keys",
        type=int,
        nargs="*",
        default=[100_000],
        help="keys admitted in one call (default 100000; several: one run each; "
        "none: no bulk admission)",
    )
    parser.add_argument(
        "--zipf-keys",
        type=int,
        default=1_000_000,
        help="keys of the offline Zipf workload (default 1000000)",
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=2_000_000,
        help="requests of the offline Zipf workload (default 2000000)",
    )
    parser.add_argument(
        "--live-keys",
        type=int,
        default=10_000,
        help="rows of the live Zipf workload's table (default 10000)",
    )
    parser.add_argument(
        "--live-requests",
        type=int,
        default=10_000,
        help="point queries of the live Zipf workload (default 10000)",
    )
    parser.add_argument(
        "--tx-rows",
        type=int,
        default=1_000_000,
        help="row changes of the big backend transaction (default 1000000; 0: none)",
    )
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=PARTS,
        default=list(PARTS),
        help="what to measure (default: all)",
    )
    parser.add_argument("--backend", help="PostgreSQL DSN (default: the embedded cluster)")
    args = parser.parse_args(argv)
    console = Console(width=140)
    dsn = tpch.backend(args.backend)
    found: list[dict[str, t.Any]] = []
    if "policy" in args.parts:
        found += policy(console, dsn, args)
    if "bulk" in args.parts:
        found += bulk(console, dsn, args.keys)
    if "transaction" in args.parts and args.tx_rows:
        found += transaction(console, dsn, args.tx_rows)
    console.print(
        "targets: 10^5 keys admitted within 10 s, status under 1 s at 10^6 regions; "
        "the data within its budget throughout; a big transaction applied at least "
        "as fast as a pull of its rows"
    )
    console.print(f"results appended to {append_rows('bench_budget', found)}")
    return 0


def policy(console: Console, dsn: str, args: argparse.Namespace) -> list[dict[str, t.Any]]:
    console.print(f"the policy offline: {args.requests:,} requests over {args.zipf_keys:,} keys")
    offline = policy_offline(args.zipf_keys, args.requests, args.seed)
    live = []
    for doorkeeper in (None, DOORKEEPER_SECONDS):
        console.print(
            f"the policy live: {args.live_requests:,} queries over "
            f"{args.live_keys:,} rows, doorkeeper {doorkeeper} ..."
        )
        live.append(policy_live(dsn, args.live_keys, args.live_requests, args.seed, doorkeeper))
    table = Table(title="The size budget (10% of the data): hit ratio on a Zipf workload (s = 1)")
    for column in (
        "run",
        "keys",
        "requests",
        "policy",
        "with doorkeeper",
        "LRU",
        "Belady (optimum)",
        "policy / LRU",
        "peak data / budget",
        "peak file / budget",
        "peak memory",
    ):
        table.add_column(column)
    o = offline
    table.add_row(
        "offline (its code)",
        f"{o['keys']:,}",
        f"{o['requests']:,}",
        f"{o['policy_hit_ratio']:.3f}",
        f"{o['policy_doorkeeper_hit_ratio']:.3f}",
        f"{o['lru_hit_ratio']:.3f}",
        f"{o['belady_hit_ratio']:.3f}",
        f"{o['policy_hit_ratio'] / o['lru_hit_ratio']:.2f}x",
        "",
        "",
        "",
    )
    for r in live:
        keeper = r["doorkeeper_s"] is not None
        table.add_row(
            "live (the cache)",
            f"{r['keys']:,}",
            f"{r['requests']:,}",
            "" if keeper else f"{r['hit_ratio']:.3f}",
            f"{r['hit_ratio']:.3f}" if keeper else "",
            f"{r['lru_hit_ratio']:.3f}",
            f"{r['belady_hit_ratio']:.3f}",
            f"{r['hit_ratio'] / r['lru_hit_ratio']:.2f}x",
            f"{r['peak_data_bytes'] / r['cache_size_limit']:.2f}",
            f"{r['peak_file_bytes'] / r['cache_size_limit']:.2f}",
            f"{r['peak_memory_bytes'] / 2**20:.0f} MiB",
        )
    console.print(table)
    return [offline, *live]


def bulk(console: Console, dsn: str, keys_asked: list[int]) -> list[dict[str, t.Any]]:
    rows = []
    context = multiprocessing.get_context("spawn")
    for keys in keys_asked:
        console.print(f"admitting {keys:,} keys ...")
        prepare(dsn, 2 * keys)  # (outside the measured process)
        out = context.Queue()
        process = context.Process(target=_measure_child, args=(dsn, keys, out))
        process.start()
        rows.append(out.get(timeout=7200))
        process.join()
    if rows:
        table = Table(title="Bulk admission, side by side with a pull of the same rows")
        for column in (
            "keys",
            "admit",
            "rows/s",
            "pull",
            "rows/s",
            "admit / pull speed",
            "status",
            "regions",
            "evict",
            "peak: admission / all",
        ):
            table.add_column(column)
        for r in rows:
            table.add_row(
                f"{r['keys']:,}",
                f"{r['admit_s']:.2f} s",
                f"{r['admit_rows_per_s']:,.0f}",
                f"{r['pull_s']:.2f} s",
                f"{r['pull_rows_per_s']:,.0f}",
                f"{r['admit_vs_pull']:.2f}x",
                f"{r['status_s']:.2f} s",
                f"{r['regions']:,}",
                f"{r['evict_s']:.2f} s",
                f"{r['admit_peak_rss'] / 2**20:,.0f} / {r['peak_rss'] / 2**20:,.0f} MiB",
            )
        console.print(table)
    return rows


def transaction(console: Console, dsn: str, tx_rows: int) -> list[dict[str, t.Any]]:
    big = []
    if tx_rows:
        console.print(f"one backend transaction of {tx_rows:,} row changes ...")
        big.append(big_transaction(dsn, tx_rows))
        table = Table(
            title="A big transaction on a continuously maintained view, side by side "
            "with a pull of the same rows (speed: the pull's seconds over the "
            "apply's, from the backend's commit; CPU: the same for each process's "
            "CPU seconds)"
        )
        for column in (
            "rows",
            "pull",
            "streamed (as deployed)",
            "speed, CPU vs pull",
            "as a backlog",
            "speed, CPU vs pull",
            "backend's decoding alone",
            "memory: before / peak",
            "pull's peak",
        ):
            table.add_column(column)
        for r in big:
            table.add_row(
                f"{r['rows']:,}",
                f"{r['pull_s']:.1f} s ({r['pull_cpu_s']:.1f} CPU)",
                f"{r['streamed_s']:.1f} s ({r['streamed_cpu_s']:.1f} CPU)",
                f"{r['streamed_vs_pull']:.2f}x, {r['streamed_cpu_vs_pull']:.2f}x",
                f"{r['backlog_s']:.1f} s ({r['backlog_cpu_s']:.1f} CPU)",
                f"{r['backlog_vs_pull']:.2f}x, {r['backlog_cpu_vs_pull']:.2f}x",
                f"{r['decode_floor_s']:.1f} s ({r['pull_s'] / r['decode_floor_s']:.2f}x)",
                f"{r['settled_rss'] / 2**20:,.0f} / {r['apply_peak_rss'] / 2**20:,.0f} MiB",
                f"{r['pull_peak_rss'] / 2**20:,.0f} MiB",
            )
        console.print(table)
    return big


if __name__ == "__main__":
    raise SystemExit(main())
