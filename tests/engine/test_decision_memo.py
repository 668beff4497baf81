"""Guard decisions are reused only while they still hold (cache.execution.decisions): a
decision that kept data local expires when the oldest region it read outlives its bound; one
that sent the query remote holds until the region state or the session changes. No database:
the memo only compares identities and times."""

from __future__ import annotations

import datetime as dt
import typing as t
from types import SimpleNamespace

from cache.execution.decisions import DecisionMemo, expiry
from optimizer.rules.evaluate_guards import Binding, Decision, Misses

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def clock(seconds: float) -> t.Callable[[], dt.datetime]:
    return lambda: at(seconds)


def unread() -> dt.datetime:
    raise AssertionError("the clock was read")


def local(*refreshed: float, bound: float = 10.0) -> Decision:
    """A decision reading regions refreshed at the given seconds, local under ``bound``."""
    regions = tuple(((i,), (at(s), 1)) for i, s in enumerate(refreshed))
    guard: t.Any = object()
    access: t.Any = object()
    return Decision((Binding(access, guard, regions, bound),), Misses(), at(0), 1)


REMOTE = Decision(None, Misses(currency=1), at(0))


def a_plan(reads_parameters: bool = True) -> t.Any:
    """A stand-in plan whose guards read the parameters (a presence guard) or not (a fully
    materialized view's)."""
    return SimpleNamespace(guards_read_parameters=reads_parameters)


def test_a_local_decision_expires_when_its_oldest_region_outlives_the_bound() -> None:
    assert expiry(local(5.0, 2.0, 7.0, bound=10.0)) == at(12.0)
    assert expiry(REMOTE) is None
    assert expiry(local(2.0, bound=float("inf"))) is None  # no bound: never by time


def test_a_kept_decision_is_reused_with_the_new_time_until_it_expires() -> None:
    memo = DecisionMemo()
    plan = a_plan()
    state: t.Any = object()
    session: t.Any = object()
    assert memo.get(plan, [4], state, session, clock(1)) is None
    kept = local(2.0)
    memo.put(plan, [4], state, session, kept)
    reused = memo.get(plan, [4], state, session, clock(11.5))
    assert reused is not None and reused.now == at(11.5)  # provenance reports this moment
    assert reused.bindings is kept.bindings
    assert memo.get(plan, [4], state, session, clock(12.0)) is not None  # still within 10 s
    assert memo.get(plan, [4], state, session, clock(12.000001)) is None  # outlived
    assert memo.get(plan, [5], state, session, clock(3)) is None  # other parameters
    assert memo.get(plan, [4.0], state, session, clock(3)) is None  # 4.0 is not 4
    assert memo.get(a_plan(), [4], state, session, clock(3)) is None  # another plan


def test_a_failed_decision_holds_until_the_state_or_the_session_changes() -> None:
    memo = DecisionMemo()
    plan = a_plan()
    state: t.Any = object()
    session: t.Any = object()
    memo.get(plan, None, state, session, clock(0))
    memo.put(plan, None, state, session, REMOTE)
    found = memo.get(plan, None, state, session, unread)  # no clock: time changes nothing
    assert found is not None and found.remote and found.misses == REMOTE.misses
    assert memo.get(plan, None, object(), session, clock(1)) is None  # a refresh landed
    memo.put(plan, None, state, session, REMOTE)  # decided on the old state: not kept
    assert memo.get(plan, None, state, session, clock(1)) is None  # the old state is gone
    memo.put(plan, None, state, session, REMOTE)
    assert memo.get(plan, None, state, object(), clock(1)) is None  # the session wrote


def test_unhashable_parameters_are_not_kept() -> None:
    memo = DecisionMemo()
    plan = a_plan()
    state: t.Any = object()
    session: t.Any = object()
    memo.get(plan, [[1, 2]], state, session, clock(0))
    memo.put(plan, [[1, 2]], state, session, REMOTE)
    assert memo.get(plan, [[1, 2]], state, session, clock(0)) is None
    memo.put(plan, {"k": 3}, state, session, REMOTE)
    assert memo.get(plan, {"k": 3}, state, session, clock(0)) is not None


def test_a_decision_whose_guards_read_no_parameter_is_kept_for_every_value() -> None:
    memo = DecisionMemo()
    plan = a_plan(reads_parameters=False)  # a fully materialized view's guard reads no key
    state: t.Any = object()
    session: t.Any = object()
    memo.get(plan, [4], state, session, clock(0))
    kept = local(2.0)
    memo.put(plan, [4], state, session, kept)
    for other in ([5], [4.0], ["x"], [[1, 2]]):
        found = memo.get(plan, other, state, session, clock(3))
        assert found is not None and found.bindings is kept.bindings
    assert memo.get(a_plan(), [4], state, session, clock(3)) is None
