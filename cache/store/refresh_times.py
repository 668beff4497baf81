"""When each view was last refreshed and when the refresh scheduler will refresh it next
(`REFRESH EVERY`): read from the regions' stamps, for the scheduler and for `status`.

A white view with ``REFRESH EVERY f`` is due once its oldest region is f old, at once when one
of its regions was never refreshed or when it is fully materialized and was never populated; a
presence-controlled view without regions waits for admissions. A ``REFRESH CONTINUOUSLY`` view
is due only while a region of it was never populated (then at once). A ``REFRESH AUTO`` view
is due as a ``REFRESH EVERY`` one at the interval last chosen for it (`AutoRefresh`), never
while none is, and, when its refreshes pull only the regions read (`cache.store.region_reads`),
not before an interval after the scheduler last looked them over. Gray views follow their
roots; views without an interval are refreshed on demand only.
"""

from __future__ import annotations

import datetime as dt
import statistics
import typing as t
from collections import defaultdict
from dataclasses import dataclass

from cache.store.cache_file import CacheStore
from control_tables.kinds import RegionKind
from control_tables.regions import guarantees
from control_tables.schema import CachedView, CacheSchema
from optimizer.rules.estimate_cost import DEFAULT_DELAY
from sql_ext.quoting import ident

NOW = dt.datetime.min.replace(tzinfo=dt.UTC)  # due at once
DELAY_HISTORY = 20  # operations per view the measured delay is the median of


@dataclass(frozen=True)
class RegionStamps:
    """A view's regions' refresh times, summed up: how many, how many never refreshed, the
    oldest and the newest refresh."""

    count: int = 0
    never: int = 0
    oldest: dt.datetime | None = None
    newest: dt.datetime | None = None

    def __add__(self, other: RegionStamps) -> RegionStamps:
        def pick(
            a: dt.datetime | None, b: dt.datetime | None, choose: t.Callable[..., dt.datetime]
        ) -> dt.datetime | None:
            return choose(a, b) if a is not None and b is not None else a or b

        return RegionStamps(
            self.count + other.count,
            self.never + other.never,
            pick(self.oldest, other.oldest, min),
            pick(self.newest, other.newest, max),
        )


@dataclass(frozen=True)
class RefreshTimes:
    stamps: RegionStamps  # the view's regions' (status shows them too)
    due: dt.datetime | None  # the scheduler's next refresh (NOW: at once; None: not scheduled)
    follows: str | None = None  # a gray view: the root whose refreshes it follows

    @property
    def last(self) -> dt.datetime | None:
        """The newest region stamp (None: never refreshed)."""
        return self.stamps.newest


@dataclass(frozen=True)
class AutoRefresh:
    """A REFRESH AUTO view's choice as the file keeps it."""

    view: str
    interval: float | None
    served: tuple[float, ...]
    reason: str
    saves: float  # backend cost units saved an hour, net of the pulls
    chosen_at: dt.datetime


def auto_refreshes(store: CacheStore) -> dict[str, AutoRefresh]:
    """The choices the file keeps, per view."""
    return {
        row[0]: AutoRefresh(row[0], row[1], tuple(row[2] or ()), row[3], row[4], row[5])
        for row in store.con.execute(
            "SELECT view, interval_seconds, served, reason, saves, chosen_at "
            "FROM mtcache.auto_refresh"
        ).fetchall()
    }


@dataclass(frozen=True)
class Objective:
    """A REFRESH AUTO WITHIN view's objective at a moment: its oldest data's age, the age it
    will have reached when its next refresh lands (None: never refreshed, or no refresh is
    due), and its state: met, at risk (that age is past the objective) or missed (the data is
    older than the objective now, or there is none yet)."""

    within: float
    age: float | None
    predicted: float | None
    state: t.Literal["met", "at risk", "missed"]
    landing: float  # the longest a refresh took to land lately: what the prediction allows

    def to_json(self) -> dict[str, t.Any]:
        return {
            "age_seconds": self.age,
            "predicted_age_seconds": self.predicted,
            "state": self.state,
        }


def objective(
    view: CachedView, times: RefreshTimes, now: dt.datetime, landing: float
) -> Objective | None:
    """The view's objective at ``now`` (None: it states none), its next refresh taking up to
    ``landing`` seconds to land (`longest_delays`)."""
    within = view.within_seconds
    if within is None:
        return None
    oldest = times.stamps.oldest
    if oldest is None or times.stamps.never:
        return Objective(within, None, None, "missed", landing)
    age = (now - oldest).total_seconds()
    predicted = None
    if times.due is not None:
        predicted = (max(times.due, now) - oldest).total_seconds() + landing
    if age > within:
        return Objective(within, age, predicted, "missed", landing)
    late = predicted is None or predicted > within
    return Objective(within, age, predicted, "at risk" if late else "met", landing)


