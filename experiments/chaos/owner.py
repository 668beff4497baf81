"""The owner: the process that has the cache file open (as an application's would), with its
readers, maintainer and refresh scheduler, each answer journaled."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import random
import threading
import time
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

import cache
from cache.maintenance import background
from cache.maintenance.engines import Engine
from cache.maintenance.pipeline import Maintainer
from experiments.chaos.world import (
    ACCOUNTS,
    ENTRIES_PER_ACCOUNT,
    ENTRY_BASE,
    GROUPS,
    Journal,
    next_fault,
    spark_pending,
    write,
)
from experiments.chaos_check import Observation, Unit

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
    # where the run's deadline is kept when it moves (`experiments.chaos.run.extender`): read
    # again once the one this incarnation began with has passed
    deadline_file: Path | None = None

    def running(self) -> bool:
        if time.time() >= self.deadline and self.deadline_file is not None:
            with contextlib.suppress(OSError, ValueError):
                self.deadline = max(self.deadline, float(self.deadline_file.read_text()))
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
                    if run.spark_ready.is_set() and spark_pending(done, run.spark):
                        action = "fault"  # (its first turns now: the next kill restarts it)
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
        deadline_file=Path(config["deadline_file"]),
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
