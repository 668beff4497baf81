"""Pure optimizer rules: the local-branch probability and cost (§4.6), and the consistency
properties with their satisfaction and violation rules (§4.4, §5.2). No database needed."""

from __future__ import annotations

import itertools

import pytest

from optimizer.analysis.normalize_constraint import ConsistencyClass, Instance
from optimizer.rules.derive_consistency import (
    Delivered,
    conflicting,
    group_leaf,
    join,
    local_leaf,
    remote_leaf,
    satisfies,
    switch_union,
    violates,
)
from optimizer.rules.estimate_cost import guarded_cost, local_probability
from sql_ext.fds import FD

# -- §4.6 cost --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bound", "delay", "interval", "p"),
    [
        (0, 0, 100, 0.0),  # no clause: bound 0 never runs locally
        (5, 10, 100, 0.0),  # bound below the delay
        (10, 10, 100, 0.0),  # exactly the delay: B - d = 0
        (60, 10, 100, 0.5),  # half the cycle is fresh enough
        (110, 10, 100, 1.0),  # B = d + f: always
        (500, 10, 100, 1.0),
        (11, 10, 0, 1.0),  # continuous propagation (f = 0)
        (10, 10, 0, 0.0),
        (600, 0, None, 0.0),  # no schedule: nothing to count on
    ],
)
def test_local_probability(bound: float, delay: float, interval: float | None, p: float) -> None:
    assert local_probability(bound, delay, interval) == pytest.approx(p)


def test_probability_grows_linearly_with_the_bound_then_saturates() -> None:
    """Fig 4.2(a): for f = 100 and d = 5, p rises linearly from B = d to B = d + f."""
    values = [local_probability(b, 5, 100) for b in range(0, 130, 10)]
    assert values[:1] == [0.0]
    rising = values[1:11]
    steps = {round(b - a, 6) for a, b in itertools.pairwise(rising)}
    assert steps == {0.1}
    assert values[-2:] == [1.0, 1.0]


def test_guarded_cost_mixes_the_branches() -> None:
    assert guarded_cost(0.25, local=10, remote=50, guard=1) == pytest.approx(41.0)
    assert guarded_cost(1.0, local=10, remote=50, guard=1) == pytest.approx(11.0)
    with pytest.raises(ValueError, match="probability"):
        guarded_cost(1.5, 1, 1, 0)


# -- §4.4 / §5.2 consistency properties ---------------------------------------------------------

C = Instance(0, "customer", "c")
ORD = Instance(1, "orders", "o")
A = Instance(2, "authors", "a")
B = Instance(3, "books", "b")
KEYS = [
    FD(frozenset({(A, "authorid")}), frozenset({(A, c) for c in ("authorid", "city", "name")})),
    FD(frozenset({(B, "isbn")}), frozenset({(B, c) for c in ("isbn", "authorid", "title")})),
    FD(frozenset({(B, "authorid")}), frozenset({(A, "authorid")})),  # join b.authorid = a.authorid
]


def cls(*instances: Instance, by: set[tuple[Instance, str]] | None = None) -> ConsistencyClass:
    return ConsistencyClass(600.0, frozenset(instances), frozenset(by or set()))


def test_q3_views_in_different_regions_cannot_serve_one_class() -> None:
    """§4.7.3 Q3: cust_prj and orders_prj are current enough but in different regions."""
    local = join(local_leaf(C, 1), local_leaf(ORD, 2))
    required = [cls(C, ORD)]
    assert violates(local, required, []) and not satisfies(local, required, [])
    remote = join(remote_leaf(C), remote_leaf(ORD))
    assert remote == frozenset({Delivered(0, frozenset({C, ORD}))})
    assert satisfies(remote, required, [])


def test_q4_separate_classes_allow_a_mixed_plan() -> None:
    """§4.7.3 Q4: customer and orders in different classes: one remote, one local is fine."""
    mixed = join(remote_leaf(C), local_leaf(ORD, 2))
    assert satisfies(mixed, [cls(C), cls(ORD)], [])
    assert not violates(mixed, [cls(C), cls(ORD)], [])


def test_one_region_serves_a_whole_class() -> None:
    both = join(local_leaf(C, 7), local_leaf(ORD, 7))
    assert len(both) == 1 and satisfies(both, [cls(C, ORD)], [])


def test_group_level_views_fit_groupings_their_keys_determine() -> None:
    """E1.2 (per author) is served by a view consistent per author; E1.3 (per city) is not,
    unless the view also keeps cities consistent (a CsCT on city)."""
    per_author = group_leaf(A, [{(A, "authorid")}])
    assert satisfies(per_author, [cls(A, by={(A, "authorid")})], KEYS)
    assert violates(per_author, [cls(A, by={(A, "city")})], KEYS)
    per_city_too = group_leaf(A, [{(A, "authorid")}, {(A, "city")}])
    assert satisfies(per_city_too, [cls(A, by={(A, "city")})], KEYS)
    # The whole class from one snapshot needs a key fixed by a constant (one author).
    assert not satisfies(per_author, [cls(A)], KEYS)
    one_author = [*KEYS, FD(frozenset(), frozenset({(A, "authorid")}))]
    assert satisfies(per_author, [cls(A)], one_author)


def test_views_of_one_consistency_root_join_into_one_group() -> None:
    """§5.2.3's Q2: AuthorCopy and its gray child BookCopy share the root's grouping keys."""
    keys = [{(A, "authorid")}]
    joined = join(group_leaf(A, keys), group_leaf(B, keys))
    assert len(joined) == 1
    assert satisfies(joined, [cls(A, B, by={(B, "isbn")})], KEYS)


def test_two_snapshots_of_one_table_conflict() -> None:
    """Two projection views of one table from different regions (§4.4.3)."""
    split = frozenset({Delivered(1, frozenset({C})), Delivered(2, frozenset({C}))})
    assert conflicting(split) and violates(split, [cls(C)], [])


def test_a_switch_union_delivers_its_local_branch() -> None:
    assert switch_union(local_leaf(C, 3), remote_leaf(C)) == local_leaf(C, 3)
    with pytest.raises(ValueError, match="positive"):
        local_leaf(C, 0)
