"""Over the wire: the cache as `mtcache serve`, its clients through the protocol, a faulty
network between it and the backend."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import random
import signal
import socket
import subprocess
import time
import typing as t
from dataclasses import dataclass

import psycopg

import cache
from experiments.chaos.owner import Owner
from experiments.chaos.run import Run, restart_backend
from experiments.chaos.world import ACCOUNTS, GROUPS
from experiments.faulty_network import FaultyNetwork

# -- over the wire: the cache as `mtcache serve`, its clients through the protocol --------------


@dataclass
class Wire:
    """What a run over the wire adds: the server's address and process, the faulty network
    between it and the backend, and the clients' journal."""

    port: int
    network: FaultyNetwork
    backend: str  # the server's backend DSN: through the faulty network
    clients: Owner | None = None
    server: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def wire_supervisor(run: Run, wire: Wire) -> None:
    """Runs `mtcache serve` over the cache file, and starts it again whenever it dies before
    the deadline; at the deadline it is stopped (SIGTERM) so the file can be checked."""
    from cache.server.process import mtcache_executable
    from cache.store.served import served_at

    number = 0
    while run.deadline - time.time() > 3:
        number += 1
        argv = [
            mtcache_executable(),
            "--backend",
            wire.backend,
            "--cache",
            str(run.cache_path),
            "serve",
            "--listen",
            wire.address,
            "--pool-size",
            "3",
            "--grace",
            "1",
        ]
        with (run.work / f"server-{number}.log").open("wb") as log, run.lock:
            wire.server = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
            run.owner = wire.server  # (what the fault thread SIGKILLs)
        while wire.server.poll() is None and run.running():
            time.sleep(0.1)
        stopped = wire.server.poll() is None
        if stopped:  # the deadline: stopped, as an operator would
            wire.server.send_signal(signal.SIGTERM)
        code = wire.server.wait()
        with run.lock:
            killed, run.killing = run.killing, False
        if stopped and code == -signal.SIGTERM:
            pass  # (stopped while it was still starting, before it handles SIGTERM)
        elif code == -signal.SIGKILL and killed:
            run.note(run.faults, "server SIGKILLed (started again)")
        elif code != 0:
            tail = (run.work / f"server-{number}.log").read_text(errors="replace")[-2000:]
            if code == 1 and "mtcache: BackendUnavailableError" in tail:  # its one line
                run.note(run.errors, "server: refused to start, the backend unreachable")
            else:
                run.note(run.errors, f"VIOLATION the cache server died ({code}): {tail}")
        while served_at(run.cache_path) is not None and time.time() < run.deadline:
            time.sleep(0.05)  # (its note goes with it)
    run.incarnations_served = number


def wire_maintainer(run: Owner, completeness: bool = True) -> None:
    """Refreshes, admissions and evictions through the server (its refresh scheduler runs
    there too); ``completeness``: completeness regions admitted and evicted too."""
    rng = random.Random(run.seed * 1000 + 7)
    conn = None
    actions = ["refresh_all", "refresh_hot", "admit", "evict", "admit_grp", "evict_grp"]
    if completeness:
        actions += ["admit_complete", "evict_complete"]
    while run.running():
        action = rng.choice(actions)
        began = time.time()
        try:
            if conn is None:
                conn = cache.connect(run.dsn, server=run.server, autocommit=True)
            admin = conn.admin
            if action.startswith("refresh"):
                admin.refresh("acct_all" if action == "refresh_all" else "acct_hot")
            else:
                control, low, span = {
                    "admit": ("acct_pct", 1, ACCOUNTS),
                    "admit_grp": ("grp_csct", 0, GROUPS),
                    "admit_complete": ("grp_cpct", 0, GROUPS),
                }[action.replace("evict", "admit")]
                key = rng.randrange(low, low + span)
                (admin.admit if action.startswith("admit") else admin.evict)(control, [key])
            run.note("operations", f"maintain {action}")
            run.journal.write("event", at=began, what=f"{action} {began:.3f}-{time.time():.3f}")
        except cache.Error as exc:
            run.note("errors", f"maintainer: {type(exc).__name__}")
            if conn is not None:
                with contextlib.suppress(cache.Error):
                    conn.close()
            conn = None
        time.sleep(rng.uniform(0.05, 0.3))
    if conn is not None:
        with contextlib.suppress(cache.Error):
            conn.close()


