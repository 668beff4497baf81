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
    proxy of this module's own): hits through the server vs the backend through the proxy
    (target <= 0.1x), placed as (a) is;
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
import contextlib
import math
import os
import queue
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
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
from cache.private_files import SERVER_USER
from cache.server.process import client_environment, serving_process
from cache.store.served import served_at
from experiments.provenance import append_rows

DATABASE = "mtcache_bench_server"
BOUND = "-c mtcache.currency_bound=600"  # a session bound given at startup, as pgbench can
POINT = "SELECT abalance FROM pgbench_accounts WHERE aid = %s"
CLIENTS = (1, 8, 32, 128)
INDEX_SECONDS = 10  # time given to the server to build the lookup index of the cached view


# -- the processes -------------------------------------------------------------------------------


def dsn_at(port: int, dbname: str, options: str | None = None) -> str:
    text = f"host=127.0.0.1 port={port} user=postgres dbname={dbname}"
    return text + (f" options='{options}'" if options else "")


@contextlib.contextmanager
def mtcache_server(backend: str, cache_path: Path, log: Path, *options: str) -> Iterator[int]:
    """`mtcache serve [options]` as its own process; yields its port."""
    with log.open("ab") as sink, serving_process(backend, cache_path, *options, log=sink) as served:
        yield served.port


