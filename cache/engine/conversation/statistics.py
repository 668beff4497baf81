"""The server's statements by route and outcome, with their latency (`--metrics`): a counter
and a histogram per route, updated once per statement under an uncontended lock; the hit
path's statements (a lane's answers, all local and answered, on the event loop) only have
their seconds appended to a list, which the loop folds into the buckets every `FOLD` and a
scrape reads as they are (`StatementStats.fold_hits`).

Routes: ``local`` (every table access answered by the cache), ``mixed`` (some accesses local,
the rest fetched from the backend), ``fallback`` (a cached read whose guards failed, answered
whole by the backend), ``remote`` (a statement passed through, or a cached read planned for
the backend), ``cache`` (the cache's own statements: SHOW, SET mtcache.*, cache DDL,
REFRESH). A statement's latency runs from the server starting on its first message to its
ReadyForQuery (a protocol cycle: Parse, Bind, Execute, Sync, or a Query).
"""

from __future__ import annotations

import bisect
import threading

from cache.engine.stats import Sample

ROUTES = ("local", "mixed", "fallback", "remote", "cache")
# bucket bounds in seconds (Prometheus's ``le``): 50 us to 10 s
BOUNDS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
FOLD = 1024  # lane answers kept unfolded at most (8 bytes and a float each)
_HELP = "statements answered by the server, by route and outcome"
_SECONDS = "seconds from a statement's first message to its ReadyForQuery, by route"


class _Route:
    """One route's statements: bucket counts of the failed and of the answered ones (indexed
    by ``ok``; a count is its buckets' sum), and the seconds of all."""

    __slots__ = ("buckets", "seconds")

    def __init__(self) -> None:
        self.buckets = ([0] * (len(BOUNDS) + 1), [0] * (len(BOUNDS) + 1))
        self.seconds = 0.0


class StatementStats:
    """Counts and latency histograms of the server's statements (see the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._routes = {route: _Route() for route in ROUTES}
        # the seconds of lane answers not folded yet: appended by the event loop only, which
        # alone folds them (`fold_hits`), so a scrape copies them without stopping it
        self.hits: list[float] = []

    def record(self, route: str, ok: bool, seconds: float) -> None:
        slot = bisect.bisect_left(BOUNDS, seconds)
        kept = self._routes[route]
        with self._lock:
            kept.buckets[ok][slot] += 1
            kept.seconds += seconds

    def fold_hits(self) -> None:
        """The lane answers' seconds appended to `hits` (local and answered: the event loop
        appends them, where a `record` would cost about 2% of a lookup, as measured by
        experiments/bench_server.py's (f)) counted into the buckets, from the event loop
        when there are `FOLD` of them."""
        with self._lock:
            _fold(self.hits, self._routes["local"])
            self.hits.clear()

    def samples(self) -> list[Sample]:
        with self._lock:
            pending = _Route()  # (the hits not folded yet, counted here and left as they are)
            _fold(self.hits.copy(), pending)
            outcomes, buckets, sums = {}, {}, {}
            for route, kept in self._routes.items():
                failed, answered = kept.buckets
                if route == "local":
                    answered = [a + b for a, b in zip(answered, pending.buckets[True], strict=True)]
                outcomes[(route, True)] = sum(answered)
                outcomes[(route, False)] = sum(failed)
                buckets[route] = [a + b for a, b in zip(answered, failed, strict=True)]
                sums[route] = kept.seconds + (pending.seconds if route == "local" else 0.0)
        found = [
            Sample(
                "mtcache_statements_total",
                (("route", route), ("outcome", "ok" if ok else "error")),
                float(count),
                "counter",
                _HELP,
            )
            for (route, ok), count in outcomes.items()
        ]
        for route, counts in buckets.items():
            total = 0
            for bound, count in zip((*BOUNDS, float("inf")), counts, strict=True):
                total += count
                le = "+Inf" if bound == float("inf") else f"{bound:g}"
                found.append(
                    Sample(
                        "mtcache_statement_seconds_bucket",
                        (("route", route), ("le", le)),
                        float(total),
                        "histogram",
                        _SECONDS,
                    )
                )
            found.append(
                Sample(
                    "mtcache_statement_seconds_sum",
                    (("route", route),),
                    sums[route],
                    "histogram",
                    _SECONDS,
                )
            )
            found.append(
                Sample(
                    "mtcache_statement_seconds_count",
                    (("route", route),),
                    float(total),
                    "histogram",
                    _SECONDS,
                )
            )
        return found


def _fold(seconds: list[float], into: _Route) -> None:
    """Answered statements of these ``seconds`` counted into a route's buckets and sum."""
    counts = into.buckets[True]
    for each in seconds:
        counts[bisect.bisect_left(BOUNDS, each)] += 1
    into.seconds += sum(seconds)


__all__ = ["BOUNDS", "FOLD", "ROUTES", "StatementStats"]
