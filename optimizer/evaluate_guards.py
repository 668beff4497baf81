"""The run-time SwitchUnion decision (§4.4, §5.3; SPEC §5.4): when a plan opens, each of its
guards is evaluated once against the cache's region state, and each consistency class decides
all its accesses together - local if every access gets a guarded branch whose guard holds and
the regions read deliver the class's consistency, else remote. Pure: (plan, region state,
parameter values, session) in, `Decision` out.

A guard holds when the probed key values are present (or complete), every region read is at
most the class's bound old on the backend clock, none is older than the session's TIMEORDERED
floor or than the session's own committed writes to the table, and the session has no
uncommitted write to it. The class's consistency is the §5.2.3 satisfaction rule
(`derive_consistency`) applied to what the chosen regions deliver: one cache region when they
share a snapshot, else the groups the Presence Assumption or a consistency control table
guarantees (Fig 7.2); partial choices that already violate it are pruned (§5.2.3's violation
rule), so another candidate view can be tried.

A class that cannot run locally becomes a remote leaf when it has a single access; a class of
several accesses would need several leaf statements to share a snapshot, so the statement then
goes to PostgreSQL whole, as it does when no class runs locally.
"""

from __future__ import annotations

import datetime as dt
import math
import typing as t
from collections.abc import Mapping
from dataclasses import dataclass, field

from control_tables.regions import Key, RegionState, Stamp
from optimizer.analyze import Access
from optimizer.derive_consistency import Property, group_leaf, join, local_leaf, satisfies, violates
from optimizer.plan import AccessPlan, ClassPlan, Guard, Plan
from sql_ext.fds import FD
from sql_ext.params import UNKNOWN, ParameterValues


@dataclass(frozen=True)
class Session:
    """What the guards need to know about the session."""

    now: dt.datetime  # the backend's clock, erring late
    timeline_floor: dt.datetime | None = None  # inside TIMEORDERED: the freshest data read
    uncommitted: frozenset[str] = frozenset()  # tables written in the open transaction
    written_at: Mapping[str, dt.datetime] = field(default_factory=dict)  # committed writes
    ignore_currency: bool = False  # stale_ok with the backend down: any present data will do


@dataclass(frozen=True)
class Binding:
    """How one access runs: on the view of the guard that held (with the regions it read), or
    as its remote leaf (``guard`` None)."""

    access: AccessPlan
    guard: Guard | None = None
    regions: tuple[tuple[Key, Stamp], ...] = ()
    bound_seconds: float = 0.0  # its class's bound

    @property
    def view(self) -> str | None:
        return self.guard.view if self.guard is not None else None


@dataclass(frozen=True)
class Misses:
    """Why guards failed (for the status counters), and what an admission could fill."""

    presence: int = 0
    currency: int = 0
    admittable: tuple[tuple[str, Key], ...] = ()  # (control table, key) of presence misses


@dataclass(frozen=True)
class Decision:
    bindings: tuple[Binding, ...] | None  # per access, statement order; None: remote whole
    misses: Misses
    now: dt.datetime  # the moment currency was judged at

    @property
    def remote(self) -> bool:
        return self.bindings is None

    @property
    def signature(self) -> tuple[str | None, ...]:
        """The view of each access in statement order (None: its leaf): the decisions of one
        plan that run the same statement have the same signature."""
        return tuple(b.view for b in self.bindings or ())

    def choice(self) -> dict[int, str | None]:
        """Instance id -> the view read (None: the remote leaf)."""
        return {b.access.instance.id: b.view for b in self.bindings or ()}

    def __str__(self) -> str:
        if self.bindings is None:
            return "remote"
        parts = []
        for binding in self.bindings:
            if binding.guard is None:
                parts.append(f"{binding.access.alias}=leaf")
                continue
            keys = ",".join(repr(k[0]) if len(k) == 1 else repr(k) for k, _ in binding.regions
                            if k)  # fmt: skip
            parts.append(f"{binding.access.alias}={binding.guard.view}"
                         + (f"({keys})" if keys else ""))  # fmt: skip
        return " ".join(parts)


class _Tally:
    def __init__(self) -> None:
        self.presence = 0
        self.currency = 0
        self.admittable: list[tuple[str, Key]] = []

    def freeze(self) -> Misses:
        return Misses(self.presence, self.currency, tuple(self.admittable))


def evaluate_guards(
    plan: Plan, state: RegionState, values: ParameterValues, session: Session
) -> Decision:
    """The SwitchUnion decisions of one execution of ``plan``. With
    ``session.ignore_currency`` (the backend is down and the application accepts stale data)
    every class that present data can answer is answered locally, whatever the plan chose."""
    tally = _Tally()
    if not plan.local and not session.ignore_currency:
        return Decision(None, tally.freeze(), session.now)
    bindings: list[Binding] = []
    any_local = False
    for cls_plan in plan.classes:
        chosen = None
        usable = cls_plan.guarded or (
            session.ignore_currency and all(a.guards for a in cls_plan.accesses)
        )
        if usable:
            chosen = _class_local(cls_plan, state, values, session, tally, plan.analysis.fds)
        if chosen is None:
            if session.ignore_currency or len(cls_plan.accesses) != 1:
                return Decision(None, tally.freeze(), session.now)
            bindings.append(Binding(cls_plan.accesses[0], bound_seconds=cls_plan.bound_seconds))
        else:
            any_local = True
            bindings += chosen
    if not any_local:
        return Decision(None, tally.freeze(), session.now)
    bindings.sort(key=lambda b: b.access.instance.id)
    return Decision(tuple(bindings), tally.freeze(), session.now)


