"""`mtcache serve` against PostgreSQL direct and pgbouncer (issue 27's figures).

    python -m experiments.bench_server [--scale 10] [--seconds 10] [--calls 3000] [--backend DSN]

One run, everything side by side on one pgbench database (`pgbench -i -s SCALE`) whose
``pgbench_accounts`` the cache holds whole (a cached view refreshed once before measuring):
(a) a point lookup of an account through the server (answered from the cache) vs the same
    statement sent to PostgreSQL directly, one psycopg client, prepared, the two alternating
    call by call: p50 and p99 (target <= 1.0x), for uniform and Zipf keys (the server's lookup
    index of the view answers them: `cache.execution.lookup`), as the scheduler places the
    processes and pinned (`PLACEMENTS`);
(b) `pgbench -S -M prepared` through the server vs PostgreSQL directly vs pgbouncer (session
    pooling: pgbouncer 1.18 keeps no prepared statements across transactions) at 1, 8, 32 and
    128 clients (target: at least pgbouncer's TPS at 32 clients);
(e) TLS: a client's start (connect, one statement, close) with `sslmode=require` vs without,
    and a point lookup over TLS vs without, on one server with a certificate;
(f) the metrics: point lookups through a server with `--metrics` scraped every second vs a
    server without (each its own cache file, both on the client's CPU, at least 10,000 calls
    each; target <= 1.02x), beside a second server without them (how much two servers alike
    differ);
(c) the same point lookup with a 1 ms round trip between the cache and the backend (a delay
    proxy of our own, `experiments.server_rig.DelayProxy`): hits through the server vs the
    backend through the proxy (target <= 0.1x), placed as (a) is;
(d) statements passed through (an uncached read, a write) through the server vs pgbouncer vs
    directly: the latency each adds to PostgreSQL's (target: the server adds at most 2x what
    pgbouncer adds), placed as (a) is (`PLACEMENTS`: the relays with every backend of the
    database); beside them a byte pipe in Python (`experiments.byte_pipe`), the floor of any
    relay written in Python, as a reference;
and what the cache saves: the backend's CPU time per 1,000 reads through the server vs direct,
and the server's memory per idle session. Every cached answer is checked against PostgreSQL's
before timing.
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import subprocess
import tempfile
import threading
import time
import typing as t
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

from cache.backend.embedded_pg import EmbeddedPostgres, free_port
from cache.server.process import client_environment
from cache.store.served import served_at
from experiments.provenance import append_rows
from experiments.server_rig import (
    CLIENTS,
    DATABASE,
    PLACEMENTS,
    POINT,
    DelayProxy,
    backend_cpu,
    byte_pipe,
    cached_accounts,
    connect_once,
    dsn_at,
    lookup,
    mtcache_server,
    p50,
    p99,
    paired,
    pgbench,
    pgbouncer,
    placed,
    resident_bytes,
    scraping,
    tls_files,
)

BOUND = "-c mtcache.currency_bound=600"  # a session bound given at startup, as pgbench can
INDEX_SECONDS = 10  # time given to the server to build the lookup index of the cached view


# -- the run -------------------------------------------------------------------------------------


def enough_connections(cluster: EmbeddedPostgres, console: Console) -> None:
    """The embedded cluster running with room for pgbench's 128 clients directly (plus the
    server's and pgbouncer's own): max_connections raised and the cluster restarted once."""
    with psycopg.connect(cluster.ensure_running(), autocommit=True) as conn:
        found = conn.execute("SHOW max_connections").fetchone()
        if found is not None and int(found[0]) >= 2 * max(CLIENTS) + 50:
            return
        conn.execute(f"ALTER SYSTEM SET max_connections = {2 * max(CLIENTS) + 50}")
    console.print("restarting the embedded PostgreSQL with room for more connections ...")
    cluster.stop()
    cluster.ensure_running()


def prepare_database(cluster: EmbeddedPostgres, scale: int, console: Console) -> str:
    dsn = cluster.ensure_database(DATABASE)
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT to_regclass('pgbench_accounts') IS NOT NULL").fetchone()
        have = (
            found is not None
            and found[0]
            and conn.execute("SELECT count(*) FROM pgbench_accounts").fetchone()
            == (scale * 100_000,)
        )
    if not have:
        console.print(f"pgbench -i -s {scale} ...")
        port = cluster.running_port()
        assert port is not None
        env = client_environment("127.0.0.1", port, DATABASE)
        subprocess.run(
            ["pgbench", "-i", "-q", "-s", str(scale)], env=env, check=True, capture_output=True
        )
    return dsn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=10, help="pgbench scale (100,000 rows each)")
    parser.add_argument("--seconds", type=int, default=10, help="each pgbench run's length")
    parser.add_argument("--calls", type=int, default=3000, help="paired calls per latency figure")
    args = parser.parse_args(argv)
    console = Console(width=140)
    cluster = EmbeddedPostgres(Path(".mtcache/pg"))
    enough_connections(cluster, console)
    backend_port = cluster.running_port()
    assert backend_port is not None
    backend = prepare_database(cluster, args.scale, console)
    work = Path(tempfile.mkdtemp(prefix="mtcache-bench-server-"))
    cache_path = work / "cache.duckdb"
    log = work / "server.log"
    rows: list[dict[str, t.Any]] = []
    accounts = args.scale * 100_000
    draw = random.Random(27)

    def keys(zipf: bool) -> Iterator[int]:
        if not zipf:
            while True:
                yield draw.randint(1, accounts)
        hot = draw.sample(range(1, accounts + 1), 10_000)
        weights = [1 / k**1.1 for k in range(1, len(hot) + 1)]
        while True:
            yield from draw.choices(hot, weights=weights, k=10_000)

    def row(
        figure: str, what: str, server: float, baseline: float, target: str, unit: str = "ms"
    ) -> None:
        rows.append(
            {
                "figure": figure,
                "what": what,
                "server": server,
                "baseline": baseline,
                "ratio": server / baseline if baseline else float("nan"),
                "unit": unit,
                "target": target,
            }
        )

    try:
        with mtcache_server(backend, cache_path, log) as port:
            with psycopg.connect(dsn_at(port, DATABASE), autocommit=True) as admin:
                console.print("caching pgbench_accounts ...")
                admin.execute(
                    "CREATE CACHED VIEW accounts AS SELECT * FROM pgbench_accounts "
                    "REFRESH EVERY 10 MIN"
                )
                admin.execute("REFRESH CACHED VIEW accounts")
            served = psycopg.connect(dsn_at(port, DATABASE, BOUND), autocommit=True)
            direct = psycopg.connect(dsn_at(backend_port, DATABASE), autocommit=True)
            for key in draw.sample(range(1, accounts + 1), 50):
                got = served.execute(POINT, [key], prepare=True).fetchall()
                assert got == direct.execute(POINT, [key], prepare=True).fetchall(), key
            routes = served.execute("EXPLAIN LAST STATEMENT").fetchall()
            assert all("local" in str(r) for r in routes), routes
            # the server indexes the lookup's view in the background after a few runs (a
            # million keys take a second or two): measured once the index answers
            time.sleep(INDEX_SECONDS)

            # (a) point lookups, one client, prepared: as the scheduler places the processes,
            # then with the client, the server and the direct connection's backend on one
            # CPU, and with the client on one and both servers on another (see `placed`)
            server_pid = _server_pid(cache_path)
            serving_pids = (server_pid, direct.info.backend_pid)
            for placement in PLACEMENTS:
                with placed(placement, serving_pids):
                    for zipf in (False, True):
                        stream = keys(zipf)
                        via, straight = paired(
                            [lookup(served, stream), lookup(direct, stream)], args.calls
                        )
                        kind = ("Zipf" if zipf else "uniform") + " keys" + _placed(placement)
                        row(
                            "a",
                            f"point lookup p50, {kind}",
                            p50(via) * 1e3,
                            p50(straight) * 1e3,
                            "<= 1.0x",
                        )
                        row(
                            "a",
                            f"point lookup p99, {kind}",
                            p99(via) * 1e3,
                            p99(straight) * 1e3,
                            "<= 1.0x",
                        )

            # backend CPU per 1,000 reads: through the server (cached) vs direct
            stream = keys(False)
            for conn, name in ((served, "server"), (direct, "direct")):
                before = backend_cpu(cluster.data_dir)
                for _ in range(5000):
                    conn.execute(POINT, [next(stream)], prepare=True).fetchall()
                spent = (backend_cpu(cluster.data_dir) - before) / 5
                rows.append(
                    {
                        "figure": "cpu",
                        "what": f"backend CPU per 1,000 reads ({name})",
                        "server": spent * 1e3 if name == "server" else float("nan"),
                        "baseline": spent * 1e3 if name == "direct" else float("nan"),
                        "ratio": float("nan"),
                        "unit": "ms",
                        "target": "",
                    }
                )

            # memory per idle session, and the backend connections idle sessions hold
            pid = server_pid
            # (the growth from 200 to 400 sessions: the first ones also meet one-time
            # allocations and memory the process gives back meanwhile)
            before_backends = _backends(direct)
            idle: list[psycopg.Connection[t.Any]] = []
            rss = []
            for _ in range(2):
                idle += [
                    psycopg.connect(dsn_at(port, DATABASE, BOUND), autocommit=True)
                    for _ in range(200)
                ]
                for conn in idle[-200::20]:
                    conn.execute(POINT, [1]).fetchall()
                rss.append(resident_bytes(pid))
            per_session = (rss[1] - rss[0]) / 200
            held = _backends(direct) - before_backends
            for conn in idle:
                conn.close()
            rows.append(
                {
                    "figure": "6",
                    "what": "server memory per idle session (200 -> 400)",
                    "server": per_session / 1024,
                    "baseline": float("nan"),
                    "ratio": float("nan"),
                    "unit": "KiB",
                    "target": "cheap",
                }
            )
            rows.append(
                {
                    "figure": "6",
                    "what": "backend connections held by 400 idle sessions",
                    "server": float(held),
                    "baseline": float("nan"),
                    "ratio": float("nan"),
                    "unit": "conns",
                    "target": "0",
                }
            )

            # (d) passed through: the server and pgbouncer vs direct
            with (
                pgbouncer(backend_port, work) as (bouncer_port, bouncer_pid),
                byte_pipe(backend_port) as (pipe_port, pipe_pid),
            ):
                bouncer = psycopg.connect(dsn_at(bouncer_port, DATABASE), autocommit=True)
                piped = psycopg.connect(dsn_at(pipe_port, DATABASE), autocommit=True)
                plain = psycopg.connect(dsn_at(port, DATABASE), autocommit=True)  # no bound
                branches = args.scale
                passthrough = {
                    "uncached read": (
                        "SELECT bbalance FROM pgbench_branches WHERE bid = %s",
                        lambda: draw.randint(1, branches),
                    ),
                    "write": (
                        "UPDATE pgbench_tellers SET tbalance = tbalance + 1 WHERE tid = %s",
                        lambda: draw.randint(1, branches * 10),
                    ),
                }
                for what, (sql, pick) in passthrough.items():

                    def run(
                        conn: psycopg.Connection[t.Any], s: str = sql, k: Callable[[], int] = pick
                    ) -> object:
                        cur = conn.execute(s, [k()], prepare=True)
                        return cur.fetchall() if cur.description else None

                    for conn in (plain, bouncer, piped, direct):  # (each has its backend now)
                        run(conn)
                    # placed as (a) is: the relays and every backend of the database
                    relaying = (server_pid, bouncer_pid, pipe_pid, *_backend_pids(direct))
                    for placement in PLACEMENTS:
                        with placed(placement, relaying):
                            via, bounced, pipe, straight = paired(
                                [
                                    lambda: run(plain),
                                    lambda: run(bouncer),
                                    lambda: run(piped),
                                    lambda: run(direct),
                                ],
                                args.calls,
                            )
                        added_server = p50(via) - p50(straight)
                        added_bouncer = p50(bounced) - p50(straight)
                        where = _placed(placement)
                        row(
                            "d",
                            f"{what}: latency added to PostgreSQL's (p50){where}",
                            added_server * 1e6,
                            added_bouncer * 1e6,
                            "<= 2.0x (server vs pgbouncer)",
                            "us",
                        )
                        row(
                            "d",
                            f"{what}: a byte pipe in Python adds, for reference{where}",
                            (p50(pipe) - p50(straight)) * 1e6,
                            added_bouncer * 1e6,
                            "(floor of a Python relay)",
                            "us",
                        )
                plain.close()
                piped.close()
                bouncer.close()

                # (b) pgbench -S -M prepared: server vs direct vs pgbouncer
                for clients in CLIENTS:
                    tps_server = pgbench(port, clients, args.seconds, BOUND)
                    tps_direct = pgbench(backend_port, clients, args.seconds)
                    tps_bouncer = pgbench(bouncer_port, clients, args.seconds)
                    target = ">= 1.0x pgbouncer" if clients == 32 else ""
                    row(
                        "b",
                        f"pgbench -S -M prepared, {clients} clients: vs pgbouncer",
                        tps_server,
                        tps_bouncer,
                        target,
                        "tps",
                    )
                    row(
                        "b",
                        f"pgbench -S -M prepared, {clients} clients: vs direct",
                        tps_server,
                        tps_direct,
                        "",
                        "tps",
                    )
            served.close()

        # (c) a 1 ms round trip between the cache and the backend
        proxy = DelayProxy(("127.0.0.1", backend_port), 0.0005)
        try:
            far = dsn_at(proxy.port, DATABASE)
            with mtcache_server(far, cache_path, log) as port:
                served = psycopg.connect(dsn_at(port, DATABASE, BOUND), autocommit=True)
                remote = psycopg.connect(far, autocommit=True)
                stream = keys(False)
                for key in draw.sample(range(1, accounts + 1), 20):
                    got = served.execute(POINT, [key], prepare=True).fetchall()
                    assert got == remote.execute(POINT, [key], prepare=True).fetchall(), key
                time.sleep(INDEX_SECONDS)  # (this server indexes the view again, as in (a))
                again = _server_pid(cache_path)
                for placement in PLACEMENTS:
                    with placed(placement, (again, remote.info.backend_pid)):
                        via, straight = paired(
                            [lookup(served, stream), lookup(remote, stream)],
                            max(200, args.calls // 5),
                        )
                    where = _placed(placement)
                    row(
                        "c",
                        f"point hit vs the backend 1 ms away (p50){where}",
                        p50(via) * 1e3,
                        p50(straight) * 1e3,
                        "<= 0.1x",
                    )
                    row(
                        "c",
                        f"point hit vs the backend 1 ms away (p99){where}",
                        p99(via) * 1e3,
                        p99(straight) * 1e3,
                        "<= 0.1x",
                    )
                served.close()
                remote.close()
        finally:
            proxy.close()

        # (e) TLS: a client's start and a hit over TLS vs without, on one server; (f) the
        # metrics: hits on a server with --metrics, scraped every second, vs a server without
        # (each placed on the client's CPU, as (a)'s "one CPU": unpinned, the two servers
        # may find different placements, which costs more than what is measured)
        cert, key = tls_files(work)
        metrics_port = free_port()
        with (
            mtcache_server(
                backend, work / "tls.duckdb", log, "--tls-cert", str(cert), "--tls-key", str(key)
            ) as tls_port,
            mtcache_server(
                backend, work / "metrics.duckdb", log, "--metrics", f"127.0.0.1:{metrics_port}"
            ) as measured_port,
            mtcache_server(backend, work / "plain.duckdb", log) as plain_port,
            mtcache_server(backend, work / "twin.duckdb", log) as twin_port,
        ):
            for port in (tls_port, measured_port, plain_port, twin_port):
                cached_accounts(port)
            pids = {
                name: _server_pid(work / f"{name}.duckdb")
                for name in ("tls", "metrics", "plain", "twin")
            }
            secure = dsn_at(tls_port, DATABASE, BOUND) + " sslmode=require"
            clear = dsn_at(tls_port, DATABASE, BOUND) + " sslmode=disable"
            starts = max(100, args.calls // 20)
            with_tls, without_tls, postgres = paired(
                [
                    connect_once(secure),
                    connect_once(clear),
                    connect_once(dsn_at(backend_port, DATABASE)),
                ],
                starts,
            )
            row(
                "e",
                "a client's start (connect, SELECT 1, close) over TLS vs without (p50)",
                p50(with_tls) * 1e3,
                p50(without_tls) * 1e3,
                "(cost of TLS)",
            )
            row(
                "e",
                "a client's start without TLS: the server vs PostgreSQL's own (p50)",
                p50(without_tls) * 1e3,
                p50(postgres) * 1e3,
                "(for reference)",
            )
            over_tls = psycopg.connect(secure, autocommit=True)
            in_clear = psycopg.connect(clear, autocommit=True)
            scraped_conn = psycopg.connect(dsn_at(measured_port, DATABASE, BOUND), autocommit=True)
            unscraped = psycopg.connect(dsn_at(plain_port, DATABASE, BOUND), autocommit=True)
            # (a second server without --metrics: two servers alike differ by this much)
            twin = psycopg.connect(dsn_at(twin_port, DATABASE, BOUND), autocommit=True)
            conns = (over_tls, in_clear, scraped_conn, unscraped, twin)
            for conn in conns:
                for key in draw.sample(range(1, accounts + 1), 20):
                    got = conn.execute(POINT, [key], prepare=True).fetchall()
                    assert got == direct.execute(POINT, [key], prepare=True).fetchall(), key
            time.sleep(INDEX_SECONDS)  # (each server indexes the view, as in (a))
            stream = keys(False)
            for conn in conns:  # (warm: every lookup from here on answered by the index)
                for _ in range(200):
                    lookup(conn, stream)()
            with placed("one CPU", [pids["tls"]]):
                via_tls, via_clear = paired(
                    [lookup(over_tls, stream), lookup(in_clear, stream)], args.calls
                )
            row(
                "e",
                "point lookup over TLS vs without (p50)",
                p50(via_tls) * 1e3,
                p50(via_clear) * 1e3,
                "(cost of TLS)",
            )
            stop = threading.Event()
            scraper = threading.Thread(
                target=scraping, args=(f"http://127.0.0.1:{metrics_port}/metrics", stop)
            )
            scraper.start()
            calls = max(args.calls, 10_000)  # (seconds of lookups: the scrapes among them)
            try:
                with placed("one CPU", [pids["metrics"], pids["plain"], pids["twin"]]):
                    scraped, plain_hits, twin_hits = paired(
                        [
                            lookup(scraped_conn, stream),
                            lookup(unscraped, stream),
                            lookup(twin, stream),
                        ],
                        calls,
                    )
            finally:
                stop.set()
                scraper.join()
            row(
                "f",
                "point lookup p50, --metrics scraped every second vs no --metrics",
                p50(scraped) * 1e3,
                p50(plain_hits) * 1e3,
                "<= 1.02x",
            )
            row(
                "f",
                "point lookup p99, --metrics scraped every second vs no --metrics",
                p99(scraped) * 1e3,
                p99(plain_hits) * 1e3,
                "",
            )
            row(
                "f",
                "point lookup p50, two servers without --metrics (how alike)",
                p50(twin_hits) * 1e3,
                p50(plain_hits) * 1e3,
                "(noise floor)",
            )
            for conn in conns:
                conn.close()
        direct.close()

        table = Table(title=f"mtcache serve, pgbench scale {args.scale}: side by side in one run")
        for column in ("fig", "what", "server", "baseline", "unit", "ratio", "target"):
            table.add_column(column)
        for r in rows:
            table.add_row(
                r["figure"],
                r["what"],
                _num(r["server"]),
                _num(r["baseline"]),
                r["unit"],
                "" if math.isnan(r["ratio"]) else f"{r['ratio']:.2f}x",
                r["target"],
            )
        console.print(table)
        path = append_rows(
            "bench_server",
            [
                {
                    "experiment": "bench_server",
                    "scale": args.scale,
                    "seconds": args.seconds,
                    "calls": args.calls,
                    **{k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()},
                }
                for r in rows
            ],
        )
        console.print(f"results appended to {path}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _placed(placement: str | None) -> str:
    """How a figure's name says where its processes ran (`PLACEMENTS`)."""
    return "" if placement is None else f", {placement}"


def _server_pid(cache_path: Path) -> int:
    found = served_at(cache_path)
    assert found is not None, f"no server of {cache_path}"
    return found.pid


def _backend_pids(conn: psycopg.Connection[t.Any]) -> list[int]:
    """The backends of the benchmark's database, ``conn``'s own included."""
    found = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s", [DATABASE]
    ).fetchall()
    return [int(pid) for (pid,) in found]


def _backends(conn: psycopg.Connection[t.Any]) -> int:
    """How many backends of the benchmark's database there are, besides ``conn``'s own."""
    return len(_backend_pids(conn)) - 1


def _num(value: float) -> str:
    if math.isnan(value):
        return ""
    return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"


if __name__ == "__main__":
    raise SystemExit(main())
