"""A randomized concurrent C&C checker (issue 10), in the spirit of Jepsen/Elle.

    python -m experiments.chaos [--seconds 60] [--seed N] [--backend DSN] [--no-spark]

Writer threads commit transactions on PostgreSQL that leave checkable traces: each takes the
next tick of one clock row (so commits are totally ordered), bumps the versions of a few
accounts and of their entries, and logs what it wrote with the backend's clock. The cache lives
in a process of its own (the *owner*, as an application's would), which this one starts, kills
and restarts: in it, reader threads - each with a cache connection of its own - issue random
queries (point, range, group through a completeness region, gray-child join as one class and as
two classes with bounds of their own, aggregates with and without BY groups, TIMEORDERED
brackets, reads after their own writes) with random bounds; a maintenance thread refreshes,
admits and evicts (inline and Spark), and the refresh scheduler runs on its own. Every answer is
journaled (JSON lines) with its start and end time and checked afterwards
(experiments/chaos_check.py) against the backend's log: one snapshot per consistency unit, no
older than the bound allowed at the query's start, TIMEORDERED never back, a session's own
writes seen. At the end every cached region must equal the backend's rows at one snapshot no
older than the region claims.

Faults: backend sessions terminated (the cache's included), the backend restarted (embedded
cluster only: answers given while it was down are counted), refreshes failing at each fault
point, refreshes killed at each fault point (the owner dies by SIGKILL there), the owner
SIGKILLed at random moments and reopened, Spark tasks failing (raised and killed workers).

Over the wire (``--wire``): the cache's process is `mtcache serve` (with transaction
pooling), and the readers, the maintainer and a disconnecting client drive it through
PostgreSQL's protocol (`cache.connect(server=...)`, psycopg). Its faults: the server SIGKILLed
and started again, clients disconnecting mid-statement and mid-transaction, cancels (inside
transactions too), backend sessions terminated, the backend restarted, and a faulty network
between the server and the backend (`experiments.faulty_network`: delays, dropped and reset
connections). Besides every answer and region, it checks that nothing of a transaction a
client abandoned (by disconnecting or after a cancel) was ever committed.
Prints the operations checked, faults injected and violations (0 is the only passing number);
a seed reproduces the run's choices (thread timing still varies).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import functools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import typing as t
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql
from rich.console import Console

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from cache.maintenance import background, faults
from cache.maintenance.engines import Engine
from cache.maintenance.pipeline import Maintainer
from experiments.chaos_check import Observation, Tick, Timeline, Unit, Verdict, check
from experiments.faulty_network import FaultyNetwork
from experiments.provenance import append_rows
from sql_ext.quoting import ident

ACCOUNTS = 24
ENTRIES_PER_ACCOUNT = 2
ENTRY_BASE = 1000  # entry ids: 1001.. (one id space with the accounts' for the history)
GROUPS = 4
DATABASE = "mtcache_chaos"

BACKEND_SCHEMA = f"""
DROP TABLE IF EXISTS chaos_clock, chaos_log, entries, accounts, chaos_abandoned;
CREATE TABLE chaos_abandoned (id bigint PRIMARY KEY);
CREATE TABLE chaos_clock (id int PRIMARY KEY, tick bigint NOT NULL);
INSERT INTO chaos_clock VALUES (1, 0);
CREATE TABLE accounts (id int PRIMARY KEY, grp int NOT NULL, version bigint NOT NULL);
INSERT INTO accounts SELECT g, g % {GROUPS}, 0 FROM generate_series(1, {ACCOUNTS}) g;
CREATE TABLE entries (id int PRIMARY KEY, account int NOT NULL REFERENCES accounts,
                      version bigint NOT NULL);
INSERT INTO entries SELECT {ENTRY_BASE} + g, (g - 1) % {ACCOUNTS} + 1, 0
    FROM generate_series(1, {ACCOUNTS * ENTRIES_PER_ACCOUNT}) g;
CREATE TABLE chaos_log (tick bigint PRIMARY KEY, writes jsonb NOT NULL,
                        visible_after float8 NOT NULL)
