"""The intervals of `REFRESH AUTO` views, chosen each scheduler tick from the bounds their
queries asked (`cache.store.bound_asks`) by `optimizer.rules.refresh_interval`, and kept in
the cache file (``mtcache.auto_refresh``), where `refresh_times` reads them as it reads a
`REFRESH EVERY` (so status, SHOW CACHED VIEWS and the scheduler agree).

A view's refresh pulls its gray followers too, in the same snapshot: the bounds asked of
them count as asked of it, and their pulls add to its cost. One refresh's backend cost C is
the backend's estimate for the view's defining query (``EXPLAIN``, asked once per schema
and view), in the share of the rows the view holds (a presence-controlled view pulls only its
regions), plus moving those rows (`TRANSFER_ROW_COST` each): the cost units the asks' savings
are in.

A presence-controlled view's refresh pulls only the regions read since their last refresh
(`cache.store.region_reads`, `read_regions`): a region nobody reads is not refreshed, and when
none was read the scheduler looks again an interval later; one refresh's cost is then in the
share of regions its last refresh pulled. A view with an objective (``WITHIN``) is refreshed
whole: the objective is on all its data, read or not.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
import typing as t

from cache.backend.estimates import backend_estimates
from cache.maintenance.pipeline import view_regions
from cache.maintenance.pull import pull_query
from cache.store.cache_file import CacheStore
from cache.store.refresh_times import (
    auto_refreshes,
    longest_delays,
    measured_delays,
    refresh_times,
)
from cache.store.region_state import control_regions
from control_tables.kinds import RegionKind
from control_tables.regions import Region, Stamp, guarantees
from control_tables.schema import CachedView, CacheSchema
from optimizer.rules.estimate_cost import DEFAULT_DELAY, TRANSFER_ROW_COST
from optimizer.rules.refresh_interval import IntervalChoice, choose_interval, upquery_gain
from sql_ext.catalog import Catalog
from sql_ext.errors import Error
from sql_ext.quoting import ident

log = logging.getLogger("mtcache.scheduler")

REWRITE_EVERY = 60.0  # seconds: an unchanged choice is written again this often (its figures)
# the regions whose reads a refresh follows: those a guard looks up by key
KEYED = (RegionKind.PRESENCE, RegionKind.COMPLETENESS)


def defining_query(view: CachedView, catalog: Catalog) -> str | None:
    """The backend query of all the view's rows (None: its table is gone)."""
    if not view.is_derived and catalog.table(view.table) is None:
        return None
    return pull_query(view, "TRUE", catalog).sql()