def objectives(store: CacheStore, schema: CacheSchema, now: dt.datetime) -> dict[str, Objective]:
    """The objective of each view that states one, at ``now``: a refresh taking as long to
    land as the longest of its recent ones (the default delay before any was measured)."""
    views = [v for v in schema.views.values() if v.within_seconds is not None]
    if not views:
        return {}
    landings = longest_delays(store)
    found = {}
    for view in views:
        times = refresh_times(store, schema, view.name)
        goal = objective(view, times, now, landings.get(view.name, DEFAULT_DELAY))
        if goal is not None:
            found[view.name] = goal
    return found


def refresh_times(store: CacheStore, schema: CacheSchema, name: str) -> RefreshTimes:
    view = schema.views[name]
    stamps = region_stamps(store, schema, name)
    if view.is_gray:
        root = schema.consistency_root(name)
        followed = refresh_times(store, schema, root)
        # its regions are its parent's: refreshed with its root, when the root was (a view
        # refreshed a moment ago read "never refreshed")
        return RefreshTimes(stamps if stamps.count else followed.stamps, followed.due, root)
    interval = view.refresh_seconds
    if view.auto:  # (the interval the bounds asked chose: `cache.maintenance.auto_refresh`)
        kept = auto_refreshes(store).get(name)
        interval = kept.interval if kept is not None else None
    if not interval:
        # a continuously maintained view is pulled once, at once, when a region of it was
        # never populated (its creation's pull, or one the stream asked for, interrupted by a
        # crash); the stream keeps it current from then on
        never = view.continuous and stamps.never > 0
        return RefreshTimes(stamps, NOW if never else None)
    if not stamps.count:
        return RefreshTimes(stamps, NOW if view.is_fully_materialized else None)
    if stamps.never:
        return RefreshTimes(stamps, NOW)
    assert stamps.oldest is not None
    due = stamps.oldest + dt.timedelta(seconds=interval)
    looked = store.region_reads.looked.get(name) if view.auto else None
    if looked is not None:  # (regions nobody read are left old: looked over an interval on)
        due = max(due, looked + dt.timedelta(seconds=interval))
    return RefreshTimes(stamps, due)


def region_stamps(store: CacheStore, schema: CacheSchema, name: str) -> RegionStamps:
    """The view's regions' refresh times, summed up in SQL (a million regions' times read
    into Python took seconds)."""
    view = schema.views[name]
    found = RegionStamps()
    if view.view_level:
        row = store.con.execute(
            "SELECT refreshed_at FROM mtcache.view_state WHERE view = ?", [name]
        ).fetchone()
        if row is not None or view.is_fully_materialized:
            # a presence-controlled view-level view without a state waits for its parents
            at = row[0] if row else None
            found += RegionStamps(1, int(at is None), at, at)
    controls = [p.control for p in view.presence if p.control in schema.control_tables]
    controls += [c for kind, _, c in guarantees(view) if c is not None and kind != RegionKind.VIEW]
    for control in controls:
        row = store.con.execute(
            f"SELECT count(*), count(*) - count(refreshed_at), min(refreshed_at), "
            f"max(refreshed_at) FROM {ident(control)}"
        ).fetchone()
        assert row is not None
        found += RegionStamps(int(row[0]), int(row[1]), row[2], row[3])
    return found


def last_engines(store: CacheStore) -> dict[str, tuple[str, str | None]]:
    """The engine of each view's last operation, and why it ran there (one statement over
    the recent operations, as `measured_delays`)."""
    rows = store.con.execute(
        "SELECT views, engine, engine_reason FROM mtcache.snapshots WHERE views IS NOT NULL "
        "ORDER BY snapshot_id DESC LIMIT 2000"
    ).fetchall()
    found: dict[str, tuple[str, str | None]] = {}
    for views, engine, reason in rows:
        for view in views or ():
            found.setdefault(view, (engine, reason))
    return found


def measured_delays(store: CacheStore) -> dict[str, float]:
    """Each view's refresh delay d (§4.6), measured: the median, over its last operations
    (refreshes, admissions), of how old their snapshot was when their rows became visible.
    Views with no such operation are absent (the cost model's default stands)."""
    return {view: statistics.median(delays) for view, delays in recent_delays(store).items()}


def longest_delays(store: CacheStore) -> dict[str, float]:
    """The longest delay of each view's last operations: how long a refresh may take to
    land, as an objective (REFRESH AUTO WITHIN) must allow."""
    return {view: max(delays) for view, delays in recent_delays(store).items()}


def recent_delays(store: CacheStore) -> dict[str, list[float]]:
    """The delays of each view's last DELAY_HISTORY operations, newest first."""
    rows = store.con.execute(
        "SELECT views, delay_seconds FROM mtcache.snapshots WHERE delay_seconds IS NOT NULL "
        "ORDER BY snapshot_id DESC LIMIT 2000"
    ).fetchall()
    recent: defaultdict[str, list[float]] = defaultdict(list)
    for views, delay in rows:
        for view in views or ():
            if len(recent[view]) < DELAY_HISTORY:
                recent[view].append(float(delay))
    return dict(recent)