"""

# acct_hot: a presence-controlled view with a completeness region per group and a gray child
# (entries follow their account's region); acct_all: fully materialized, consistent per group.
CACHE_SCHEMA = """
CREATE CONTROL TABLE acct_pct (id INTEGER);
CREATE CONTROL TABLE grp_cpct (grp INTEGER);
CREATE CONTROL TABLE grp_csct (grp INTEGER);
CREATE CACHED VIEW acct_hot AS SELECT id, grp, version FROM accounts
    PRESENCE ON (id) IN acct_pct COMPLETENESS ON (grp) IN grp_cpct REFRESH EVERY 5 SEC;
CREATE CACHED VIEW entry_hot AS SELECT id, account, version FROM entries
    PRESENCE ON (account) IN acct_hot (id) CONSISTENCY ROOT;
CREATE CACHED VIEW acct_all AS SELECT id, grp, version FROM accounts
    CONSISTENCY ON (grp) IN grp_csct REFRESH EVERY 5 SEC
"""

FAIL_POINTS = [p for p in faults.POINTS if p != "task"] + ["after_snapshot:disconnect"]
KILL_POINTS = [f"{p}:kill" for p in faults.POINTS if p != "task"]
SPARK_FAULTS = ["task", "task:kill"]  # a task raising; a task's Python worker killed
# in turns: Spark's before the kills, so that its JVM has had time to start since the last kill
FAULTS = (
    [("fail", p) for p in FAIL_POINTS]
    + [("spark", p) for p in SPARK_FAULTS]
    + [("kill", p) for p in KILL_POINTS]
)


def next_fault(done: collections.Counter[str], spark: bool, ready: bool) -> tuple[str, str]:
    """The kind whose turns are fewest (in FAULTS order on a tie). Spark's wait for the JVM;
    meanwhile the others go, except a kill that is ahead of them: a kill restarts the
    owner and its JVM, so kills wait for Spark's turns (a slow start on a busy machine must
    starve neither)."""
    lowest_spark = min((done[p] for k, p in FAULTS if k == "spark"), default=0)
    possible = [
        (kind, point)
        for kind, point in FAULTS
        if (kind != "spark" or (spark and ready))
        and (kind != "kill" or not spark or done[point] <= lowest_spark)
    ]
    return min(possible, key=lambda f: (done[f[1]], FAULTS.index(f)))


def turns_taken(records: list[dict[str, t.Any]]) -> collections.Counter[str]:
    """Each fault point's turns in the journal records: armed, less the kills that missed
    (the refresh failed before reaching the point; the owner lived on)."""
    done = collections.Counter(r["point"] for r in records if r["kind"] == "armed")
    done.subtract(r["point"] for r in records if r["kind"] == "disarmed" and r.get("missed"))
    return done


def spark_pending(done: collections.Counter[str], spark: bool) -> bool:
    """A Spark fault kind has not had its first turn: a random SIGKILL of the owner waits
    (each restarts the JVM, and under load a JVM start is most of the time between kills)."""
    return spark and any(not done[p] for k, p in FAULTS if k == "spark")


def group_of(account: int) -> int:
    return account % GROUPS


def entries_of(account: int) -> list[int]:
    return [ENTRY_BASE + account + ACCOUNTS * k for k in range(ENTRIES_PER_ACCOUNT)]


def account_of(entry: int) -> int:
    return (entry - ENTRY_BASE - 1) % ACCOUNTS + 1


# -- the journal: what the owner did, as JSON lines --------------------------------------------


class Journal:
    """Appends one JSON line per record, each with a single write: a process killed at any
    moment leaves whole lines and at most one torn last line (ignored when read)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._lock = threading.Lock()

    def write(self, kind: str, **fields: t.Any) -> None:
        line = (json.dumps({"kind": kind, **fields}) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        os.close(self._fd)


def logged_failures(work: Path) -> dict[str, int]:
    """The exceptions the cache's processes logged with a traceback (their last lines, and
    how often): not violations, but each a failure of the cache worth reading (the logs go
    with the run's directory)."""
    found: collections.Counter[str] = collections.Counter()
    for log in sorted(work.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        for n, line in enumerate(lines):
            if not line.startswith("Traceback (most recent call last)"):
                continue
            end = n + 1
            while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end]):
                end += 1
            after = next((x for x in lines[end + 1 :] if x.strip()), "")
            if end < len(lines) and not after.startswith(
                ("During handling of the above", "The above exception was")
            ):
                found[lines[end][:200]] += 1  # (of a chain, the last exception's line)
    return dict(found.most_common())


