"""The checked world: the backend's accounts, entries, clock and log, the fault schedule,
the owner's journal, and one writer transaction."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import threading
import time
import typing as t
from pathlib import Path

from cache.maintenance import faults
from experiments.chaos_check import Observation, Tick, Unit

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

# (the Spark tasks' points are the Spark faults' own: an inline refresh never reaches them)
FAIL_POINTS = [p for p in faults.POINTS if p not in faults.TASK_POINTS] + [
    "after_snapshot:disconnect"
]
KILL_POINTS = [f"{p}:kill" for p in faults.POINTS if p not in faults.TASK_POINTS]
SPARK_FAULTS = ["task", "task:kill"]  # a task raising; a task's Python worker killed
# in turns: Spark's before the kills, so that its JVM has had time to start since the last kill
FAULTS = (
    [("fail", p) for p in FAIL_POINTS]
    + [("spark", p) for p in SPARK_FAULTS]
    + [("kill", p) for p in KILL_POINTS]
)


def next_fault(done: collections.Counter[str], spark: bool, ready: bool) -> tuple[str, str]:
    """The kind whose turns are fewest (in FAULTS order on a tie), but a Spark kind that has
    had no turn goes first once the JVM is up. Spark's wait for the JVM;
    meanwhile the others go, except a kill that is ahead of them: a kill restarts the
    owner and its JVM, so kills wait for Spark's turns (a slow start on a busy machine must
    starve neither)."""
    if spark and ready:  # (Spark's first turns as soon as its JVM is up: a kill may come)
        first = [(k, p) for k, p in FAULTS if k == "spark" and not done[p]]
        if first:
            return first[0]
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
