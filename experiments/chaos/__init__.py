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

Its parts: the checked world, the fault schedule and the journal (`world`), the cache's
process (`owner`), this process's writers and faults (`run`), the run over the wire (`wire`),
and the run from start to verdict with the command line (`driver`); the history check is
`experiments.chaos_check`.
"""

from __future__ import annotations

from experiments.chaos.driver import main, run_chaos
from experiments.chaos.world import (
    FAIL_POINTS,
    FAULTS,
    KILL_POINTS,
    SPARK_FAULTS,
    next_fault,
    spark_pending,
    turns_taken,
)

__all__ = [
    "FAIL_POINTS",
    "FAULTS",
    "KILL_POINTS",
    "SPARK_FAULTS",
    "main",
    "next_fault",
    "run_chaos",
    "spark_pending",
    "turns_taken",
]