def read_journal(path: Path) -> list[dict[str, t.Any]]:
    """Its whole records (none if the process died before writing any)."""
    if not path.exists():
        return []
    records = []
    for line in path.read_bytes().splitlines():
        with contextlib.suppress(ValueError):  # the torn last line of a killed process
            records.append(json.loads(line))
    return records


def observation_from(record: dict[str, t.Any]) -> Observation:
    fields = {k: v for k, v in record.items() if k != "kind"}
    units = tuple(
        Unit(
            rows=tuple(tuple(r) for r in u["rows"]),
            groups=tuple(tuple(g) for g in u["groups"]),
            bound=u["bound"],
            floor_tick=u["floor_tick"],
        )
        for u in fields.pop("units")
    )
    return Observation(units=units, **fields)


# -- writers (this process) ----------------------------------------------------------------------


def write(conn: t.Any, rng: random.Random) -> Tick:
    """One writer transaction through ``conn`` (psycopg, or the cache's DB-API connection):
    the next tick, a few accounts' and entries' versions bumped, the log row with the backend's
    clock just before COMMIT."""
    accounts = sorted(rng.sample(range(1, ACCOUNTS + 1), rng.randint(1, 3)))
    entries = sorted(rng.sample([e for a in accounts for e in entries_of(a)], rng.randint(0, 2)))
    cur = conn.cursor()
    cur.execute("UPDATE chaos_clock SET tick = tick + 1 WHERE id = 1 RETURNING tick")
    (tick,) = cur.fetchone()
    cur.execute(
        "UPDATE accounts SET version = version + 1 WHERE id = ANY(%s) RETURNING id, version",
        (accounts,),
    )
    writes = {int(i): int(v) for i, v in cur.fetchall()}
    if entries:
        cur.execute(
            "UPDATE entries SET version = version + 1 WHERE id = ANY(%s) RETURNING id, version",
            (entries,),
        )
        writes |= {int(i): int(v) for i, v in cur.fetchall()}
    cur.execute(
        "INSERT INTO chaos_log VALUES (%s, %s, "
        "extract(epoch FROM clock_timestamp())::float8) RETURNING visible_after",
        (tick, json.dumps(writes)),
    )
    (visible_after,) = cur.fetchone()
    conn.commit()
    return Tick(int(tick), time.time(), writes, float(visible_after))


# -- the owner: the process that has the cache file open -----------------------------------------


@dataclass
class Owner:
    """One incarnation of the cache's process; everything it does goes to its journal."""

    dsn: str
    cache_path: Path
    seed: int
    deadline: float
    incarnation: int
    journal: Journal
    spark: bool
    faults_done: dict[str, int]  # each fault point's turns, by the incarnations before this one
    server: str | None = None  # over the wire: the cache server's HOST:PORT
    parent: int = field(default_factory=os.getppid)
    spark_ready: threading.Event = field(default_factory=threading.Event)  # its JVM is up

    def running(self) -> bool:
        return time.time() < self.deadline and os.getppid() == self.parent

    def note(self, counter: str, key: str) -> None:
        self.journal.write("count", counter=counter, key=key)


SHAPES = (
    "point",
    "range",
    "group",
    "join",
    "join_classes",
    "aggregate",
    "aggregate_by",
    "timeordered",
    "own_write",
)
WEIGHTS = (6, 2, 4, 3, 2, 2, 2, 2, 1)
SIMPLE = SHAPES[:7]  # what a TIMEORDERED bracket is made of