class AutoIntervals:
    """The scheduler's chooser of REFRESH AUTO intervals (one per scheduler)."""

    COSTS_FOR = 600.0  # seconds a view's defining query's estimate is kept

    def __init__(self, store: CacheStore, dsn: str) -> None:
        self.store = store
        self.dsn = dsn
        self._estimates: dict[str, tuple[int, float, float, float]] = {}  # view -> (schema
        # version, when, cost, rows)
        self.early: list[str] = []  # views to refresh at once (`choose`)
        # the share of its keyed regions each view's last refresh pulled (`read_regions`)
        self._read_share: dict[str, float] = {}

    def choose(self, now: float | None = None) -> dict[str, IntervalChoice]:
        """Fold the reads' asks, choose each REFRESH AUTO view's interval at ``now`` (seconds
        since the epoch) and keep the choices (and the asks) in the file; `early` names the
        views a burst of reads that missed pays to refresh now, ahead of their schedule."""
        now = time.time() if now is None else now
        self.early = []
        store = self.store
        schema = store.load_schema()
        store.region_reads.watch(_watched(schema), self._newest_stamp)
        asks = store.load_asks()
        asks.fold(now)
        asks.forget(schema.views)
        burst = asks.burst(now)  # (the reads of the last few seconds, when enough have passed)
        chosen: dict[str, IntervalChoice] = {}
        bursts: dict[str, tuple[dict[float, float], float, float]] = {}  # recent, d, C
        autos = [v for v in schema.topological_order() if _chooses(schema.views[v])]
        for name in set(self._read_share) - set(autos):  # (dropped, or no longer AUTO)
            del self._read_share[name]
            store.region_reads.forget(name)
        if autos:
            delays, landings = measured_delays(store), longest_delays(store)
            for name in autos:
                group = [name, *followers(schema, name)]
                saved: dict[float, float] = {}
                recent: dict[float, float] = {}
                for member in group:
                    for bound, rate in asks.rates(member, now)[1].items():
                        saved[bound] = saved.get(bound, 0.0) + rate
                    for bound, rate in (burst or {}).get(member, {}).items():
                        recent[bound] = recent.get(bound, 0.0) + rate
                cost = sum(self.pull_cost(schema, schema.views[m]) for m in group)
                if by_region(schema.views[name], schema):  # (the share its last refresh pulled)
                    cost *= self._read_share.get(name, 1.0)
                else:
                    self._read_share.pop(name, None)
                    store.region_reads.forget(name)
                # a bound is met every time only if the refresh lands within it every time: the
                # longest recent landing, not the median d, is the delay the choice allows for
                delay = landings.get(name, delays.get(name, DEFAULT_DELAY))
                chosen[name] = choose_interval(
                    saved, delay, cost, schema.views[name].within_seconds
                )
                if recent:
                    bursts[name] = (recent, delay, cost)
        self._keep(chosen, now)
        self.early = self._early(schema, bursts, now)
        store.save_gathered(now)
        return chosen

    def _early(
        self,
        schema: CacheSchema,
        bursts: dict[str, tuple[dict[float, float], float, float]],
        now: float,
    ) -> list[str]:
        """The views whose reads just now missed enough to pay for a refresh at once
        (`upquery_gain`), those already due aside."""
        found = []
        at = dt.datetime.fromtimestamp(now, dt.UTC)
        for name, (recent, delay, cost) in bursts.items():
            times = refresh_times(self.store, schema, name)
            oldest, due = times.stamps.oldest, times.due
            looked = self.store.region_reads.looked.get(name)
            if oldest is not None and looked is not None:  # (refreshed by the regions read:
                # those read were refreshed when last looked at, the others are old by design)
                oldest = max(oldest, looked)
            if due is not None and due <= at:
                continue  # (refreshed now anyway)
            age = math.inf if oldest is None else (at - oldest).total_seconds()
            until = math.inf if due is None else (due - at).total_seconds()
            gain = upquery_gain(recent, age, delay, cost, until)
            if gain > 0:
                log.info(
                    "refreshing %s ahead of its schedule: reads just missed it, and a refresh now "
                    "saves the backend %.4g cost units more than it costs",
                    name,
                    gain,
                )
                found.append(name)
        return found

    def read_regions(self, name: str) -> set[Region] | None:
        """What a refresh of REFRESH AUTO view ``name`` pulls: its keyed regions read since
        their last refresh (`cache.store.region_reads`; the regions they enclose come with
        them, by closure); None: all its regions (it has an objective, or no keyed
        regions)."""
        store = self.store
        schema = store.load_schema()
        view = schema.views.get(name)
        if view is None or not by_region(view, schema):
            return None  # (a view dropped meanwhile: the refresh says so)
        regions: dict[str, dict[tuple[t.Any, ...], Stamp]] = {}
        read: dict[str, set[tuple[t.Any, ...]] | None] = {}
        chosen: set[Region] = set()
        keyed = 0
        for region in view_regions(store, view):
            control = region.control
            if control is None or control not in schema.control_tables:
                continue  # (a parent view's keys: pulled with the keys that enclose them)
            if control not in regions:
                regions[control] = control_regions(
                    store.con, control, schema.control_tables[control]
                )
            if region.kind not in KEYED:  # (pulled with the keys it encloses, or at once if
                # it was never refreshed: an interrupted pull)
                stamp = regions[control].get(region.values)
                if stamp is not None and stamp[0] is None:
                    chosen.add(region)
                continue
            if control not in read:
                found = store.region_reads.read_since(control, regions[control])
                read[control] = None if found is None else set(found)
            keyed += 1
            keys = read[control]
            if keys is None or region.values in keys:
                chosen.add(region)
        pulled = len([r for r in chosen if r.kind in KEYED])
        if pulled or not keyed:  # (none read: the pulls' cost stands as it was, not nil)
            self._read_share[name] = pulled / keyed if keyed else 1.0
        return chosen

    def _newest_stamp(self, control: str) -> dt.datetime | None:
        """A control table's newest region stamp."""
        [(newest,)] = self.store.con.execute(
            f"SELECT max(refreshed_at) FROM {ident(control)}"
        ).fetchall()
        return newest

    def pull_cost(self, schema: CacheSchema, view: CachedView) -> float:
        """One refresh's backend cost for ``view`` (see the module); 0 when the backend cannot
        estimate it (then the asks alone decide)."""
        store = self.store
        kept = self._estimates.get(view.name)
        if (
            kept is None
            or kept[0] != store.schema_version
            or time.monotonic() - kept[1] > self.COSTS_FOR
        ):
            cost, rows = self._estimate(view)
            kept = (store.schema_version, time.monotonic(), cost, rows)
            self._estimates[view.name] = kept
        cost, rows = kept[2], kept[3]
        if not math.isfinite(cost):
            return 0.0
        if view.is_fully_materialized:
            return cost + rows * TRANSFER_ROW_COST
        [(held,)] = store.con.execute(f"SELECT count(*) FROM {ident(view.name)}").fetchall()
        return cost * min(1.0, held / max(rows, 1.0)) + held * TRANSFER_ROW_COST

    def _estimate(self, view: CachedView) -> tuple[float, float]:
        try:
            query = defining_query(view, self.store.load_catalog())
            if query is None:
                return math.inf, 0.0
            return backend_estimates(self.dsn, [(query, None)])[query]
        except Error as exc:  # (the backend down: no estimate now, asked again later)
            log.warning("estimating a refresh of %s failed: %s", view.name, exc)
            return math.inf, 0.0

    def _keep(self, chosen: dict[str, IntervalChoice], now: float) -> None:
        """Write the choices that changed (interval or bounds served), and the others once a
        minute (their figures), in one transaction; drop those of views no longer AUTO."""
        store = self.store
        kept = auto_refreshes(store)
        at = dt.datetime.fromtimestamp(now, dt.UTC)
        rows = []
        for view, choice in chosen.items():
            old = kept.get(view)
            if (
                old is None
                or _rounded(old.interval) != _rounded(choice.interval)
                or old.served != choice.served
                or (at - old.chosen_at).total_seconds() >= REWRITE_EVERY
            ):
                rows.append(
                    (view, choice.interval, list(choice.served), choice.reason, choice.saves, at)
                )
        gone = [v for v in kept if v not in chosen]
        if not rows and not gone:
            return
        with store.transaction() as con:
            for view in gone:
                con.execute("DELETE FROM mtcache.auto_refresh WHERE view = ?", [view])
            for row in rows:
                con.execute(
                    "INSERT OR REPLACE INTO mtcache.auto_refresh VALUES (?, ?, ?, ?, ?, ?)",
                    list(row),
                )