def tls_files(work: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (readable by its owner only), from a CA of
    trustme's: the server's TLS for (e)."""
    import trustme

    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1")
    cert, key = work / "server.pem", work / "server.key"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    key.chmod(0o600)
    return cert, key


def connect_once(dsn: str) -> Callable[[], object]:
    """A connection set up, asked one thing and closed: what a client's start costs."""

    def run() -> object:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return conn.execute("SELECT 1").fetchone()

    return run


def cached_accounts(port: int) -> None:
    with psycopg.connect(dsn_at(port, DATABASE), autocommit=True) as admin:
        admin.execute(
            "CREATE CACHED VIEW accounts AS SELECT * FROM pgbench_accounts REFRESH EVERY 10 MIN"
        )
        admin.execute("REFRESH CACHED VIEW accounts")


def scraping(url: str, stop: threading.Event) -> None:
    """Scrape the metrics endpoint every second, as Prometheus would, until ``stop``."""
    import urllib.request

    while not stop.wait(1.0):
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as answer:
            answer.read()


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if found is None:
        raise RuntimeError(
            "pgbouncer is not installed: `make test` installs it "
            "(scripts/ensure-system-deps.sh), or apt-get install pgbouncer"
        )
    return found


@contextlib.contextmanager
def pgbouncer(backend_port: int, work: Path) -> Iterator[tuple[int, int]]:
    """pgbouncer (session pooling, trust) in front of the backend; yields its port and pid."""
    port = free_port()
    config = work / "pgbouncer.ini"
    config.write_text(
        "[databases]\n"
        f"{DATABASE} = host=127.0.0.1 port={backend_port} dbname={DATABASE} user=postgres\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "auth_type = any\npool_mode = session\nmax_client_conn = 1000\n"
        f"default_pool_size = {max(CLIENTS) + 8}\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        "logfile =\nlog_connections = 0\nlog_disconnections = 0\n"
    )
    os.chmod(work, 0o755)
    os.chmod(config, 0o644)
    argv = [pgbouncer_binary(), str(config)]
    if os.geteuid() == 0:  # pgbouncer will not run as root
        argv[1:1] = ["-u", SERVER_USER]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(dsn_at(port, DATABASE), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    said = proc.stderr.read().decode() if proc.stderr else ""
                    raise RuntimeError(f"pgbouncer did not start: {said}") from None
                time.sleep(0.1)
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


@contextlib.contextmanager
def byte_pipe(backend_port: int) -> Iterator[tuple[int, int]]:
    """`experiments.byte_pipe` in front of the backend, as its own process; yields its port
    and pid."""
    argv = [sys.executable, "-m", "experiments.byte_pipe", str(backend_port)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            said = proc.stdout.readline().strip()
            if not said.isdigit():
                proc.kill()
                raise RuntimeError(f"the byte pipe did not start: {proc.stderr.read()!r}")
            yield int(said), proc.pid
        finally:
            proc.terminate()


class DelayProxy:
    """A TCP proxy that delays every byte by ``one_way`` seconds in each direction (a round
    trip of twice that), keeping order: a reader thread stamps what arrives, a writer thread
    sends it when due."""

    def __init__(self, target: tuple[str, int], one_way: float) -> None:
        self.target = target
        self.one_way = one_way
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._pipe(client, upstream)
            self._pipe(upstream, client)

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        due: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

        def read() -> None:
            with contextlib.suppress(OSError):
                while data := source.recv(65536):
                    due.put((time.perf_counter() + self.one_way, data))
            due.put((0.0, b""))

        def write() -> None:
            while True:
                at, data = due.get()
                if not data:
                    break
                while (wait := at - time.perf_counter()) > 0:
                    time.sleep(wait)
                try:
                    sink.sendall(data)
                except OSError:
                    break
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self._listener.close()


# -- measuring -----------------------------------------------------------------------------------


def lookup(conn: psycopg.Connection[t.Any], keys: Iterator[int]) -> Callable[[], object]:
    """One prepared point lookup of the next key on ``conn``."""
    return lambda: conn.execute(POINT, [next(keys)], prepare=True).fetchall()


def paired(actions: t.Sequence[Callable[[], object]], calls: int) -> list[list[float]]:
    """Seconds per call of each action, the actions taking turns call by call (the order
    rotating every round) so all see the same machine conditions."""
    samples: list[list[float]] = [[] for _ in actions]
    clock = time.perf_counter
    n = len(actions)
    for round_ in range(calls):
        for k in range(n):
            which = (round_ + k) % n
            started = clock()
            actions[which]()
            samples[which].append(clock() - started)
    return samples


# where (a) runs its client and its two servers: None, as the scheduler places them; "one
# CPU", all three on the first CPU; "two CPUs", the client on the first, the servers on the
# second. On a machine of two CPUs a round trip that wakes a process on the other CPU costs
# about 100 us more than one that stays on the same CPU, and a process keeps the placement it
# found for the whole run: unpinned, one server may get the cheap one and the other not
PLACEMENTS = (None, "one CPU", "two CPUs")


@contextlib.contextmanager
def placed(placement: str | None, servers: t.Sequence[int]) -> Iterator[None]:
    """This process (the client) and every thread of ``servers`` pinned for ``placement``
    (`PLACEMENTS`), unpinned again after."""
    cpus = sorted(os.sched_getaffinity(0))
    if placement is None or len(cpus) < 2:
        yield
        return
    client, server = cpus[0], cpus[0] if placement == "one CPU" else cpus[1]

    def pin(pid: int, where: set[int]) -> None:
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(task), where)

    try:
        os.sched_setaffinity(0, {client})
        for pid in servers:
            pin(pid, {server})
        yield
    finally:
        os.sched_setaffinity(0, set(cpus))
        for pid in servers:
            pin(pid, set(cpus))


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def pgbench(port: int, clients: int, seconds: int, options: str | None = None) -> float:
    """TPS of ``pgbench -S -M prepared`` against the server at ``port``."""
    env = client_environment("127.0.0.1", port, DATABASE, options=options)
    run = subprocess.run(
        [
            "pgbench",
            "-S",
            "-M",
            "prepared",
            "-n",
            "-c",
            str(clients),
            "-j",
            str(min(clients, 2)),
            "-T",
            str(seconds),
        ],
        env=env,
        text=True,
        capture_output=True,
        timeout=seconds * 5 + 120,
        check=False,
    )
    found = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", run.stdout)
    failed = re.search(r"number of failed transactions: (\d+)", run.stdout)
    if run.returncode != 0 or found is None or (failed and failed.group(1) != "0"):
        raise RuntimeError(f"pgbench failed at port {port}: {run.stderr or run.stdout}")
    return float(found.group(1))


def backend_cpu(data_dir: Path) -> float:
    """CPU seconds used so far by the backend's processes (the postmaster and its children)."""
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry.name), int(fields[1])
        if postmaster in (pid, ppid):
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


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