def reader(run: Owner, number: int) -> None:
    session = run.incarnation * 100 + number
    rng = random.Random(run.seed * 1000 + run.incarnation * 10 + number)
    conn = None
    own_tick: int | None = None  # the session's last write (always to accounts)
    own_entries = 0  # its last write to entries
    bracket = 0
    while run.running():
        try:
            if conn is None:  # a new session: the old one's writes are not its own
                conn = cache.connect(
                    run.dsn,
                    None if run.server else run.cache_path,
                    admit_on_miss=True,
                    server=run.server,
                )
                own_tick, own_entries = None, 0
            shape = rng.choices(SHAPES, WEIGHTS)[0]
            if shape == "own_write" and number == 0:
                shape = "point"  # session 0 never writes: its reads may stay local
            if shape == "timeordered":
                bracket += 1
                with conn.timeordered():
                    for _ in range(rng.randint(2, 4)):
                        observe(
                            run,
                            conn,
                            rng,
                            session,
                            rng.choice(SIMPLE),
                            own_tick,
                            bracket,
                            own_entries=own_entries,
                        )
            elif shape == "own_write":
                tick = write(conn, rng)
                run.journal.write("tick", tick=tick.tick, committed=tick.committed)
                run.note("operations", "write (through the cache)")
                own_tick = tick.tick
                if any(i > ENTRY_BASE for i in tick.writes):
                    own_entries = tick.tick
                account = rng.choice(sorted(a for a in tick.writes if a <= ACCOUNTS))
                observe(
                    run,
                    conn,
                    rng,
                    session,
                    rng.choice(["point", "join", "join_classes"]),
                    own_tick,
                    None,
                    account=account,
                    own_entries=own_entries,
                )
            else:
                observe(run, conn, rng, session, shape, own_tick, None, own_entries=own_entries)
            conn.commit()
            time.sleep(rng.uniform(0, 0.01))
        except cache.Error as exc:  # refused or backend gone: recorded, never checked
            run.note("errors", f"reader: {type(exc).__name__}")
            if conn is not None:
                with contextlib.suppress(cache.Error):
                    conn.rollback()
            if isinstance(exc, cache.InterfaceError | cache.OperationalError) and conn is not None:
                with contextlib.suppress(cache.Error):
                    conn.close()
                conn = None
            time.sleep(0.02)  # (a server starting again: not a busy loop)
    if conn is not None:
        with contextlib.suppress(cache.Error):
            conn.close()


def _bound(rng: random.Random) -> float:
    return rng.choice([0.5, 2.0, 5.0, 10.0, 30.0, 60.0])


def _ms(bound: float) -> str:
    return f"{int(bound * 1000)} MS"


def observe(
    run: Owner,
    conn: cache.Connection,
    rng: random.Random,
    session: int,
    shape: str,
    own_tick: int | None,
    bracket: int | None,
    account: int | None = None,
    own_entries: int = 0,
) -> None:
    bound, second = _bound(rng), _bound(rng)
    clause = f"CURRENCY BOUND {_ms(bound)} ON (a)"
    join = (
        "SELECT a.id, a.version, e.id, e.version FROM accounts a JOIN entries e "
        "ON e.account = a.id WHERE a.id = %s "
    )
    account = account or rng.randint(1, ACCOUNTS)
    expected: int | None = None
    if shape == "point":
        query, params, expected = (
            f"SELECT a.id, a.version FROM accounts a WHERE a.id = %s {clause}",
            [account],
            1,
        )
    elif shape == "range":
        low = rng.randint(1, ACCOUNTS - 3)
        query = f"SELECT a.id, a.version FROM accounts a WHERE a.id BETWEEN %s AND %s {clause}"
        params, expected = [low, low + 3], 4
    elif shape == "group":
        query = f"SELECT a.id, a.version FROM accounts a WHERE a.grp = %s {clause}"
        params, expected = [rng.randrange(GROUPS)], ACCOUNTS // GROUPS
    elif shape == "join":
        query, params = join + f"CURRENCY BOUND {_ms(bound)} ON (a, e)", [account]
        expected = ENTRIES_PER_ACCOUNT
    elif shape == "join_classes":
        query = join + f"CURRENCY BOUND {_ms(bound)} ON (a), {_ms(second)} ON (e)"
        params, expected = [account], ENTRIES_PER_ACCOUNT
    elif shape == "aggregate":
        query, params = (
            f"SELECT a.grp, sum(a.version), count(*) FROM accounts a GROUP BY a.grp {clause}",
            [],
        )
    else:
        query, params = (
            f"SELECT a.grp, sum(a.version), count(*) FROM accounts a "
            f"GROUP BY a.grp {clause} BY a.grp",
            [],
        )
    start = time.time()
    cur = conn.cursor()
    cur.execute(query, params)
    rows = cur.fetchall()
    end = time.time()
    local = any(p["route"] == "local" for p in cur.provenance)
    if expected is not None and len(rows) != expected:
        run.note("errors", f"VIOLATION {shape} returned {len(rows)} rows, not {expected}")
        run.journal.write(
            "event",
            at=start,
            what=f"VIOLATION {shape} returned {rows} for "
            f"{query} {params} at {start:.3f}: {cur.provenance!r}",
        )
        return
    units: list[Unit]
    if shape in ("point", "range", "group"):
        units = [Unit(rows=tuple((int(i), int(v)) for i, v in rows))]
    elif shape in ("join", "join_classes"):
        accounts = tuple(sorted({(int(r[0]), int(r[1])) for r in rows}))
        entries = tuple(sorted((int(r[2]), int(r[3])) for r in rows))
        units = (
            [Unit(rows=accounts + entries)]
            if shape == "join"
            else [
                Unit(rows=accounts, bound=bound),
                Unit(rows=entries, bound=second, floor_tick=own_entries),
            ]
        )
    else:
        groups = tuple((int(g), int(s)) for g, s, _ in rows)
        units = (
            [Unit(groups=(g,)) for g in groups]
            if shape == "aggregate_by"
            else [Unit(groups=groups)]
        )
    observation = Observation(
        session,
        start,
        end,
        bound,
        tuple(units),
        shape,
        local,
        bracket,
        own_tick,
        repr(cur.provenance),
    )
    run.journal.write("observation", **dataclasses.asdict(observation))
    run.note("operations", f"read {shape}" + (" (local)" if local else ""))


