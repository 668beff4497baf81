"""The run-time SwitchUnion decision (§4.4, §5.3): when a plan opens, each of its
guards is evaluated once against the cache's region state, and each consistency class decides
all its accesses together - local if every access gets a guarded branch whose guard holds and
the regions read deliver the class's consistency, else remote. Pure: (plan, region state,
parameter values, session, the backend clock's now) in, `Decision` out.

A guard holds when the probed key values are present (or complete), every region read is at
most the class's bound old on the backend clock, none is older than the session's TIMEORDERED
floor or than the session's own committed writes to the table, and the session has no
uncommitted write to it. The class's consistency is the §5.2.3 satisfaction rule
(`derive_consistency`) applied to what the chosen regions deliver: one cache region when they
share a snapshot, else the groups the Presence Assumption or a consistency control table
guarantees (Fig 7.2); partial choices that already violate it are pruned (§5.2.3's violation
rule), so another candidate view can be tried.

A class that cannot run locally reads its accesses as remote leaves, all of a decision's leaves
in one backend snapshot - unless the session has uncommitted writes (its leaves then
go through its own connection, statement by statement, so a class of several accesses goes to
PostgreSQL whole). When every guard fails, the statement goes to PostgreSQL whole.
"""

from __future__ import annotations

import datetime as dt
import typing as t
from collections.abc import Mapping
from types import MappingProxyType

from control_tables.kinds import GuardKind
from control_tables.regions import Key, RegionState, Stamp
from optimizer.analysis.analyze import Access
from optimizer.plan import AccessPlan, ClassPlan, Guard, Plan
from optimizer.rules.derive_consistency import (
    Property,
    group_leaf,
    join,
    local_leaf,
    satisfies,
    violates,
)
from sql_ext.fds import FD
from sql_ext.params import UNKNOWN, ParameterValues

# The run-time values below are NamedTuples, not dataclasses: every execution makes them, and
# a tuple is made several times faster (the hit path's budget is tens of microseconds).


class Session(t.NamedTuple):
    """What the guards need to know about the session (besides the clock)."""

    timeline_floor: dt.datetime | None = None  # inside TIMEORDERED: the freshest data read
    uncommitted: frozenset[str] = frozenset()  # tables written in the open transaction
    written_at: Mapping[str, dt.datetime] = MappingProxyType({})  # committed writes
    ignore_currency: bool = False  # stale_ok with the backend down: any present data will do


class Binding(t.NamedTuple):
    """How one access runs: on the view of the guard that held (with the regions it read), or
    as its remote leaf (``guard`` None)."""

    access: AccessPlan
    guard: Guard | None = None
    regions: tuple[tuple[Key, Stamp], ...] = ()
    bound_seconds: float = 0.0  # its class's bound

    @property
    def view(self) -> str | None:
        return self.guard.view if self.guard is not None else None


class Misses(t.NamedTuple):
    """Why guards failed (for the status counters), and what an admission could fill."""

    presence: int = 0
    currency: int = 0
    admittable: tuple[tuple[str, Key], ...] = ()  # (control table, key) of presence misses
    completeness: int = 0  # a completeness region missing
    consistency: int = 0  # regions present and fresh that share no snapshot the class needs
    timeline: int = 0  # data older than the session's timeline floor or its own writes
    # (control table, key) of regions a guard found held that the read could not use (too old
    # for it, or not of the snapshot its class needs): read all the same, though not locally
    # (`cache.store.region_reads`)
    unused: tuple[tuple[str, Key], ...] = ()


class Decision(t.NamedTuple):
    bindings: tuple[Binding, ...] | None  # per access, statement order; None: remote whole
    misses: Misses
    now: dt.datetime  # the moment currency was judged at
    local: int = 0  # how many accesses read a cached view

    @property
    def remote(self) -> bool:
        return self.bindings is None

    @property
    def signature(self) -> tuple[str | None, ...]:
        """The view of each access in statement order (None: its leaf): the decisions of one
        plan that run the same statement have the same signature."""
        return tuple(b.guard.view if b.guard is not None else None for b in self.bindings or ())

    def choice(self) -> dict[int, str | None]:
        """Instance id -> the view read (None: the remote leaf)."""
        return {b.access.instance.id: b.view for b in self.bindings or ()}

    def __str__(self) -> str:  # type: ignore[override]
        if self.bindings is None:
            return "remote"
        parts = []
        for binding in self.bindings:
            if binding.guard is None:
                parts.append(f"{binding.access.alias}=leaf")
                continue
            keys = ",".join(repr(k[0]) if len(k) == 1 else repr(k) for k, _ in binding.regions if k)
            parts.append(
                f"{binding.access.alias}={binding.guard.view}" + (f"({keys})" if keys else "")
            )
        return " ".join(parts)


