"""A randomized concurrent C&C checker (issue 10), in the spirit of Jepsen/Elle.

    python -m experiments.chaos [--seconds 60] [--seed N] [--backend DSN]

Writer threads commit transactions on PostgreSQL that leave checkable traces: each takes the
next tick of one clock row (so commits are totally ordered), bumps the version of a few
accounts, and logs what it wrote. Meanwhile a maintenance thread refreshes, admits and evicts
through the cache (inline engine), reader threads - each with a cache connection of its own -
issue random queries (point, group range, aggregates with and without BY groups, TIMEORDERED
brackets, reads after their own writes) with random bounds, and a fault thread terminates
backend sessions (the cache's included) and injects failures at the refresh pipeline's fault
points. Every answer is recorded with its start and end time and checked afterwards
(experiments/chaos_check.py): one snapshot per consistency unit, no older than the bound
allowed at the query's start, TIMEORDERED never back, a session's own writes seen. At the end
every cached region must equal the backend's rows at one snapshot no older than the region
claims. Prints the operations checked, faults injected and violations (0 is the only passing
number); a seed reproduces the run's choices (thread timing still varies).

With the embedded backend (no --backend) the fault thread also restarts PostgreSQL now and
then; answers the cache gave while it was down are counted (and checked like any other).

Not yet injected (see docs/decisions.md, "The C&C checker"): SIGKILL of the cache's process,
Spark task failures.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import random
import shutil
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
from cache.maintenance import faults
from cache.maintenance.pipeline import Maintainer
from experiments.chaos_check import Observation, Tick, Timeline, Unit, Verdict, check
from experiments.provenance import append_rows

ACCOUNTS = 24
GROUPS = 4
DATABASE = "mtcache_chaos"

BACKEND_SCHEMA = f"""
DROP TABLE IF EXISTS chaos_clock, chaos_log, accounts;
CREATE TABLE chaos_clock (id int PRIMARY KEY, tick bigint NOT NULL);
INSERT INTO chaos_clock VALUES (1, 0);
CREATE TABLE accounts (id int PRIMARY KEY, grp int NOT NULL, version bigint NOT NULL);
INSERT INTO accounts SELECT g, g % {GROUPS}, 0 FROM generate_series(1, {ACCOUNTS}) g;
CREATE TABLE chaos_log (tick bigint PRIMARY KEY, writes jsonb NOT NULL)
"""

CACHE_SCHEMA = """
CREATE CONTROL TABLE acct_pct (id INTEGER);
CREATE CONTROL TABLE grp_csct (grp INTEGER);
CREATE CACHED VIEW acct_hot AS SELECT id, grp, version FROM accounts
    PRESENCE ON (id) IN acct_pct REFRESH EVERY 10 SEC;
CREATE CACHED VIEW acct_all AS SELECT id, grp, version FROM accounts
    CONSISTENCY ON (grp) IN grp_csct REFRESH EVERY 10 SEC