def maintainer(run: Owner) -> None:
    rng = random.Random(run.seed * 1000 + run.incarnation * 10 + 7)
    spark: Engine | None = None
    actions = [
        "refresh_all",
        "refresh_hot",
        "admit",
        "evict",
        "admit_grp",
        "evict_grp",
        "admit_complete",
        "evict_complete",
        "fault",
    ]
    weights = [4, 4, 2, 2, 1, 1, 1, 1, 3]
    if run.spark:
        actions.append("spark_refresh")
        weights.append(1)
    done = collections.Counter(run.faults_done)  # turns so far, across incarnations
    while run.running():
        try:
            with cache.Admin.open(run.cache_path, run.dsn) as admin:
                store = admin.store
                while run.running():
                    action = rng.choices(actions, weights)[0]
                    if action.startswith("spark") and not run.spark_ready.is_set():
                        action = "refresh_hot"  # Spark is still starting (in the background)
                    view = rng.choice(["acct_all", "acct_hot"])
                    began = time.time()
                    if action == "refresh_all":
                        admin.refresh("acct_all")
                    elif action == "refresh_hot":
                        admin.refresh("acct_hot")
                    elif action in (
                        "admit",
                        "evict",
                        "admit_grp",
                        "evict_grp",
                        "admit_complete",
                        "evict_complete",
                    ):
                        control, span = {
                            "admit": ("acct_pct", ACCOUNTS),
                            "admit_grp": ("grp_csct", GROUPS),
                            "admit_complete": ("grp_cpct", GROUPS),
                        }[action.replace("evict", "admit")]
                        if action.startswith("admit"):
                            low = 1 if control == "acct_pct" else 0
                            admin.admit(control, rng.sample(range(low, low + span), 1))
                        else:
                            column = "id" if control == "acct_pct" else "grp"
                            keys = [
                                k
                                for (k,) in store.con.execute(
                                    f"SELECT {column} FROM {control}"
                                ).fetchall()
                            ]
                            if keys:
                                admin.evict(control, [rng.choice(keys)])
                    elif action == "spark_refresh":
                        spark = spark or _spark()
                        admin.refresh(view, engine=spark)
                    else:
                        kind, point = next_fault(done, run.spark, run.spark_ready.is_set())
                        done[point] += 1
                        if kind == "spark":
                            spark = spark or _spark()
                        # a kill ends this process: the parent counts it from this line;
                        # the other kinds are counted before they run (the owner may be
                        # SIGKILLed by the fault thread while one is under way)
                        run.journal.write("armed", point=point)
                        if kind != "kill":
                            run.note(
                                "faults",
                                f"refresh failed at {point}"
                                if kind == "fail"
                                else f"Spark task failure ({point})",
                            )
                        with contextlib.suppress(Exception):  # the cache is as it was: checked
                            Maintainer(
                                store,
                                run.dsn,
                                spark if kind == "spark" else None,
                                faults_enabled=[point],
                            ).refresh(view)
                        # still alive after a kill's turn: the refresh failed before its point
                        # (a terminated session, a restart): not a turn, it comes again
                        missed = kind == "kill"
                        done[point] -= missed
                        run.journal.write("disarmed", point=point, missed=missed)
                    run.note("operations", f"maintain {action}")
                    run.journal.write(
                        "event", at=began, what=f"{action} {view} {began:.3f}-{time.time():.3f}"
                    )
                    time.sleep(rng.uniform(0.05, 0.3))
        except cache.Error as exc:
            run.note("errors", f"maintainer: {type(exc).__name__}")
            run.journal.write("event", at=time.time(), what=f"maintainer: {exc}")
            time.sleep(0.1)


