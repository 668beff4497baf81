"""The history check of the C&C checker (experiments/chaos/), in the spirit of Elle: from the
writers' log alone, which backend snapshots could have produced an answer, and whether one of
them satisfies what the query asked.

The backend's history is a sequence of ticks: writers serialize on one clock row, so tick T's
transaction commits after T-1's, and the state at T (every row's version) is exactly what a
snapshot taken between their commits sees. Each row's version only grows, so the ticks at which
a row has a given version form an interval, as do the ticks at which a group's sum of versions
has a given value. An answer (a consistency unit: one class, or one BY group of it) is the
state at one snapshot exactly when the intersection of its rows' and groups' intervals is not
empty; the snapshot is fresh enough for bound B when the newest tick in that intersection was
still current (its successor not yet committed) at the query's start minus B.

Times are seconds on this machine's clock, which the backend shares (same host). A tick's
commit is known only between two readings: ``visible_after`` (the backend's clock_timestamp()
inside the transaction, just before COMMIT) and ``committed`` (when COMMIT returned to the
writer). The check errs towards accepting: a state counts as current until the latest its
successor can have committed, and as visible from the earliest it can have.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

EPSILON = 0.005  # clock granularity between the processes' readings of the same clock


@dataclass(frozen=True)
class Tick:
    tick: int
    committed: float  # when the writer's COMMIT returned: committed by then
    writes: dict[int, int]  # account id -> its new version
    visible_after: float = 0.0  # the backend's clock just before COMMIT: not visible before


@dataclass(frozen=True)
class Unit:
    """What must come from one snapshot: rows (id, version) and groups (grp, sum of versions)."""

    rows: tuple[tuple[int, int], ...] = ()
    groups: tuple[tuple[int, int], ...] = ()
    bound: float | None = None  # its class's own bound, when the query gave classes their own
    floor_tick: int | None = None  # the session's own last write to its tables, when that is
    # not the observation's (a session's reads see its writes table by table)


@dataclass(frozen=True)
class Observation:
    session: int
    start: float
    end: float
    bound: float | None  # seconds; None: no bound stated (must be current)
    units: tuple[Unit, ...]
    shape: str
    local: bool = False
    timeline: int | None = None  # the TIMEORDERED bracket it ran in
    floor_tick: int | None = None  # the session's own last committed write
    detail: str = ""  # what the answer said of itself (provenance), for the report


@dataclass
class Verdict:
    checked: int = 0
    local: int = 0
    violations: list[str] = field(default_factory=list)


class Timeline:
    """Which ticks each row version and group version sum spans."""

    def __init__(self, groups: dict[int, int], ticks: Sequence[Tick]) -> None:
        self.groups = groups  # account id -> group
        self.ticks = sorted(ticks, key=lambda t: t.tick)
        numbers = [t.tick for t in self.ticks]
        assert numbers == list(range(1, len(numbers) + 1)), "ticks must be 1..n without gaps"
        self.last = len(numbers)
        self.committed = [0.0] + [t.committed for t in self.ticks]
        # the earliest each tick can have become visible (non-decreasing: commits are ordered)
        self.visible = [0.0]
        for tick in self.ticks:
            self.visible.append(max(self.visible[-1], tick.visible_after))
        # per row: the ticks at which its version changed, and the versions
        self._row_ticks: dict[int, list[int]] = {i: [0] for i in groups}
        self._row_versions: dict[int, list[int]] = {i: [0] for i in groups}
        self._group_ticks: dict[int, list[int]] = {g: [0] for g in set(groups.values())}
        self._group_sums: dict[int, list[int]] = {g: [0] for g in set(groups.values())}
        for tick in self.ticks:
            for account, version in sorted(tick.writes.items()):
                self._row_ticks[account].append(tick.tick)
                self._row_versions[account].append(version)
            for group in sorted({groups[a] for a in tick.writes}):
                total = self._group_sums[group][-1] + sum(
                    v - self._row_versions[a][-2]
                    for a, v in tick.writes.items()
                    if groups[a] == group
                )
                self._group_ticks[group].append(tick.tick)
                self._group_sums[group].append(total)

    def row_interval(self, account: int, version: int) -> tuple[int, int] | None:
        return _interval(
            self._row_ticks.get(account, []),
            self._row_versions.get(account, []),
            version,
            self.last,
        )

    def group_interval(self, group: int, total: int) -> tuple[int, int] | None:
        return _interval(
            self._group_ticks.get(group, []), self._group_sums.get(group, []), total, self.last
        )

    def unit_interval(self, unit: Unit) -> tuple[int, int] | None:
        lo, hi = 0, self.last
        spans = [self.row_interval(*r) for r in unit.rows]
        spans += [self.group_interval(*g) for g in unit.groups]
        for span in spans:
            if span is None:
                return None
            lo, hi = max(lo, span[0]), min(hi, span[1])
        return (lo, hi) if lo <= hi else None

    def current_until(self, tick: int) -> float:
        """When the state at ``tick`` stopped being current (its successor committed)."""
        return self.committed[tick + 1] if tick < self.last else math.inf

    def tick_at(self, moment: float) -> int:
        """The newest tick that can have been visible at ``moment``."""
        return bisect.bisect_right(self.visible, moment) - 1


def _interval(ticks: list[int], values: list[int], value: int, last: int) -> tuple[int, int] | None:
    """The ticks during which a step function (values changing at ticks) equals ``value``; it
    is non-decreasing, so they are one interval."""
    index = bisect.bisect_left(values, value)
    if index == len(values) or values[index] != value:
        return None
    end = bisect.bisect_right(values, value)  # equal values in a row (a write of +0)
    return ticks[index], (ticks[end] - 1 if end < len(ticks) else last)


def check(timeline: Timeline, observations: Iterable[Observation]) -> Verdict:
    verdict = Verdict()
    floor_by_bracket: dict[tuple[int, int], int] = {}
    for obs in sorted(observations, key=lambda o: (o.session, o.start)):
        verdict.checked += 1
        verdict.local += obs.local
        route = "local" if obs.local else "remote"
        where = f"session {obs.session} {obs.shape} ({route}) at {obs.start:.3f}"
        key = (obs.session, obs.timeline) if obs.timeline is not None else None
        floor = floor_by_bracket.get(key, 0) if key else 0  # what earlier queries read
        for unit in obs.units:
            span = timeline.unit_interval(unit)
            if span is None:
                verdict.violations.append(f"{where}: no single snapshot gives {unit}")
                continue
            lo, hi = span
            if hi > timeline.tick_at(obs.end + EPSILON):
                hi = timeline.tick_at(obs.end + EPSILON)
                if hi < lo:
                    verdict.violations.append(f"{where}: reads state committed after it ended")
                    continue
            bound = next((b for b in (unit.bound, obs.bound) if b is not None), 0.0)
            if timeline.current_until(hi) + EPSILON < obs.start - bound:
                age = obs.start - timeline.current_until(hi)
                verdict.violations.append(
                    f"{where}: snapshot tick {hi} was superseded {age:.3f}s before the query "
                    f"started; the bound was {bound}s"
                )
            own = unit.floor_tick if unit.floor_tick is not None else obs.floor_tick
            if own is not None and hi < own:
                verdict.violations.append(
                    f"{where}: misses the session's own write (tick {own}; read "
                    f"ticks {lo}-{hi}) {obs.detail}"
                )
            if key is not None:
                if hi < floor:
                    verdict.violations.append(
                        f"{where}: TIMEORDERED went back (read ticks {lo}-{hi}, an earlier query "
                        f"of the bracket read tick {floor} or later)"
                    )
                floor_by_bracket[key] = max(floor_by_bracket.get(key, 0), lo)
    return verdict
