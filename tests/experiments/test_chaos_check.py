"""The C&C checker's history check (experiments/chaos_check.py) on hand-made histories: it
accepts what one fresh-enough snapshot gives and names each kind of violation."""

from __future__ import annotations

import typing as t

from experiments.chaos_check import Observation, Tick, Timeline, Unit, check

# accounts 1, 2 in group 10; account 3 in group 20. Tick 1 (t=1.0): 1->v1; tick 2 (t=2.0):
# 1->v2, 2->v1; tick 3 (t=3.0): 3->v1.
TIMELINE = Timeline(
    {1: 10, 2: 10, 3: 20},
    [
        Tick(1, 1.0, {1: 1}, 0.99),
        Tick(2, 2.0, {1: 2, 2: 1}, 1.99),
        Tick(3, 3.0, {3: 1}, 2.99),
    ],
)


def observe(
    *units: Unit, start: float = 3.5, bound: float | None = 10.0, **kw: t.Any
) -> Observation:
    return Observation(
        session=1, start=start, end=start + 0.1, bound=bound, units=units, shape="test", **kw
    )


def test_intervals_follow_the_versions() -> None:
    assert TIMELINE.row_interval(1, 0) == (0, 0)
    assert TIMELINE.row_interval(1, 1) == (1, 1)
    assert TIMELINE.row_interval(1, 2) == (2, 3)
    assert TIMELINE.row_interval(1, 3) is None
    assert TIMELINE.group_interval(10, 3) == (2, 3)  # versions 2 + 1
    assert TIMELINE.group_interval(20, 0) == (0, 2)


def test_an_answer_from_one_fresh_snapshot_passes() -> None:
    verdict = check(TIMELINE, [observe(Unit(rows=((1, 2), (2, 1)), groups=((20, 1),)))])
    assert verdict.checked == 1 and verdict.violations == []


def test_rows_from_two_snapshots_are_a_violation() -> None:
    verdict = check(TIMELINE, [observe(Unit(rows=((1, 1), (2, 1))))])
    assert len(verdict.violations) == 1 and "no single snapshot" in verdict.violations[0]


def test_separate_units_may_come_from_separate_snapshots() -> None:
    """Two classes (or BY groups) need not share a snapshot; one unit must."""
    apart = observe(Unit(rows=((1, 1),)), Unit(rows=((2, 1),)))
    together = observe(Unit(rows=((1, 1), (2, 1))))
    assert check(TIMELINE, [apart]).violations == []
    assert len(check(TIMELINE, [together]).violations) == 1


def test_state_committed_after_the_query_ended_is_a_violation() -> None:
    verdict = check(TIMELINE, [observe(Unit(rows=((1, 2),)), start=0.5, bound=None)])
    assert len(verdict.violations) == 1 and "after it ended" in verdict.violations[0]


def test_a_snapshot_older_than_the_bound_is_a_violation() -> None:
    stale = observe(Unit(rows=((1, 1),)), start=5.0, bound=2.0)  # superseded at 2.0 < 3.0
    fresh = observe(Unit(rows=((1, 1),)), start=5.0, bound=3.5)
    verdict = check(TIMELINE, [stale])
    assert len(verdict.violations) == 1 and "superseded" in verdict.violations[0]
    assert check(TIMELINE, [fresh]).violations == []


def test_a_session_must_see_its_own_writes() -> None:
    verdict = check(TIMELINE, [observe(Unit(rows=((2, 0),)), floor_tick=2, bound=100.0)])
    assert len(verdict.violations) == 1 and "own write" in verdict.violations[0]


def test_timeordered_never_goes_back() -> None:
    first = observe(Unit(rows=((1, 2),)), start=3.5, timeline=7)
    back = observe(Unit(rows=((1, 1),)), start=3.6, bound=100.0, timeline=7)
    outside = observe(Unit(rows=((1, 1),)), start=3.7, bound=100.0)
    verdict = check(TIMELINE, [first, back, outside])
    assert verdict.checked == 3
    assert len(verdict.violations) == 1 and "TIMEORDERED" in verdict.violations[0]


def test_each_class_is_held_to_its_own_bound() -> None:
    """`CURRENCY BOUND 10 SEC ON (a), 1 SEC ON (b)`: one answer, two bounds."""
    loose = Unit(rows=((1, 1),), bound=10.0)  # superseded at 2.0: fine 10 s back from 5.0
    tight = Unit(rows=((2, 0),), bound=1.0)  # superseded at 2.0: too old for 1 s
    verdict = check(TIMELINE, [observe(loose, tight, start=5.0, bound=None)])
    assert len(verdict.violations) == 1 and "the bound was 1.0s" in verdict.violations[0]


