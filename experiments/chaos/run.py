"""The run (this process): its writers, the owner's incarnations and the faults injected."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
import typing as t
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from experiments.chaos.world import FAULTS, read_journal, spark_pending, turns_taken, write

# -- the run (this process): writers, faults, the owner's incarnations, the check ---------------


@dataclass
class Run:
    dsn: str
    cache_path: Path
    seed: int
    deadline: float
    work: Path
    spark: bool
    restart: t.Callable[[], None] | None = None  # stops and starts the backend, when we may
    commits: dict[int, float] = field(default_factory=dict)  # tick -> when COMMIT returned
    faults: Counter[str] = field(default_factory=Counter)
    operations: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    outages: list[tuple[float, float]] = field(default_factory=list)
    incarnations: list[Path] = field(default_factory=list)  # their journals
    owner: subprocess.Popen[bytes] | None = None
    killing: bool = False  # the fault thread is SIGKILLing the owner
    incarnations_served: int = 0  # over the wire: how many times the server started
    lock: threading.Lock = field(default_factory=threading.Lock)

    def running(self) -> bool:
        return time.time() < self.deadline

    def note(self, counter: Counter[str], key: str) -> None:
        with self.lock:
            counter[key] += 1


def writer(run: Run, number: int) -> None:
    rng = random.Random(run.seed * 1000 + number)
    while run.running():
        try:
            with psycopg.connect(run.dsn) as pg:
                while run.running():
                    tick = write(pg, rng)
                    with run.lock:
                        run.commits[tick.tick] = tick.committed
                    run.note(run.operations, "write")
                    time.sleep(rng.uniform(0, 0.02))
        except psycopg.Error as exc:  # a terminated session: a fault, retried
            run.note(run.errors, f"writer: {type(exc).__name__}")
            time.sleep(0.05)


def supervisor(run: Run) -> None:
    """Starts the owner, and starts it again whenever it dies before the deadline."""
    number = 0
    while run.deadline - time.time() > 3:
        number += 1
        journal = run.work / f"owner-{number}.jsonl"
        faults_done = turns_taken([r for path in run.incarnations for r in read_journal(path)])
        config = {
            "dsn": run.dsn,
            "cache_path": str(run.cache_path),
            "seed": run.seed,
            "deadline": run.deadline,
            "incarnation": number,
            "journal": str(journal),
            "spark": run.spark,
            "faults_done": faults_done,
            "deadline_file": str(run.work / DEADLINE_FILE),
        }
        with (run.work / f"owner-{number}.log").open("wb") as log, run.lock:
            run.incarnations.append(journal)
            run.owner = subprocess.Popen(
                [sys.executable, "-m", "experiments.chaos", "--owner", json.dumps(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        code = run.owner.wait()
        with run.lock:
            killed, run.killing = run.killing, False
        if code == 0:
            continue
        records = read_journal(journal)
        armed = [r for r in records if r["kind"] in ("armed", "disarmed")]
        if code == -signal.SIGKILL and killed:
            run.note(run.faults, "owner SIGKILLed (reopened)")
        elif code == -signal.SIGKILL and armed and armed[-1]["kind"] == "armed":
            run.note(run.faults, f"refresh killed at {armed[-1]['point']} (owner reopened)")
        else:
            tail = (run.work / f"owner-{number}.log").read_text(errors="replace")[-2000:]
            run.note(run.errors, f"VIOLATION the cache's process died ({code}): {tail}")


EXTEND_BY = 15.0  # seconds: how much longer a run goes on while a fault kind had no turn
DEADLINE_FILE = "deadline"  # in the run's directory: the deadline, once it moved


def extender(run: Run, until: float) -> None:
    """Keeps the run going past its deadline, up to ``until``, while a fault kind has not had
    its turn: a loaded machine takes the turns slower (a JVM's start, most of all), and what
    the run checks is that every kind was survived, not how long it took. An owner
    reads the new deadline from the run's directory once its own has passed."""
    while run.running():
        time.sleep(1.0)
        if run.deadline - time.time() > 10.0 or time.time() >= until:
            continue
        done = turns_taken([r for path in list(run.incarnations) for r in read_journal(path)])
        if any(not done[p] for kind, p in FAULTS if kind != "spark" or run.spark):
            with run.lock:
                run.deadline = min(run.deadline + EXTEND_BY, until)
                (run.work / DEADLINE_FILE).write_text(repr(run.deadline))


def restart_backend(run: Run) -> None:
    """The backend stopped and started again (``run.restart``), its outage noted."""
    assert run.restart is not None
    down = time.time()
    run.restart()
    with run.lock:
        run.outages.append((down, time.time()))
        run.faults["backend restart"] += 1


def fault_injector(run: Run) -> None:
    rng = random.Random(run.seed * 1000 + 900)
    next_restart = time.time() + rng.uniform(5, 10)
    next_kill = time.time() + rng.uniform(15, 30)
    held_until = next_kill + 30  # a JVM that never starts does not stop the kills for good
    while run.running():
        time.sleep(rng.uniform(0.5, 2.0))
        if not run.running():
            break
        if run.restart is not None and time.time() > next_restart:
            restart_backend(run)
            next_restart = time.time() + rng.uniform(8, 20)
            continue
        if time.time() > next_kill:
            done = turns_taken([r for path in list(run.incarnations) for r in read_journal(path)])
            if spark_pending(done, run.spark) and time.time() < held_until:
                next_kill = time.time() + 5  # the JVM it would take down is Spark's first turn
                continue
            with run.lock:
                if run.owner is not None and run.owner.poll() is None:
                    run.killing = True
                    run.owner.send_signal(signal.SIGKILL)
            next_kill = time.time() + rng.uniform(20, 40)
            continue
        try:
            with psycopg.connect(run.dsn, autocommit=True) as pg:
                victims = pg.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                ).fetchall()
                if victims:
                    (pid,) = rng.choice(victims)
                    pg.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    run.note(run.faults, "pg_terminate_backend")
        except psycopg.Error:
            pass
