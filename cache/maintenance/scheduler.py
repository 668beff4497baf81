"""The refresh scheduler of the process that owns a cache file (SPEC §5.10, §7).

Each white view with ``REFRESH EVERY f`` is refreshed (all its regions, by affected closure)
once its oldest region is f old; a fully materialized view never refreshed is populated at
once. Gray views follow their roots; presence-controlled views without regions wait for
admissions. Failures are logged and retried at the next tick: the cache is unchanged by a
failed refresh, and its guards keep stale data from being used.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import typing as t

from cache.maintenance.engines import Engine
from cache.maintenance.pipeline import Maintainer
from cache.maintenance.report import Report
from cache.store.cache_file import CacheStore
from control_tables.regions import guarantees
from sql_ext.quoting import ident

log = logging.getLogger("mtcache.scheduler")


def due_views(store: CacheStore, now: dt.datetime) -> list[str]:
    """White views whose interval has elapsed (parents first)."""
    schema = store.load_schema()
    due = []
    for name in schema.topological_order():
        view = schema.views[name]
        if view.is_gray or not view.refresh_seconds:
            continue
        oldest = _oldest_region(store, name)
        if oldest is None:
            if view.is_fully_materialized:
                due.append(name)  # never populated
            continue
        if oldest == "never" or (now - oldest).total_seconds() >= view.refresh_seconds:
            due.append(name)
    return due


def _oldest_region(store: CacheStore, name: str) -> dt.datetime | t.Literal["never"] | None:
    """The oldest refreshed_at among the view's regions; "never" if one was never refreshed;
    None when the view has no region yet."""
    schema = store.load_schema()
    view = schema.views[name]
    stamps: list[dt.datetime | None] = []
    if view.view_level:
        row = store.con.execute(
            "SELECT refreshed_at FROM mtcache.view_state WHERE view = ?", [name]
        ).fetchone()
        stamps.append(row[0] if row else None)
        if row is None and not view.is_fully_materialized:
            stamps.pop()  # a presence-controlled view-level view waits for its parents
    controls = [p.control for p in view.presence if p.control in schema.control_tables]
    controls += [c for kind, _, c in guarantees(view) if c is not None and kind != "view"]
    for control in controls:
        stamps += [
            r[0] for r in store.con.execute(f"SELECT refreshed_at FROM {ident(control)}").fetchall()
        ]
    if not stamps:
        return None
    if any(s is None for s in stamps):
        return "never"
    return min(t.cast(list[dt.datetime], stamps))


class RefreshScheduler:
    """A daemon thread refreshing due views every ``tick`` seconds until stopped."""

    def __init__(self, store: CacheStore, dsn: str, engine: Engine, tick: float = 1.0) -> None:
        self.store = store.for_thread()
        self.dsn = dsn
        self.engine = engine
        self.tick = tick
        self.reports: list[Report] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self, now: dt.datetime | None = None) -> list[Report]:
        now = now or dt.datetime.now(dt.UTC)
        done = []
        for name in due_views(self.store, now):
            try:
                report = Maintainer(self.store, self.dsn, self.engine).refresh(name)
            except Exception as exc:  # logged and retried: the cache is unchanged
                message = f"refreshing {name} failed: {exc}"
                log.warning(message)
                self.errors.append(message)
                continue
            done.append(report)
        self.reports += done
        return done

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="mtcache-refresh", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.store.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.tick):
            self.run_once()