SPARK_MASTER = "local[2]"


def _spark() -> Engine:
    from cache.maintenance.spark import SparkEngine

    return SparkEngine(SPARK_MASTER, min_pages_per_task=1)


def _start_spark(run: Owner) -> None:
    """The JVM starts in the background: the maintainer refreshes inline meanwhile."""
    from cache.maintenance.spark import spark_session

    began = time.time()
    try:
        spark_session(SPARK_MASTER)
    except Exception as exc:  # reported; the run goes on without Spark
        run.journal.write("event", at=time.time(), what=f"spark: could not start: {exc}")
        return
    run.journal.write("event", at=time.time(), what=f"spark: up in {time.time() - began:.1f}s")
    run.spark_ready.set()


def owner_main(config: dict[str, t.Any]) -> int:
    """The owner process: readers, the maintainer and the refresh scheduler until the
    deadline (or until its parent is gone)."""
    journal = Journal(Path(config["journal"]))
    run = Owner(
        config["dsn"],
        Path(config["cache_path"]),
        config["seed"],
        config["deadline"],
        config["incarnation"],
        journal,
        config["spark"],
        config["faults_done"],
    )
    journal.write("started", at=time.time())
    threads = [threading.Thread(target=reader, args=(run, i)) for i in range(3)]
    threads.append(threading.Thread(target=maintainer, args=(run,)))
    if run.spark:
        threading.Thread(target=_start_spark, args=(run,), daemon=True).start()
    for thread in threads:
        thread.start()
    counted: dict[int, int] = {}  # the refresh scheduler the readers' connections run
    while any(thread.is_alive() for thread in threads):
        time.sleep(0.5)
        running = background.running(run.cache_path)
        if running is not None:
            done = len(running.scheduler.reports)
            for _ in range(done - counted.get(id(running), 0)):
                run.note("operations", "scheduled refresh")
            counted[id(running)] = done
    journal.write("stopped", at=time.time())
    return 0


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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def backend_timeline(run: Run, ended: float) -> Timeline:
    """The history from the backend's own log (complete: a tick and its log row commit
    together), with each commit's time from the writer that saw it return; a commit whose
    writer was killed or cut off before seeing it is bounded by the next tick's clock reading
    (that transaction waited on the clock row for it) or by the run's end."""
    with psycopg.connect(run.dsn) as pg:
        log = pg.execute(
            "SELECT tick, writes, visible_after FROM chaos_log ORDER BY tick"
        ).fetchall()
    ticks = []
    for index, (tick, writes, visible_after) in enumerate(log):
        committed = run.commits.get(tick)
        if committed is None:
            committed = log[index + 1][2] if index + 1 < len(log) else ended
        ticks.append(
            Tick(
                int(tick),
                committed,
                {int(k): int(v) for k, v in writes.items()},
                float(visible_after),
            )
        )
    rows = {i: group_of(i) for i in range(1, ACCOUNTS + 1)}
    rows |= {e: -1 for a in range(1, ACCOUNTS + 1) for e in entries_of(a)}  # entries: no group
    return Timeline(rows, ticks)