def disconnector(run: Owner, run_faults: t.Callable[[str], None]) -> None:
    """A client of the server that walks away: its socket shut mid-statement or inside a
    transaction that wrote (the server must cancel it and roll it back), or its statement
    cancelled (inside a transaction that wrote too, then rolled back). The rows it writes
    (chaos_abandoned) must never be committed."""
    rng = random.Random(run.seed * 1000 + 11)
    assert run.server is not None
    host, _, port = run.server.rpartition(":")
    info = psycopg.conninfo.conninfo_to_dict(run.dsn)
    target = psycopg.conninfo.make_conninfo(
        host=host, port=port, user=str(info["user"]), dbname=str(info["dbname"])
    )
    serial = run.seed * 1_000_000
    while run.running():
        time.sleep(rng.uniform(0.2, 1.0))
        kind = rng.choice(
            [
                "disconnect mid-statement",
                "disconnect mid-transaction",
                "cancel",
                "cancel mid-transaction",
            ]
        )
        serial += 1
        try:
            conn = psycopg.connect(target, autocommit="transaction" not in kind, connect_timeout=5)
        except psycopg.Error:
            continue  # (the server is starting again)
        worker = concurrent.futures.ThreadPoolExecutor(1)
        try:
            if "transaction" in kind:
                conn.execute("INSERT INTO chaos_abandoned VALUES (%s)", [serial])
            running = worker.submit(conn.execute, "SELECT pg_sleep(2)")
            time.sleep(rng.uniform(0.05, 0.4))
            if kind.startswith("disconnect"):
                with (
                    contextlib.suppress(OSError),
                    socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock,
                ):
                    sock.shutdown(socket.SHUT_RDWR)
            else:
                conn.cancel_safe()
            with contextlib.suppress(psycopg.Error):
                running.result(timeout=30)
            if kind == "cancel mid-transaction":
                conn.rollback()
            run_faults(f"client {kind}")
        except (psycopg.Error, concurrent.futures.TimeoutError) as exc:
            run.note("errors", f"disconnector: {type(exc).__name__}")
        finally:
            conn.close()  # (never a commit: what it wrote is abandoned)
            worker.shutdown(wait=False)


def wire_faults(run: Run, wire: Wire) -> None:
    """The run's faults over the wire: the backend restarted, the server SIGKILLed, backend
    sessions terminated, and the network between server and backend delaying, dropping and
    resetting its connections."""
    rng = random.Random(run.seed * 1000 + 900)
    next_restart = time.time() + rng.uniform(8, 15)
    next_kill = time.time() + rng.uniform(10, 20)
    while run.running():
        time.sleep(rng.uniform(0.5, 2.0))
        if not run.running():
            break
        now = time.time()
        if run.restart is not None and now > next_restart:
            restart_backend(run)
            next_restart = time.time() + rng.uniform(10, 25)
            continue
        if now > next_kill:
            with run.lock:
                up = wire.server is not None and wire.server.poll() is None
                if up and wire.server is not None:
                    run.killing = True
                    wire.server.send_signal(signal.SIGKILL)
            next_kill = time.time() + (rng.uniform(10, 25) if up else 1)  # (up again soon)
            continue
        fault = rng.choice(["delay", "drop", "reset", "terminate"])
        if fault == "delay":
            wire.network.delay(rng.uniform(0.02, 0.2), rng.uniform(1, 4))
            run.note(run.faults, "network delayed")
        elif fault in ("drop", "reset"):
            if wire.network.drop() if fault == "drop" else wire.network.reset():
                run.note(
                    run.faults,
                    f"network {'dropped' if fault == 'drop' else 'reset'} "
                    "the server's backend connections",
                )
        else:
            with (
                contextlib.suppress(psycopg.Error),
                psycopg.connect(run.dsn, autocommit=True) as pg,
            ):
                victims = pg.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                ).fetchall()
                if victims:
                    pg.execute("SELECT pg_terminate_backend(%s)", (rng.choice(victims)[0],))
                    run.note(run.faults, "pg_terminate_backend")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