"""

FAULT_POINTS = [p for p in faults.POINTS if p != "task"] + ["after_snapshot:disconnect"]


def group_of(account: int) -> int:
    return account % GROUPS


@dataclass
class Run:
    dsn: str
    cache_path: Path
    seed: int
    deadline: float
    ticks: list[Tick] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    operations: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    events: list[tuple[float, str]] = field(default_factory=list)  # maintenance, for reports
    restart: t.Callable[[], None] | None = None  # stops and starts the backend, when we may
    outages: list[tuple[float, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def running(self) -> bool:
        return time.time() < self.deadline

    def note(self, counter: Counter[str], key: str) -> None:
        with self.lock:
            counter[key] += 1


def write(conn: t.Any, rng: random.Random) -> Tick:
    """One writer transaction through ``conn`` (psycopg, or the cache's DB-API connection):
    the next tick, a few accounts' versions bumped, the log row."""
    accounts = sorted(rng.sample(range(1, ACCOUNTS + 1), rng.randint(1, 3)))
    cur = conn.cursor()
    cur.execute("UPDATE chaos_clock SET tick = tick + 1 WHERE id = 1 RETURNING tick")
    (tick,) = cur.fetchone()
    cur.execute("UPDATE accounts SET version = version + 1 WHERE id = ANY(%s) "
                "RETURNING id, version", (accounts,))  # fmt: skip
    writes = {int(i): int(v) for i, v in cur.fetchall()}
    cur.execute("INSERT INTO chaos_log VALUES (%s, %s) "
                "RETURNING extract(epoch FROM clock_timestamp())::float8",
                (tick, json.dumps(writes)))  # fmt: skip
    (visible_after,) = cur.fetchone()
    conn.commit()
    return Tick(int(tick), time.time(), writes, float(visible_after))


def writer(run: Run, number: int) -> None:
    rng = random.Random(run.seed * 1000 + number)
    while run.running():
        try:
            with psycopg.connect(run.dsn) as pg:
                while run.running():
                    tick = write(pg, rng)
                    with run.lock:
                        run.ticks.append(tick)
                    run.note(run.operations, "write")
                    time.sleep(rng.uniform(0, 0.02))
        except psycopg.Error as exc:  # a terminated session: a fault, retried
            run.note(run.errors, f"writer: {type(exc).__name__}")
            time.sleep(0.05)


SHAPES = ("point", "group", "aggregate", "aggregate_by", "timeordered", "own_write")
WEIGHTS = (6, 4, 3, 3, 2, 1)


def reader(run: Run, number: int) -> None:
    rng = random.Random(run.seed * 1000 + 100 + number)
    conn = None
    own_tick: int | None = None
    bracket = 0
    while run.running():
        try:
            if conn is None:  # a new session: the old one's writes are not its own
                conn = cache.connect(run.dsn, run.cache_path, admit_on_miss=True)
                own_tick = None
            shape = rng.choices(SHAPES, WEIGHTS)[0]
            if shape == "own_write" and number == 0:
                shape = "point"  # session 0 never writes: its reads may stay local
            if shape == "timeordered":
                bracket += 1
                with conn.timeordered():
                    for _ in range(rng.randint(2, 4)):
                        observe(run, conn, rng, number, rng.choice(SHAPES[:4]), own_tick, bracket)
            elif shape == "own_write":
                tick = write(conn, rng)
                with run.lock:
                    run.ticks.append(tick)
                run.note(run.operations, "write (through the cache)")
                own_tick = tick.tick
                observe(run, conn, rng, number, "point", own_tick, None,
                        account=rng.choice(sorted(tick.writes)))  # fmt: skip
            else:
                observe(run, conn, rng, number, shape, own_tick, None)
            conn.commit()
            time.sleep(rng.uniform(0, 0.01))
        except cache.Error as exc:  # refused or backend gone: recorded, never checked
            run.note(run.errors, f"reader: {type(exc).__name__}")
            if conn is not None:
                with contextlib.suppress(cache.Error):
                    conn.rollback()
            if isinstance(exc, cache.InterfaceError | cache.OperationalError) and conn is not None:
                with contextlib.suppress(cache.Error):
                    conn.close()
                conn = None
    if conn is not None:
        with contextlib.suppress(cache.Error):
            conn.close()


def observe(
    run: Run, conn: cache.Connection, rng: random.Random, session: int, shape: str,
    own_tick: int | None, bracket: int | None, account: int | None = None,
) -> None:  # fmt: skip
    bound = rng.choice([0.5, 2.0, 5.0, 10.0, 30.0, 60.0])
    clause = f"CURRENCY BOUND {int(bound * 1000)} MS ON (a)"
    if shape == "point":
        account = account or rng.randint(1, ACCOUNTS)
        query = f"SELECT a.id, a.version FROM accounts a WHERE a.id = %s {clause}"
        params = [account]
    elif shape == "group":
        query = f"SELECT a.id, a.version FROM accounts a WHERE a.grp = %s {clause}"
        params = [rng.randrange(GROUPS)]
    elif shape == "aggregate":
        query = (f"SELECT a.grp, sum(a.version), count(*) FROM accounts a GROUP BY a.grp "
                 f"{clause}")  # fmt: skip
        params = []
    else:
        query = (f"SELECT a.grp, sum(a.version), count(*) FROM accounts a GROUP BY a.grp "
                 f"{clause} BY a.grp")  # fmt: skip
        params = []
    start = time.time()
    cur = conn.cursor()
    cur.execute(query, params)
    rows = cur.fetchall()
    end = time.time()
    local = any(p["route"] == "local" for p in cur.provenance)
    if shape in ("point", "group"):
        units: tuple[Unit, ...] = (Unit(rows=tuple((int(i), int(v)) for i, v in rows)),)
        expected = 1 if shape == "point" else ACCOUNTS // GROUPS
        if len(rows) != expected:
            with run.lock:
                run.observations.append(Observation(session, start, end, bound, (), shape))
                run.errors[f"VIOLATION {shape} returned {len(rows)} rows, not {expected}"] += 1
            return
    else:
        groups = tuple((int(g), int(s)) for g, s, _ in rows)
        units = tuple(Unit(groups=(g,)) for g in groups) if shape == "aggregate_by" \
            else (Unit(groups=groups),)  # fmt: skip
    with run.lock:
        run.observations.append(Observation(session, start, end, bound, units, shape, local,
                                            bracket, own_tick, repr(cur.provenance)))  # fmt: skip
    run.note(run.operations, f"read {shape}" + (" (local)" if local else ""))


def maintainer(run: Run) -> None:
    rng = random.Random(run.seed * 1000 + 500)
    while run.running():
        try:
            with cache.Admin.open(run.cache_path, run.dsn) as admin:
                while run.running():
                    action = rng.choice(["refresh_all", "refresh_all", "refresh_hot",
                                         "refresh_hot", "admit", "evict", "admit_grp",
                                         "evict_grp", "fault"])  # fmt: skip
                    began = time.time()
                    if action == "refresh_all":
                        admin.refresh("acct_all")
                    elif action == "refresh_hot":
                        admin.refresh("acct_hot")
                    elif action == "admit":
                        admin.admit("acct_pct", rng.sample(range(1, ACCOUNTS + 1), 2))
                    elif action == "evict":
                        keys = [k for (k,) in admin._store.con.execute(
                            "SELECT id FROM acct_pct").fetchall()]  # fmt: skip
                        if keys:
                            admin.evict("acct_pct", [rng.choice(keys)])
                    elif action == "admit_grp":
                        admin.admit("grp_csct", [rng.randrange(GROUPS)])
                    elif action == "evict_grp":
                        keys = [k for (k,) in admin._store.con.execute(
                            "SELECT grp FROM grp_csct").fetchall()]  # fmt: skip
                        if keys:
                            admin.evict("grp_csct", [rng.choice(keys)])
                    else:
                        point = rng.choice(FAULT_POINTS)
                        run.note(run.faults, f"refresh fault {point}")
                        # the injected failure: the final region check shows the cache as it was
                        with contextlib.suppress(Exception):
                            Maintainer(admin._store, run.dsn, faults_enabled=[point]).refresh(
                                rng.choice(["acct_all", "acct_hot"]))
                    run.note(run.operations, f"maintain {action}")
                    with run.lock:
                        run.events.append((began, f"{action} {began:.3f}-{time.time():.3f}"))
                    time.sleep(rng.uniform(0.05, 0.3))
        except cache.Error as exc:
            run.note(run.errors, f"maintainer: {type(exc).__name__}")
            time.sleep(0.1)


def fault_injector(run: Run) -> None:
    rng = random.Random(run.seed * 1000 + 900)
    next_restart = time.time() + rng.uniform(5, 10)
    while run.running():
        time.sleep(rng.uniform(0.5, 2.0))
        if run.restart is not None and time.time() > next_restart and run.running():
            down = time.time()
            run.restart()
            with run.lock:
                run.outages.append((down, time.time()))
                run.faults["backend restart"] += 1
            next_restart = time.time() + rng.uniform(8, 20)
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


def final_regions(run: Run, timeline: Timeline) -> Verdict:
    """Every cached region equals the backend's rows at one snapshot as fresh as the region
    says (its refresh time)."""
    observations = []
    with cache.Admin.open(run.cache_path) as admin:
        con = admin._store.con
        status = admin.status()
        for view in status["views"]:
            name = view["name"]
            for region in view["regions"]:
                refreshed = region["refreshed_at"]
                if region["kind"] == "presence":
                    rows = con.execute(f'SELECT id, version FROM "{name}" WHERE id = ?',
                                       region["key"]).fetchall()  # fmt: skip
                elif region["kind"] == "consistency":
                    rows = con.execute(f'SELECT id, version FROM "{name}" WHERE grp = ?',
                                       region["key"]).fetchall()  # fmt: skip
                else:
                    rows = con.execute(f'SELECT id, version FROM "{name}"').fetchall()
                moment = _epoch(refreshed)
                unit = Unit(rows=tuple((int(i), int(v)) for i, v in rows))
                observations.append(Observation(-1, moment, moment, 0.0, (unit,),
                                                f"region {name} {region['key']}"))  # fmt: skip
    return check(timeline, observations)


def _epoch(value: t.Any) -> float:
    moment = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
    return moment.timestamp()


def prepare(dsn: str) -> str:
    """The checker's own database on the backend, made afresh."""
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                   (DATABASE,))  # fmt: skip
        pg.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DATABASE)))
        pg.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info["dbname"] = DATABASE
    chaos_dsn = psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items()})
    with psycopg.connect(chaos_dsn, autocommit=True) as pg:
        pg.execute(BACKEND_SCHEMA)
    return chaos_dsn