def test_classes_of_one_query_may_differ_inside_a_bracket() -> None:
    """TIMEORDERED orders queries, not the classes of one query: a class older than another
    class of the same query is no going back; older than an earlier query's is."""
    mixed = observe(Unit(rows=((1, 2),)), Unit(rows=((3, 0),)), bound=100.0, timeline=3)
    assert check(TIMELINE, [mixed]).violations == []
    later = observe(Unit(rows=((1, 1),)), start=3.6, bound=100.0, timeline=3)  # tick 1 < 2
    verdict = check(TIMELINE, [mixed, later])
    assert len(verdict.violations) == 1 and "TIMEORDERED" in verdict.violations[0]


def test_own_writes_are_seen_table_by_table() -> None:
    """A class over a table the session's last write did not touch needs only its earlier
    writes to that table."""
    untouched = Unit(rows=((2, 0),), floor_tick=0)  # its writes never reached row 2's table
    written = Unit(rows=((2, 0),), floor_tick=2)
    assert check(TIMELINE, [observe(untouched, floor_tick=3, bound=100.0)]).violations == []
    verdict = check(TIMELINE, [observe(written, floor_tick=3, bound=100.0)])
    assert len(verdict.violations) == 1 and "own write (tick 2" in verdict.violations[0]


def test_fault_turns_starve_no_kind() -> None:
    """The fewest-turns kind goes next; Spark's kinds wait for the JVM while the others go,
    but a kill (which restarts the JVM) does not run ahead of Spark's kinds."""
    import collections

    from experiments.chaos import FAULTS, next_fault

    done: collections.Counter[str] = collections.Counter()
    order = []
    for _ in range(len(FAULTS) + 4):  # the JVM never ready: Spark's turns wait
        kind, point = next_fault(done, spark=True, ready=False)
        done[point] += 1
        order.append(kind)
    assert "spark" not in order
    assert order.count("kill") == len([f for f in FAULTS if f[0] == "kill"])  # once each
    kind, _ = next_fault(done, spark=True, ready=True)  # the JVM is up: Spark's turn
    assert kind == "spark"
    # (up before any other turn: Spark's two kinds first, whatever the others' turns)
    ready: collections.Counter[str] = collections.Counter()
    for point in ("task", "task:kill"):
        assert next_fault(ready, spark=True, ready=True) == ("spark", point)
        ready[point] += 1
    assert next_fault(ready, spark=True, ready=True)[0] == "fail"
    assert next_fault(collections.Counter(), spark=False, ready=False)[0] == "fail"
    no_spark = collections.Counter({p: 1 for k, p in FAULTS if k == "fail"})
    assert next_fault(no_spark, spark=False, ready=False)[0] == "kill"  # kills need no JVM


def test_a_kill_that_missed_its_point_is_not_a_turn() -> None:
    """A kill's refresh that failed before its point (the owner lived on) comes again: the
    next incarnation counts it as not taken (under load the short run missed a kill kind)."""
    from experiments.chaos import next_fault, turns_taken

    records = [
        {"kind": "armed", "point": "after_pull"},
        {"kind": "disarmed", "point": "after_pull", "missed": False},  # a failure's turn
        {"kind": "armed", "point": "after_pull:kill"},
        {"kind": "disarmed", "point": "after_pull:kill", "missed": True},  # no kill happened
        {"kind": "armed", "point": "before_commit:kill"},  # the owner died here: taken
    ]
    done = turns_taken(records)
    assert (done["after_pull"], done["after_pull:kill"], done["before_commit:kill"]) == (1, 0, 1)
    done.update(
        {
            p: 1
            for p in (
                "after_snapshot",
                "after_snapshot:disconnect",
                "before_commit",
                "task",
                "task:kill",
                "after_snapshot:kill",
            )
        }
    )
    assert next_fault(done, spark=False, ready=False) == ("kill", "after_pull:kill")


def test_the_owner_is_not_killed_at_random_before_sparks_first_turns() -> None:
    """A fresh clone's CI missed 'Spark task failure (task:kill)': random kills of the owner
    kept restarting the JVM before Spark's second kind had a turn."""
    import collections

    from experiments.chaos import spark_pending

    assert spark_pending(collections.Counter({"task": 1}), spark=True)
    assert not spark_pending(collections.Counter({"task": 1, "task:kill": 1}), spark=True)
    assert not spark_pending(collections.Counter(), spark=False)
