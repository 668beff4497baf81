"""Guard decisions reused while nothing they read has changed (the hit path's guard phase).

`optimizer.rules.evaluate_guards` is pure: its decision depends on the plan, the parameter values,
the region state, the session and the time. The region state and the session are values the
connection keeps until the cache file or the session changes (then they are new objects), so
for one (plan, parameters) on the same state and session only time moves (and parameters
the guards do not read - no presence guard looks them up - do not count), and a decision moves
with time in one direction only: data gets older. A guard that failed (a key not present, a
region too old, regions of different snapshots) keeps failing until the state or the session
changes; one that held keeps holding until the oldest region it read outlives its class's
bound. So a decision is kept with that expiry, and reused - with the new ``now``, which
provenance reports - until the expiry passes or the state or session changes. Reused or not,
the cursor counts its misses and requests its admissions as for a fresh one.
"""

from __future__ import annotations

import datetime as dt
import typing as t
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping

from control_tables.regions import RegionState
from optimizer.plan import Plan
from optimizer.rules.evaluate_guards import Decision, Session

SIZE = 256  # decisions kept per connection (least recently used go first)


class DecisionMemo:
    """One connection's decisions on its current region state and session."""

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self._entries: OrderedDict[Hashable, tuple[Plan, Decision, dt.datetime | None]] = (
            OrderedDict()
        )
        self._on: tuple[RegionState | None, Session | None] = (None, None)

    def get(
        self,
        plan: Plan,
        parameters: t.Any,
        state: RegionState,
        session: Session,
        clock: Callable[[], dt.datetime],
    ) -> Decision | None:
        """The decision kept for ``plan`` and ``parameters``, valid now (``clock``: the
        backend's clock); or None. A remote decision is returned as it was made, without
        reading the clock: it holds until the state or the session changes, and nothing reads
        its moment (the remote branch's guard phase is this lookup)."""
        on = self._on
        if on[0] is not state or on[1] is not session:
            self._entries.clear()
            self._on = (state, session)
            return None
        key = _key(plan, parameters)
        entry = self._entries.get(key) if key is not None else None
        if entry is None:
            return None
        kept, decision, expires = entry
        if kept is not plan:
            return None
        self._entries.move_to_end(key)
        if decision.bindings is None:
            return decision
        now = clock()
        if expires is not None and now > expires:
            return None
        return decision._replace(now=now)

    def put(
        self,
        plan: Plan,
        parameters: t.Any,
        state: RegionState,
        session: Session,
        decision: Decision,
    ) -> None:
        if self._on[0] is not state or self._on[1] is not session:
            return  # decided on another state: not kept
        key = _key(plan, parameters)
        if key is None:
            return
        self._entries[key] = (plan, decision, expiry(decision))
        self._entries.move_to_end(key)
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)


def expiry(decision: Decision) -> dt.datetime | None:
    """When a decision that kept accesses local stops holding: the first moment a region it
    read is older than its class's bound (None: never, by time alone)."""
    expires = None
    for binding in decision.bindings or ():
        if binding.guard is None:
            continue
        try:
            bound = dt.timedelta(seconds=binding.bound_seconds)
        except OverflowError:
            continue  # no bound: any age will do
        for _, (refreshed_at, _) in binding.regions:
            if refreshed_at is not None and (expires is None or refreshed_at + bound < expires):
                expires = refreshed_at + bound
    return expires


def _key(plan: Plan, parameters: t.Any) -> Hashable | None:
    """The plan and the typed parameter values (1, 1.0 and True are equal keys in Python, not
    equal values) when its guards read them; None when a value is unhashable (a list, a
    dict)."""
    if parameters is None or not plan.guards_read_parameters:
        values: tuple[t.Any, ...] = ()
    elif isinstance(parameters, Mapping):
        values = tuple(sorted((k, type(v), v) for k, v in parameters.items()))
    else:
        values = tuple((type(v), v) for v in parameters)
    key = (id(plan), values)
    try:
        hash(key)
    except TypeError:
        return None
    return key
