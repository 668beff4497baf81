"""The rig of the server's benchmark (`experiments.bench_server`): the processes it measures
(the cache server, pgbouncer, a byte pipe, a delay proxy), and how it measures them (paired
calls, pgbench, the backend's CPU, a process's memory)."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import typing as t
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg

from cache.backend.embedded_pg import free_port
from cache.private_files import SERVER_USER
from cache.server.process import client_environment, serving_process

DATABASE = "mtcache_bench_server"
POINT = "SELECT abalance FROM pgbench_accounts WHERE aid = %s"
CLIENTS = (1, 8, 32, 128)  # pgbench's clients in (b)


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