def final_regions(run: Run, timeline: Timeline) -> Verdict:
    """Every cached region equals the backend's rows at one snapshot as fresh as the region
    says (its refresh time); a presence region includes its gray child's rows."""
    observations = []
    with cache.Admin.open(run.cache_path) as admin:
        con = admin.store.con
        for view in admin.status()["views"]:
            name = view["name"]
            for region in view["regions"]:
                kind, key = region["kind"], region["key"]
                if kind == "presence":
                    rows = con.execute(
                        f"SELECT id, version FROM {ident(name)} WHERE id = ?", key
                    ).fetchall()
                    rows += con.execute(
                        "SELECT id, version FROM entry_hot WHERE account = ?", key
                    ).fetchall()
                elif kind in ("consistency", "completeness"):
                    rows = con.execute(
                        f"SELECT id, version FROM {ident(name)} WHERE grp = ?", key
                    ).fetchall()
                else:
                    rows = con.execute(f"SELECT id, version FROM {ident(name)}").fetchall()
                moment = _epoch(region["refreshed_at"])
                unit = Unit(rows=tuple((int(i), int(v)) for i, v in rows))
                observations.append(
                    Observation(-1, moment, moment, 0.0, (unit,), f"region {name} {kind} {key}")
                )
    return check(timeline, observations)


def _epoch(value: t.Any) -> float:
    moment = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
    return moment.timestamp()


def prepare(dsn: str) -> str:
    """The checker's own database on the backend, made afresh."""
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (DATABASE,)
        )
        pg.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DATABASE)))
        pg.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info["dbname"] = DATABASE
    chaos_dsn = psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items()})
    with psycopg.connect(chaos_dsn, autocommit=True) as pg:
        pg.execute(BACKEND_SCHEMA)
    return chaos_dsn