class _Tally:
    __slots__ = (
        "admittable",
        "completeness",
        "consistency",
        "currency",
        "presence",
        "timeline",
        "unused",
    )

    def __init__(self) -> None:
        self.presence = 0
        self.currency = 0
        self.completeness = 0
        self.consistency = 0
        self.timeline = 0
        self.admittable: list[tuple[str, Key]] = []
        self.unused: list[tuple[str, Key]] = []

    def freeze(self) -> Misses:
        if not (
            self.presence or self.currency or self.completeness or self.consistency or self.timeline
        ):
            return _NO_MISSES
        return Misses(
            self.presence,
            self.currency,
            tuple(self.admittable),
            self.completeness,
            self.consistency,
            self.timeline,
            tuple(self.unused),
        )

    def held(self, guard: Guard, regions: tuple[tuple[Key, Stamp], ...]) -> None:
        """Regions the guard found held that the read cannot use (`Misses.unused`)."""
        if guard.control is not None and guard.kind != GuardKind.FULL:
            self.unused += [(guard.control, key) for key, _ in regions]


_NO_MISSES = Misses()


def evaluate_guards(
    plan: Plan, state: RegionState, values: ParameterValues, session: Session, now: dt.datetime
) -> Decision:
    """The SwitchUnion decisions of one execution of ``plan`` at ``now`` on the backend's
    clock (erring late). With ``session.ignore_currency`` (the backend is down and the
    application accepts stale data) every class that present data can answer is answered
    locally, whatever the plan chose."""
    tally = _Tally()
    if not plan.local and not session.ignore_currency:
        return Decision(None, tally.freeze(), now)
    bindings: list[Binding] = []
    local = 0
    for cls_plan in plan.classes:
        chosen = None
        if cls_plan.guarded or (session.ignore_currency and cls_plan.has_guards):
            chosen = _class_local(cls_plan, state, values, session, now, tally, plan.analysis.fds)
        if chosen is None:
            if session.ignore_currency:
                return Decision(None, tally.freeze(), now)  # the backend is needed, and down
            if session.uncommitted and len(cls_plan.accesses) > 1:
                # leaves read through the session's own connection (the only one that sees
                # its writes) are separate statements: they share no snapshot
                return Decision(None, tally.freeze(), now)
            bindings += [
                Binding(a, bound_seconds=cls_plan.bound_seconds) for a in cls_plan.accesses
            ]
        else:
            local += len(chosen)
            bindings += chosen
    if not local and any(c.guarded for c in plan.classes):
        return Decision(None, tally.freeze(), now)  # every guard failed: the statement remote
    if len(bindings) > 1:
        bindings.sort(key=lambda b: b.access.instance.id)
    return Decision(tuple(bindings), tally.freeze(), now, local)


# A choice's consistency is judged on its pattern: per access, the snapshot its regions share
# (numbered by first appearance) or the groups they hold. §5.2's rules depend on nothing else -
# which regions are equal, not their ids - so a class memoizes their verdict per pattern.
Token = tuple[str, t.Any]  # ("region", n) or ("groups", keys)


def _class_local(
    cls_plan: ClassPlan,
    state: RegionState,
    values: ParameterValues,
    session: Session,
    now: dt.datetime,
    tally: _Tally,
    fds: tuple[FD, ...],
) -> list[Binding] | None:
    """Every access on a guarded branch whose guard holds and whose regions, together, deliver
    the class's consistency; None if there is no such choice (depth first, in branch order)."""
    delta = cls_plan.bound_delta
    oldest = None if session.ignore_currency or delta is None else now - delta
    accesses = cls_plan.accesses
    last = len(accesses) - 1
    # each guard evaluated at most once (and its misses counted once), in branch order
    checked: dict[tuple[int, int], tuple[tuple[Key, Stamp], ...] | None] = {}

    if last == 0:  # one access (the common case): each branch in turn, no backtracking
        access = accesses[0]
        for guard in access.guards:
            regions = _check(access.access, guard, state, values, session, oldest, tally)
            if regions is None:
                continue
            token = _token(access.access, guard, regions, state, values)
            if token is not None and _consistent(cls_plan, (token,), fds, final=True):
                return [Binding(access, guard, regions, cls_plan.bound_seconds)]
            tally.consistency += 1
            tally.held(guard, regions)
        return None

    def choose(index: int, pattern: tuple[Token, ...]) -> list[Binding] | None:
        access = accesses[index]
        for branch, guard in enumerate(access.guards):
            if (index, branch) in checked:
                regions = checked[(index, branch)]
            else:
                regions = checked[(index, branch)] = _check(
                    access.access, guard, state, values, session, oldest, tally
                )
            if regions is None:
                continue
            token = _token(access.access, guard, regions, state, values)
            if token is None:
                continue
            merged = (*pattern, token)
            if not _consistent(cls_plan, merged, fds, final=index == last):
                continue
            rest = [] if index == last else choose(index + 1, merged)
            if rest is not None:
                return [Binding(access, guard, regions, cls_plan.bound_seconds), *rest]
        return None

    chosen = choose(0, ())
    if chosen is None and checked and all(r is not None for r in checked.values()):
        tally.consistency += 1  # (every guard held: what failed was their snapshots)
        for (index, branch), regions in checked.items():
            tally.held(
                accesses[index].guards[branch], t.cast(tuple[tuple[Key, Stamp], ...], regions)
            )
    return chosen


