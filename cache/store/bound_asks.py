"""The currency bounds queries ask of each cached view: what `REFRESH AUTO` chooses a view's
interval from (`optimizer.rules.refresh_interval`), and what status shows as the bounds asked.

Every cached read of a plan that guards a view asks for the view's data at most B old, and
would save the backend the cost the model estimated (`optimizer.plan.Plan.asks`). The reads
only count their plan's asks (one lock, one increment: the hit path pays nothing more); the
refresh scheduler folds them, each tick, into per-view sums per bound that halve every
``half_life`` (a decayed histogram), and keeps the sums in the cache file
(``mtcache.bound_asks``), so that a restarted process goes on from them.

A bound's rate is its decayed sum over the decayed length of the window it was gathered in:
for queries arriving at a steady rate, the rate itself, from the first minute on (a sum
alone would read a young workload as a slow one for an hour).
"""

from __future__ import annotations

import datetime as dt
import math
import time
import typing as t
from collections import defaultdict
from dataclasses import dataclass, field

from cache.store.gathered import Gathered

ASKS_HALF_LIFE = 3600.0  # seconds: an ask counts half after this long
BURST_WINDOW = 5.0  # seconds: the shortest window a burst's rate is read over
BURST_READS = 10  # reads of one bound in a window: fewer are no burst

# (view, bound in seconds (inf: any age), the backend cost a local answer saves), per view
Asks = tuple[tuple[str, float, float], ...]


@dataclass
class Asked:
    """One view's bounds asked: per bound, the decayed count of queries and of the backend
    cost their local answers would save; since when it was gathered; as of ``at``."""

    counts: dict[float, float] = field(default_factory=dict)
    saved: dict[float, float] = field(default_factory=dict)
    since: float = 0.0  # (seconds since the epoch)
    at: float = 0.0

    def decayed(self, now: float, half_life: float) -> None:
        """The sums as they stand at ``now``."""
        if now <= self.at:
            return
        factor = 0.5 ** ((now - self.at) / half_life)
        for sums in (self.counts, self.saved):
            for bound in sums:
                sums[bound] *= factor
        self.at = now

    def window(self, now: float, half_life: float) -> float:
        """The decayed length of the window the sums were gathered over (seconds)."""
        return half_life / math.log(2) * (1.0 - 0.5 ** (max(now - self.since, 0.0) / half_life))