def run_chaos(
    dsn: str,
    seconds: float,
    seed: int,
    console: Console | None = None,
    restart: t.Callable[[], None] | None = None,
    spark: bool = True,
    wire: bool = False,
    completeness: bool = True,
) -> dict[str, t.Any]:
    """A run against ``dsn`` (its server gets a database of the checker's own); ``restart``
    stops and starts that server (faults of that kind are injected only when given);
    ``wire``: the cache as `mtcache serve`, driven over the protocol (see the module);
    ``completeness=False``: no completeness region is ever admitted (group reads then come
    from the consistency-controlled view or the backend; what a completeness region holds:
    docs/decisions/regions-and-their-stamps.md)."""
    console = console or Console()
    chaos_dsn = prepare(dsn)
    work = Path(tempfile.mkdtemp(prefix="mtcache-chaos-"))
    served: Wire | None = None
    try:
        run = Run(
            chaos_dsn,
            work / "cache.duckdb",
            seed,
            time.time() + seconds,
            work,
            spark and not wire,
            restart,
        )
        with cache.connect(chaos_dsn, run.cache_path) as conn:
            conn.admin.apply_ddl(CACHE_SCHEMA)
            conn.admin.admit("acct_pct", [1, 2, 3])
            conn.admin.admit("grp_csct", [0])
            if completeness:
                conn.admin.admit("grp_cpct", [1])
        threads = [threading.Thread(target=writer, args=(run, i)) for i in range(2)]
        if wire:
            info = psycopg.conninfo.conninfo_to_dict(chaos_dsn)
            network = FaultyNetwork(
                (str(info.get("host", "127.0.0.1")), int(str(info.get("port", 5432))))
            )
            proxied = psycopg.conninfo.make_conninfo(
                chaos_dsn, host="127.0.0.1", port=str(network.port)
            )
            served = Wire(_free_port(), network, proxied)
            clients = Owner(
                chaos_dsn,
                run.cache_path,
                seed,
                run.deadline,
                1,
                Journal(work / "clients.jsonl"),
                False,
                {},
                server=served.address,
            )
            served.clients = clients
            run.incarnations.append(work / "clients.jsonl")
            threads += [
                threading.Thread(target=wire_supervisor, args=(run, served)),
                threading.Thread(target=wire_faults, args=(run, served)),
                threading.Thread(target=wire_maintainer, args=(clients, completeness)),
                threading.Thread(
                    target=disconnector, args=(clients, functools.partial(run.note, run.faults))
                ),
            ]
            threads += [threading.Thread(target=reader, args=(clients, i)) for i in range(3)]
        else:
            threads += [
                threading.Thread(target=supervisor, args=(run,)),
                threading.Thread(target=fault_injector, args=(run,)),
            ]
        console.print(f"chaos for {seconds:g}s, seed {seed}{' over the wire' if wire else ''} ...")
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if served is not None and served.clients is not None:
            served.clients.journal.close()
        ended = time.time()
        observations, events = [], []
        for journal in run.incarnations:
            for record in read_journal(journal):
                kind = record["kind"]
                if kind == "observation":
                    observations.append(observation_from(record))
                elif kind == "tick":
                    run.commits[record["tick"]] = record["committed"]
                elif kind == "count":
                    getattr(run, record["counter"])[record["key"]] += 1
                elif kind == "event":
                    events.append((record["at"], record["what"]))
        timeline = backend_timeline(run, ended)
        verdict = check(timeline, observations)
        regions = final_regions(run, timeline)
        violations = verdict.violations + regions.violations
        violations += [k for k in run.errors if k.startswith("VIOLATION")]
        with psycopg.connect(chaos_dsn) as pg:  # what a client abandoned never committed
            kept = pg.execute("SELECT id FROM chaos_abandoned ORDER BY id").fetchall()
        violations += [
            f"VIOLATION an abandoned transaction's row {i} was committed" for (i,) in kept
        ]
        return {
            "seed": seed,
            "seconds": seconds,
            "ticks": timeline.last,
            "answers_checked": verdict.checked,
            "answers_local": verdict.local,
            "local_during_outages": sum(
                1
                for o in observations
                if o.local and any(down <= o.start <= up for down, up in run.outages)
            ),
            "regions_checked": regions.checked,
            "owner_incarnations": run.incarnations_served if wire else len(run.incarnations),
            "faults": dict(run.faults),
            "operations": dict(run.operations),
            "errors": {k: v for k, v in run.errors.items() if not k.startswith("VIOLATION")},
            "logged_failures": logged_failures(work),
            "violations": violations,
            "events": sorted(events),
        }
    finally:
        if served is not None:
            served.network.close()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int)
    parser.add_argument(
        "--backend",
        help="a PostgreSQL DSN (default: the embedded cluster, "
        "which the run also restarts now and then)",
    )
    parser.add_argument(
        "--embedded",
        default=".mtcache/pg",
        help="the embedded cluster's directory (default .mtcache/pg)",
    )
    parser.add_argument(
        "--no-spark",
        action="store_true",
        help="refresh inline only (no JVM in the cache's process)",
    )
    parser.add_argument(
        "--wire",
        action="store_true",
        help="the cache as `mtcache serve`, its clients over the protocol, a "
        "faulty network between it and the backend",
    )
    parser.add_argument("--owner", help=argparse.SUPPRESS)  # the cache's process, started here
    args = parser.parse_args(argv)
    if args.owner:
        return owner_main(json.loads(args.owner))
    console = Console()
    restart = None
    if args.backend:
        dsn = args.backend
    else:
        cluster = EmbeddedPostgres(Path(args.embedded))
        dsn = cluster.ensure_running()

        def restart() -> None:
            cluster.stop()
            cluster.ensure_running()

    seed = args.seed if args.seed is not None else random.randrange(2**31)
    result = run_chaos(
        dsn, args.seconds, seed, console, restart, spark=not args.no_spark, wire=args.wire
    )
    console.print(
        f"ticks committed {result['ticks']}; answers checked "
        f"{result['answers_checked']} ({result['answers_local']} local); regions "
        f"checked {result['regions_checked']}; the cache's process ran "
        f"{result['owner_incarnations']} times"
    )
    console.print(
        f"faults injected: {result['faults']}; answered locally while the backend "
        f"was down: {result['local_during_outages']}"
    )
    console.print(f"operations: {result['operations']}")
    console.print(f"errors (refused or retried, not checked): {result['errors']}")
    console.print(f"failures the cache's processes logged: {result['logged_failures']}")
    console.print(f"violations: {len(result['violations'])}")
    for violation in result["violations"][:20]:
        console.print(f"  {violation}", markup=False)
        moment = float(violation.split(" at ")[1].split(":")[0]) if " at " in violation else 0
        for began, event in result["events"]:
            if moment - 3 < began < moment + 1:
                console.print(f"      {event}", markup=False)
    append_rows(
        "chaos",
        [
            {
                k: (json.dumps(v) if isinstance(v, dict | list) else v)
                for k, v in result.items()
                if k != "events"
            }
        ],
    )
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