def _chooses(view: CachedView) -> bool:
    return view.auto and not view.is_gray


def followers(schema: CacheSchema, root: str) -> list[str]:
    """The gray views refreshed with white view ``root``."""
    return [
        v
        for v in schema.topological_order()
        if v != root and schema.views[v].is_gray and schema.consistency_root(v) == root
    ]


def by_region(view: CachedView, schema: CacheSchema) -> bool:
    """Whether a refresh of ``view`` pulls only its regions read since their last refresh: a
    REFRESH AUTO view without an objective, of keyed regions, controlling no other view (the
    reads of those are of its rows by their own keys, not its control's: its refresh pulls
    them all)."""
    return (
        _chooses(view)
        and view.within_seconds is None
        and bool(_keyed_controls(view, schema))
        and not schema.children(view.name)
    )


def _keyed_controls(view: CachedView, schema: CacheSchema) -> set[str]:
    if view.view_level:
        return set()
    found = {p.control for p in view.presence}
    found |= {c for kind, _, c in guarantees(view) if kind == RegionKind.COMPLETENESS and c}
    return {c for c in found if c in schema.control_tables}


def _watched(schema: CacheSchema) -> set[str]:
    """The control tables whose reads the refreshes of REFRESH AUTO views follow."""
    found: set[str] = set()
    for view in schema.views.values():
        if by_region(view, schema):
            found |= _keyed_controls(view, schema)
    return found


def _rounded(interval: float | None) -> float | None:
    return None if interval is None else round(interval, 2)