def _consistent(
    cls_plan: ClassPlan, pattern: tuple[t.Any, ...], fds: tuple[FD, ...], final: bool
) -> bool:
    """§5.2.3 on a (partial) choice: satisfaction for a complete one, no violation for a
    partial one (pruning); memoized per pattern on the class's plan."""
    snapshots: dict[t.Any, int] = {}
    canonical: list[tuple[str, t.Any]] = []
    for kind, value in pattern:
        if kind == "region":
            canonical.append((kind, snapshots.setdefault(value, len(snapshots) + 1)))
        else:
            canonical.append((kind, value))
    key = (final, *canonical)
    verdict = cls_plan.verdicts.get(key)
    if verdict is None:
        delivered: Property = frozenset()
        for access, (kind, value) in zip(cls_plan.accesses, canonical, strict=False):
            instance = access.instance
            leaf = (
                local_leaf(instance, value)
                if kind == "region"
                else group_leaf(instance, [{(instance, c) for c in columns} for columns in value])
            )
            delivered = join(delivered, leaf)
        required = [cls_plan.cls]
        verdict = (
            satisfies(delivered, required, fds) if final else not violates(delivered, required, fds)
        )
        cls_plan.verdicts[key] = verdict
    return verdict


def _check(
    access: Access,
    guard: Guard,
    state: RegionState,
    values: ParameterValues,
    session: Session,
    oldest: dt.datetime | None,
    tally: _Tally,
) -> tuple[tuple[Key, Stamp], ...] | None:
    """The regions the access would read on the guard's branch, if the guard holds: every one
    refreshed at ``oldest`` or later (None: any age will do)."""
    if access.table in session.uncommitted:
        return None  # the session's uncommitted writes are only on the backend
    regions: tuple[tuple[Key, Stamp], ...]
    if guard.kind == GuardKind.FULL:
        stamp = state.views.get(guard.view)
        if stamp is None:
            return None
        regions = (((), stamp),)
    else:
        keys = probed_keys(access, guard.probe, values)
        if keys is None or guard.control is None:
            return None
        listed = state.listed(guard.control, guard.control_columns)
        found = []
        for key in keys:
            stamp = listed.get(key)
            if stamp is None:
                if guard.kind == GuardKind.COMPLETENESS:
                    tally.completeness += 1
                else:
                    tally.presence += 1
                if guard.admit_into is not None:
                    tally.admittable.append((guard.admit_into, key))
                return None
            found.append((key, stamp))
        regions = tuple(found)
    floor = session.timeline_floor
    written = session.written_at.get(access.table) if session.written_at else None
    for _, (refreshed_at, _snapshot) in regions:
        if refreshed_at is None:
            return None
        if oldest is not None and refreshed_at < oldest:
            tally.currency += 1
            tally.held(guard, regions)
            return None  # a currency miss
        if floor is not None and refreshed_at < floor:
            tally.timeline += 1
            tally.held(guard, regions)
            return None  # time must not move backwards inside TIMEORDERED
        if written is not None and refreshed_at < written:
            tally.timeline += 1
            tally.held(guard, regions)
            return None  # read your own writes (and a position presented: min_position)
    return regions


def _token(
    access: Access,
    guard: Guard,
    regions: tuple[tuple[Key, Stamp], ...],
    state: RegionState,
    values: ParameterValues,
) -> Token | None:
    """What the regions read deliver (§5.2.2): one cache region when they share a snapshot;
    else the groups guaranteed consistent (Fig 7.2 A, C); None if neither."""
    first = regions[0][1][1]
    if first is not None and first > 0:
        for _, stamp in regions:
            if stamp[1] != first:
                break
        else:
            return ("region", first)
    groups = guard.groups
    probe = guard.consistency_probe
    if probe is not None:
        keys = probed_keys(access, probe.columns, values)
        listed = state.controls.get(probe.control, {})
        if keys is not None and all(k in listed for k in keys):
            groups = (*groups, probe.columns)  # Fig 7.3 A12
    return ("groups", groups) if groups else None


def probed_keys(
    access: Access, columns: tuple[str, ...], values: ParameterValues
) -> list[Key] | None:
    """The key values the access probes ``columns`` with in this execution (None: not all
    known, or several values of a composite key, whose combinations are not guessed)."""
    if len(columns) == 1:
        constants = access.probes.get(columns[0])
        if not constants:
            return None
        if len(constants) == 1:
            value = values.value(constants[0])
            return None if value is UNKNOWN else [(value,)]
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
