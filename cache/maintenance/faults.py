"""Named fault points in the refresh pipeline, for tests that must prove a failure at that
point leaves the cache file exactly as it was.

Inert unless enabled: by the ``MTCACHE_FAULTS`` environment variable (a comma-separated list,
read when a pipeline starts) or by the ``faults`` argument of a refresh. ``NAME`` raises
`InjectedFault` there; ``NAME:kill`` kills the process on the spot (SIGKILL: no cleanup, no
rollback handler runs), as a crash or an out-of-memory kill would; ``NAME:stall`` hangs there
(up to a minute, less once its parent process is gone), as a stuck backend or task would, so
a test can interrupt or kill the refresh while it waits (with ``MTCACHE_FAULT_MARK`` naming a
file, the stall writes its point and process id there when it begins, as a raised fault
does when it fires);
``NAME:sleep=SECONDS`` waits that long there and goes on, as a slow network between the
backend and the cache would (the workload-shift experiment emulates the dissertation's
propagation delays with it).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

POINTS = ("after_snapshot", "after_pull", "before_commit", "task", "first_task")
TASK_POINTS = ("task", "first_task")  # reached only by a pull on Spark
# task: every Spark task, every attempt; first_task: the first attempt of an operation's first
# task only (Spark runs the task again, so a pull on a cluster goes on: a lost executor)
# The stream consumer's (cache.maintenance.stream):
STREAM_POINTS = ("stream_apply", "stream_advance", "stream_piece")
# stream_apply: the stream consumer's batch applied in DuckDB, its position not yet stored;
# stream_advance: the batch committed with its position, the slot not yet advanced;
# stream_piece: a piece of a transaction spilled to disk applied, the next not yet
# ``after_snapshot:disconnect`` makes the backend terminate the refresh's session (a real
# server-side disconnect, as a backend restart or a network cut would cause).


STALL_SECONDS = 60.0


class InjectedFault(RuntimeError):
    """Raised at an enabled fault point."""


def active(extra: Iterable[str] = ()) -> frozenset[str]:
    from_env = {f.strip() for f in os.environ.get("MTCACHE_FAULTS", "").split(",") if f.strip()}
    return frozenset(from_env | set(extra))


def hit(point: str, enabled: frozenset[str], mark: str | None = None) -> None:
    """The fault enabled at ``point``, if any; ``mark`` is the file a stall or a raised fault
    notes itself in (default ``MTCACHE_FAULT_MARK``: a Spark task gets its driver's, as
    executors may not share it)."""
    mark = mark or os.environ.get("MTCACHE_FAULT_MARK")
    for fault in enabled:
        if fault.startswith(f"{point}:sleep="):
            time.sleep(float(fault.partition("=")[2]))
    if f"{point}:kill" in enabled:
        os.kill(os.getpid(), signal.SIGKILL)
    if f"{point}:stall" in enabled:
        _note(mark, point)  # a test waits for the stall to begin (not for a time to pass)
        parent = os.getppid()
        deadline = time.monotonic() + STALL_SECONDS
        while time.monotonic() < deadline and os.getppid() == parent:
            time.sleep(0.1)
    if point in enabled:
        _note(mark, point)  # (a test tells a fault that fired from one never reached)
        raise InjectedFault(f"injected fault at {point}")


def _note(mark: str | None, point: str) -> None:
    if mark:
        with open(mark, "a") as marked:
            marked.write(f"{point} {os.getpid()}\n")
