"""The cached read, written once: one generator that plans, guards and runs a query with
currency clauses as far as the cache answers it, and yields when its next step would wait.

Like psycopg's protocol generators (`psycopg/generators.py`), it does its work and leaves the
waiting to whoever drives it. Each step is tried at hand first - the plan cache, the
privileges known, the file's committed version without its lock, the regions' state read
and the clock estimated already, the result memo or a lookup index - and when a step would
wait (planning, a DuckDB statement, the backend, a lock another thread holds, a measurement
of the clock) the generator yields once before taking it the waiting way (spelled out at
each step: ``found = at_hand_way(); if found is None: yield; found = waiting_way()``, no
helper generator on the hit path). Two drivers:

- `drive` runs it to the end, waiting where it must: the DB-API's statements, a server's
  worker;
- `at_hand` runs it until it would wait: a server's event loop answers what comes back done
  there, and hands the suspended generator to a worker, which drives it on from where it
  stopped. Nothing is counted or kept twice: the read goes on, it does not start over.

The outcome (`Reading`) is the local or mixed answer, or None when the backend answers the
whole statement (its plan chose it, its guards sent it there, or DuckDB cannot give
PostgreSQL's answer): the caller sends `Prepared.remote` on the session's connection.
"""

from __future__ import annotations

import typing as t
from collections.abc import Generator

from cache.engine.lane import Lane
from cache.engine.result import Result
from cache.execution.planning import Prepared
from optimizer.rules.evaluate_guards import Decision

T = t.TypeVar("T")

# a read in progress: it yields (nothing) when it would wait, and returns its outcome
Read = Generator[None, None, T]


class Reading(t.NamedTuple):
    """A read's outcome: its plan (None: planned without the backend, which is down), the
    answer (None: the backend answers the whole statement), the guards' decision it came
    from (None: none was made) and, when asked for and made at hand, the lane its answer
    leaves for the statement's next runs (`cache.engine.lane`)."""

    prepared: Prepared | None
    result: Result | None = None
    decision: Decision | None = None
    lane: Lane | None = None


def drive(read: Read[T]) -> T:
    """Run a read to its end, waiting where it must."""
    while True:
        try:
            next(read)
        except StopIteration as done:
            return t.cast(T, done.value)


class Suspended(t.NamedTuple):
    """A read that would wait: to be driven on where waiting is allowed (`drive`)."""

    read: Read[t.Any]


def at_hand(read: Read[T]) -> T | Suspended:
    """Run a read until its end or until it would wait (then it is suspended)."""
    try:
        next(read)
    except StopIteration as done:
        return t.cast(T, done.value)
    return Suspended(read)


__all__ = ["Read", "Reading", "Suspended", "at_hand", "drive"]