def _class_local(
    cls_plan: ClassPlan,
    state: RegionState,
    values: ParameterValues,
    session: Session,
    tally: _Tally,
    fds: tuple[FD, ...],
) -> list[Binding] | None:
    """Every access on a guarded branch whose guard holds and whose regions, together, deliver
    the class's consistency; None if there is no such choice."""
    required = [cls_plan.cls]
    bound = math.inf if session.ignore_currency else cls_plan.bound_seconds
    accesses = cls_plan.accesses
    # each guard evaluated at most once (and its misses counted once), in branch order
    checked: dict[tuple[int, int], tuple[tuple[Key, Stamp], ...] | None] = {}

    def check(index: int, branch: int) -> tuple[tuple[Key, Stamp], ...] | None:
        if (index, branch) not in checked:
            access = accesses[index]
            checked[(index, branch)] = _check(access.access, access.guards[branch], state,
                                              values, session, bound, tally)  # fmt: skip
        return checked[(index, branch)]

    def choose(index: int, delivered: Property) -> list[Binding] | None:
        if index == len(accesses):
            return [] if satisfies(delivered, required, fds) else None
        access = accesses[index]
        for branch, guard in enumerate(access.guards):
            regions = check(index, branch)
            if regions is None:
                continue
            leaf = _delivered(access.access, guard, regions, state, values)
            if leaf is None:
                continue
            merged = join(delivered, leaf)
            if violates(merged, required, fds):
                continue  # §5.2.3: prune this partial choice
            rest = choose(index + 1, merged)
            if rest is not None:
                return [Binding(access, guard, regions, cls_plan.bound_seconds), *rest]
        return None

    return choose(0, frozenset())


def _check(
    access: Access,
    guard: Guard,
    state: RegionState,
    values: ParameterValues,
    session: Session,
    bound: float,
    tally: _Tally,
) -> tuple[tuple[Key, Stamp], ...] | None:
    """The regions the access would read on the guard's branch, if the guard holds."""
    if access.table in session.uncommitted:
        return None  # the session's uncommitted writes are only on the backend
    regions: list[tuple[Key, Stamp]] = []
    if guard.kind == "full":
        stamp = state.views.get(guard.view)
        if stamp is None:
            return None
        regions.append(((), stamp))
    else:
        keys = probed_keys(access, guard.probe, values)
        if keys is None or guard.control is None:
            return None
        listed = state.listed(guard.control, guard.control_columns)
        for key in keys:
            if key not in listed:
                tally.presence += 1  # a presence (or completeness) miss
                if guard.admit_into is not None:
                    tally.admittable.append((guard.admit_into, key))
                return None
            regions.append((key, listed[key]))
    floor = session.timeline_floor
    written = session.written_at.get(access.table)
    for _, (refreshed_at, _snapshot) in regions:
        if refreshed_at is None:
            return None
        if (session.now - refreshed_at).total_seconds() > bound:
            tally.currency += 1
            return None  # a currency miss
        if floor is not None and refreshed_at < floor:
            return None  # time must not move backwards inside TIMEORDERED
        if written is not None and refreshed_at < written:
            return None  # read your own writes
    return tuple(regions)


def _delivered(
    access: Access,
    guard: Guard,
    regions: tuple[tuple[Key, Stamp], ...],
    state: RegionState,
    values: ParameterValues,
) -> Property | None:
    """§5.2.2's delivered property of a local leaf: one cache region when every region read
    shares a snapshot; else the groups guaranteed consistent (Fig 7.2 A, C); None if
    neither."""
    instance = access.instance
    snapshots = {stamp[1] for _, stamp in regions}
    if len(snapshots) == 1:
        (snapshot,) = snapshots
        if snapshot is not None and snapshot > 0:
            return local_leaf(instance, snapshot)
    groups = [frozenset((instance, c) for c in columns) for columns in guard.groups]
    probe = guard.consistency_probe
    if probe is not None:
        keys = probed_keys(access, probe.columns, values)
        listed = state.controls.get(probe.control, {})
        if keys is not None and all(k in listed for k in keys):
            groups.append(frozenset((instance, c) for c in probe.columns))  # Fig 7.3 A12
    return group_leaf(instance, groups) if groups else None


def probed_keys(
    access: Access, columns: tuple[str, ...], values: ParameterValues
) -> list[Key] | None:
    """The key values the access probes ``columns`` with in this execution (None: not all
    known, or several values of a composite key, whose combinations are not guessed)."""
    found: list[list[t.Any]] = []
    for column in columns:
        constants = access.probes.get(column)
        if not constants:
            return None
        evaluated = []
        for constant in constants:
            value = values.value(constant)
            if value is UNKNOWN:
                return None
            evaluated.append(value)
        found.append(evaluated)
    if len(columns) == 1:
        return [(v,) for v in dict.fromkeys(found[0])]
    if all(len(v) == 1 for v in found):
        return [tuple(v[0] for v in found)]
    return None