def run_chaos(
    dsn: str, seconds: float, seed: int, console: Console | None = None,
    restart: t.Callable[[], None] | None = None,
) -> dict[str, t.Any]:
    """A run against ``dsn`` (its server gets a database of the checker's own); ``restart``
    stops and starts that server (faults of that kind are injected only when given)."""
    console = console or Console()
    chaos_dsn = prepare(dsn)
    work = Path(tempfile.mkdtemp(prefix="mtcache-chaos-"))
    try:
        run = Run(chaos_dsn, work / "cache.duckdb", seed, time.time() + seconds, restart=restart)
        with cache.connect(chaos_dsn, run.cache_path) as conn:
            conn.admin.apply_ddl(CACHE_SCHEMA)
            conn.admin.admit("acct_pct", [1, 2, 3])
            conn.admin.admit("grp_csct", [0])
        threads = [threading.Thread(target=writer, args=(run, i)) for i in range(2)]
        threads += [threading.Thread(target=reader, args=(run, i)) for i in range(3)]
        threads += [threading.Thread(target=maintainer, args=(run,)),
                    threading.Thread(target=fault_injector, args=(run,))]  # fmt: skip
        console.print(f"chaos for {seconds:g}s, seed {seed} ...")
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        timeline = Timeline({i: group_of(i) for i in range(1, ACCOUNTS + 1)}, run.ticks)
        verdict = check(timeline, run.observations)
        regions = final_regions(run, timeline)
        violations = verdict.violations + regions.violations
        violations += [k for k in run.errors if k.startswith("VIOLATION")]
        result = {
            "seed": seed, "seconds": seconds, "ticks": len(run.ticks),
            "answers_checked": verdict.checked, "answers_local": verdict.local,
            "local_during_outages": sum(
                1 for o in run.observations if o.local
                and any(down <= o.start <= up for down, up in run.outages)),
            "regions_checked": regions.checked, "faults": dict(run.faults),
            "operations": dict(run.operations),
            "errors": {k: v for k, v in run.errors.items() if not k.startswith("VIOLATION")},
            "violations": violations, "events": run.events,
        }  # fmt: skip
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--backend", help="a PostgreSQL DSN (default: the embedded cluster, "
                        "which the run also restarts now and then)")  # fmt: skip
    parser.add_argument("--embedded", default=".mtcache/pg",
                        help="the embedded cluster's directory (default .mtcache/pg)")  # fmt: skip
    args = parser.parse_args(argv)
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
    result = run_chaos(dsn, args.seconds, seed, console, restart)
    console.print(f"ticks committed {result['ticks']}; answers checked "
                  f"{result['answers_checked']} ({result['answers_local']} local); regions "
                  f"checked {result['regions_checked']}")  # fmt: skip
    console.print(f"faults injected: {result['faults']}; answered locally while the backend "
                  f"was down: {result['local_during_outages']}")  # fmt: skip
    console.print(f"operations: {result['operations']}")
    console.print(f"errors (refused or retried, not checked): {result['errors']}")
    console.print(f"violations: {len(result['violations'])}")
    for violation in result["violations"][:20]:
        console.print(f"  {violation}", markup=False)
        moment = float(violation.split(" at ")[1].split(":")[0]) if " at " in violation else 0
        for began, event in result["events"]:
            if moment - 3 < began < moment + 1:
                console.print(f"      {event}", markup=False)
    append_rows("chaos", [{k: (json.dumps(v) if isinstance(v, dict | list) else v)
                           for k, v in result.items() if k != "events"}])  # fmt: skip
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
