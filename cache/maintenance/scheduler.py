"""The refresh scheduler of the process that owns a cache file.

Each white view with ``REFRESH EVERY f`` is refreshed (all its regions, by affected closure)
once its oldest region is f old; a fully materialized view never refreshed is populated at
once. A ``REFRESH AUTO`` view is refreshed at the interval chosen, each tick, from the bounds
its queries asked (`cache.maintenance.auto_refresh`). Gray views follow their roots;
presence-controlled views without regions wait for admissions. Failures are logged and retried
at the next tick: the cache is unchanged by a failed refresh, and its guards keep stale data
from being used.
"""

from __future__ import annotations

import datetime as dt
import logging

from cache.maintenance.auto_refresh import AutoIntervals
from cache.maintenance.engines import Engine
from cache.maintenance.pipeline import Maintainer
from cache.maintenance.report import Report
from cache.store.cache_file import CacheStore
from cache.store.refresh_times import objectives, refresh_times
from heartbeat.loop import Loop
from sql_ext.nodes import format_duration

log = logging.getLogger("mtcache.scheduler")


MIN_WAIT = 0.01  # seconds: a view due again at once (f shorter than its refresh) waits this


def _scheduled(store: CacheStore) -> list[tuple[str, dt.datetime]]:
    """(view, when it is due) of the views the scheduler refreshes, parents first."""
    schema = store.load_schema()
    due = []
    for name in schema.topological_order():
        when = refresh_times(store, schema, name)
        if when.follows is None and when.due is not None:
            due.append((name, when.due))
    return due


def due_views(store: CacheStore, now: dt.datetime) -> list[str]:
    """White views whose interval has elapsed (parents first)."""
    return [name for name, due in _scheduled(store) if due <= now]


def next_due(store: CacheStore) -> dt.datetime | None:
    """When the first scheduled view is due (None: none is scheduled)."""
    return min((due for _, due in _scheduled(store)), default=None)


class RefreshScheduler:
    """A daemon thread refreshing views when they are due until stopped: it wakes when the
    first view is due, and at least every ``tick`` seconds (new views, DDL), and a ``tick``
    after a failed refresh (its retry)."""

    def __init__(self, store: CacheStore, dsn: str, engine: Engine, tick: float = 1.0) -> None:
        self.store = store.for_thread()
        self.dsn = dsn
        self.engine = engine
        self.tick = tick
        self.reports: list[Report] = []
        self.errors: list[str] = []
        self.intervals = AutoIntervals(self.store, dsn)
        self.warnings: list[str] = []  # the objectives' warnings (`watch_objectives`)
        self._states: dict[str, str] = {}  # each objective's state at the last tick
        self._loop = Loop("mtcache-refresh")

    def run_once(self, now: dt.datetime | None = None) -> list[Report]:
        now = now or dt.datetime.now(dt.UTC)
        try:
            self.intervals.choose(now.timestamp())
        except Exception as exc:  # logged and tried again at the next tick
            message = f"choosing the REFRESH AUTO intervals failed: {exc}"
            log.warning(message)
            self.errors.append(message)
        done = []
        due = due_views(self.store, now)
        for name in [*due, *(v for v in self.intervals.early if v not in due)]:
            try:
                report = self._refresh(name, now)
            except Exception as exc:  # logged and retried: the cache is unchanged
                message = f"refreshing {name} failed: {exc}"
                log.warning(message)
                self.errors.append(message)
                continue
            if report is not None:
                done.append(report)
        self.reports += done
        try:
            self.watch_objectives(now)
        except Exception as exc:  # (status's reads failing: tried again at the next tick)
            log.warning("checking the objectives failed: %s", exc)
        return done

    def _refresh(self, name: str, now: dt.datetime) -> Report | None:
        """Refresh a view: all its regions, or a REFRESH AUTO view's read since their last
        refresh (None: none was, so none is refreshed; looked at again an interval later)."""
        maintainer = Maintainer(self.store, self.dsn, self.engine)
        regions = self.intervals.read_regions(name)
        if regions is None:
            self.store.region_reads.forget(name)  # (refreshed whole: due by its stamps)
            return maintainer.refresh(name)
        report = None
        if regions:
            report = maintainer.refresh_regions(name, regions)
        else:
            log.info("%s: no region of it was read since its last refresh; none refreshed", name)
        self.store.region_reads.looked[name] = now
        return report

    def watch_objectives(self, now: dt.datetime) -> list[str]:
        """Warn (a log line, kept in `warnings`) when a REFRESH AUTO WITHIN view's next refresh
        is predicted to land past its objective, when its data is older than the objective,
        and when it meets it again: once per change of its state."""
        store = self.store
        said = []
        for name, goal in objectives(store, store.load_schema(), now).items():
            if self._states.get(name, "met") == goal.state:
                continue
            self._states[name] = goal.state
            within = format_duration(goal.within)
            if goal.state == "missed":
                message = f"{name} missed its objective of {within}: " + (
                    f"its data is {goal.age:.1f} s old"
                    if goal.age is not None
                    else "it was never refreshed"
                )
            elif goal.state == "at risk":
                message = f"{name} will miss its objective of {within}: " + (
                    f"its data will be {goal.predicted:.1f} s old when the next refresh "
                    f"lands (refreshes took up to {goal.landing:.3g} s to land lately)"
                    if goal.predicted is not None
                    else "no refresh is due"
                )
            else:
                message = f"{name} meets its objective of {within} again"
            (log.info if goal.state == "met" else log.warning)(message)
            said.append(message)
        self.warnings += said
        return said

    def start(self) -> None:
        self._loop.start(self._run)

    def stop(self) -> None:
        self._loop.stop()
        try:
            self.store.save_gathered(dt.datetime.now(dt.UTC).timestamp(), force=True)
        except Exception as exc:  # (the file closing under it: the last minute's asks are lost)
            log.warning("keeping the bounds asked failed: %s", exc)
        self.store.close()

    def _run(self) -> None:
        wait = self.tick
        while not self._loop.stopping.wait(wait):
            failed = len(self.errors)
            self.run_once()
            wait = self.tick if len(self.errors) > failed else self.until_due()

    def until_due(self, now: dt.datetime | None = None) -> float:
        """How long to sleep at ``now``: until the first view is due, at most a tick."""
        due = next_due(self.store)
        if due is None:
            return self.tick
        until = (due - (now or dt.datetime.now(dt.UTC))).total_seconds()
        return min(self.tick, max(MIN_WAIT, until))