class BoundAsks(Gathered):
    """The bounds asked of a cache file's views in this process (every handle shares it)."""

    TABLE = "bound_asks"
    COLUMNS = "view, bound, queries, saved, epoch(since), epoch(as_of)"

    def __init__(self, half_life: float = ASKS_HALF_LIFE) -> None:
        super().__init__()
        self.half_life = half_life
        self._pending: dict[int, list[t.Any]] = {}  # id(asks) -> [asks, count, first read]
        self._views: dict[str, Asked] = {}
        # the reads since the burst window began (`burst`): per (view, bound), [queries, the
        # backend cost their local answers would save], and when the window began
        self._window: defaultdict[tuple[str, float], list[float]] = defaultdict(lambda: [0.0, 0.0])
        self._window_start: float | None = None

    def asked(self, asks: Asks) -> None:
        """A read of a plan with these asks (the plan's own tuple: counted by identity)."""
        with self._lock:
            entry = self._pending.get(id(asks))
            if entry is None:
                self._pending[id(asks)] = [asks, 1, time.time()]
            else:
                entry[1] += 1

    def fold(self, now: float) -> None:
        """Add the reads counted since the last fold to the sums, decayed to ``now``."""
        with self._lock:
            pending, self._pending = self._pending, {}
            added: defaultdict[tuple[str, float], list[float]] = defaultdict(
                lambda: [0.0, 0.0, math.inf]
            )
            for asks, count, first in pending.values():
                for view, bound, saved in asks:
                    sums = added[view, bound]
                    sums[0] += count
                    sums[1] += count * saved
                    sums[2] = min(sums[2], first)
            views = self._views
            self._dirty = self._dirty or bool(added)
            if self._window_start is None:
                self._window_start = min((f for _, _, f in pending.values()), default=now)
            for (view, bound), (count, saved, first) in added.items():
                window = self._window[view, bound]
                window[0] += count
                window[1] += saved
                found = views.get(view)
                if found is None:  # (gathered since its first read)
                    found = views[view] = Asked(since=min(first, now), at=now)
                found.decayed(now, self.half_life)
                found.counts[bound] = found.counts.get(bound, 0.0) + count
                found.saved[bound] = found.saved.get(bound, 0.0) + saved

    def rates(self, view: str, now: float) -> tuple[dict[float, float], dict[float, float]]:
        """Per bound asked of ``view``: (queries per second, backend cost their local answers
        would save per second), as of ``now`` (after `fold`)."""
        with self._lock:
            found = self._views.get(view)
            if found is None:
                return {}, {}
            found.decayed(now, self.half_life)
            window = found.window(now, self.half_life)
            if window <= 0.0:
                return {}, {}
            return (
                {b: c / window for b, c in found.counts.items()},
                {b: s / window for b, s in found.saved.items()},
            )

    def burst(self, now: float) -> dict[str, dict[float, float]] | None:
        """The reads of the window that ends at ``now`` (after `fold`), which then begins
        again: per view and bound asked, the backend cost their local answers would save per
        second - a burst reads here as it is, where `rates` smooths it over the hour. None
        while the window is shorter than BURST_WINDOW (a rate over milliseconds is noise);
        a bound asked fewer than BURST_READS times in it is left out (one read is no burst)."""
        with self._lock:
            start = self._window_start
            if start is None or now - start < BURST_WINDOW:
                return None
            span = now - start
            found: dict[str, dict[float, float]] = {}
            for (view, bound), (count, saved) in self._window.items():
                if count >= BURST_READS:
                    found.setdefault(view, {})[bound] = saved / span
            self._window.clear()
            self._window_start = now
            return found

    def counts(self, view: str, now: float) -> dict[float, float]:
        """Per bound asked of ``view``: the queries that asked it, decayed to ``now``."""
        with self._lock:
            found = self._views.get(view)
            if found is None:
                return {}
            found.decayed(now, self.half_life)
            return dict(found.counts)

    def forget(self, keep: t.Collection[str]) -> None:
        """Drop the sums of views no longer cached."""
        with self._lock:
            for view in set(self._views) - set(keep):
                del self._views[view]
                self._dirty = True

    # -- in the cache file (`cache.store.cache_file.CacheStore.save_gathered`) --------------------

    def load(self, rows: t.Iterable[tuple[t.Any, ...]]) -> None:
        """The sums the file keeps (view, bound, queries, saved, since, at; the moments in
        seconds since the epoch), once per process, added to those this process counted
        before (later, this process's include them)."""
        with self._lock:
            if not self._first_load():
                return
            for view, bound, count, saved, since, at in rows:
                # (added to what this process counted before it read them, decayed to it)
                found = self._views.get(view)
                if found is None:
                    found = self._views[view] = Asked(since=since, at=at)
                factor = 0.5 ** (max(found.at - at, 0.0) / self.half_life)
                found.counts[bound] = found.counts.get(bound, 0.0) + count * factor
                found.saved[bound] = found.saved.get(bound, 0.0) + saved * factor
                found.since = min(found.since, since)

    def to_save(self, now: float, force: bool = False) -> list[tuple[t.Any, ...]] | None:
        """The rows of ``mtcache.bound_asks`` to write at ``now``; None: nothing changed, or
        not yet (at most every SAVE_EVERY seconds unless ``force``)."""
        with self._lock:
            if not self._due(now, force):
                return None
            return [
                (
                    view,
                    bound,
                    count,
                    found.saved.get(bound, 0.0),
                    _moment(found.since),
                    _moment(found.at),
                )
                for view, found in self._views.items()
                for bound, count in found.counts.items()
            ]


def _moment(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)
