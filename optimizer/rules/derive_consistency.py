"""Required and delivered consistency properties, and the rules that prune plans (§4.4, §5.2).

A delivered property is a set of tuples <R, S, Ω>: the inputs S come from region R, where R > 0
is one cache region (one snapshot), R = 0 the backend (every remote input of one execution is
read in one backend snapshot), and R = -1 a group-level region whose groups are given by the
grouping keys Ω (each group consistent, different groups maybe not). The required property is
the normalized constraint: classes <bound, S, G>.
"""

from __future__ import annotations

import typing as t
from collections.abc import Iterable, Sequence

from optimizer.analysis.normalize_constraint import ConsistencyClass, Instance
from sql_ext.fds import FD, Attr, closure

REMOTE = 0
GROUP_LEVEL = -1


class Delivered(t.NamedTuple):
    """One tuple <R, S, Ω> of a delivered consistency property (a value; a tuple, so the
    run-time guards make them cheaply)."""

    region: int
    inputs: frozenset[Instance]
    keys: frozenset[frozenset[Attr]] = frozenset()  # Ω: empty unless region is GROUP_LEVEL


Property = frozenset[Delivered]


def remote_leaf(instance: Instance) -> Property:
    """A remote table access: consistent with every other remote access (region 0)."""
    return frozenset({Delivered(REMOTE, frozenset({instance}))})


def local_leaf(instance: Instance, region: int) -> Property:
    """A scan of a view-level consistent region (all rows from one snapshot)."""
    if region <= 0:
        raise ValueError("cache regions have positive ids")
    return frozenset({Delivered(region, frozenset({instance}))})


def group_leaf(instance: Instance, keys: Iterable[Iterable[Attr]]) -> Property:
    """A scan of a group-level view: rows agreeing on one of the keys are consistent."""
    return frozenset(
        {Delivered(GROUP_LEVEL, frozenset({instance}), frozenset(frozenset(k) for k in keys))}
    )


def join(left: Property, right: Property) -> Property:
    """Union the inputs' tuples, merging those of one region (R ≥ 0) or of the same grouping
    keys (§5.2.2)."""
    merged: list[Delivered] = []
    for item in [*left, *right]:
        for index, other in enumerate(merged):
            same_region = item.region >= 0 and item.region == other.region
            same_groups = item.region == other.region == GROUP_LEVEL and item.keys == other.keys
            if same_region or same_groups:
                merged[index] = Delivered(other.region, other.inputs | item.inputs, other.keys)
                break
        else:
            merged.append(item)
    return frozenset(merged)


def switch_union(local: Property, remote: Property) -> Property:
    """A SwitchUnion delivers what its local branch delivers: its guard only lets the local
    branch run when that holds, and the remote branch is at least as consistent (Thm 6.4)."""
    del remote
    return local


def conflicting(delivered: Property) -> bool:
    """Two tuples sharing an input but not a region (or not the same grouping): one table's
    columns would come from two snapshots, which the model does not allow."""
    items = list(delivered)
    for i, first in enumerate(items):
        for second in items[i + 1 :]:
            if first.inputs & second.inputs and (
                first.region != second.region or first.keys != second.keys
            ):
                return True
    return False


def _groups_fit(delivered: Delivered, required: ConsistencyClass, fds: Sequence[FD]) -> bool:
    """Every required group lies inside a delivered region: some delivered key is within the
    closure of the required grouping (a whole-input region fits any grouping)."""
    if not delivered.keys:
        return True
    wanted = closure(required.grouping, fds)
    return any(key <= wanted for key in delivered.keys)


def satisfies(delivered: Property, required: Sequence[ConsistencyClass], fds: Sequence[FD]) -> bool:
    """Consistency satisfaction rule (§5.2.3): not conflicting, and every required class is
    inside one delivered tuple whose groups fit the required grouping."""
    if conflicting(delivered):
        return False
    return all(
        any(cls.instances <= d.inputs and _groups_fit(d, cls, fds) for d in delivered)
        for cls in required
    )


def violates(delivered: Property, required: Sequence[ConsistencyClass], fds: Sequence[FD]) -> bool:
    """Consistency violation rules (§5.2.3), for pruning partial plans early: conflicting; a
    required class split across two delivered tuples; or a delivered tuple holding a whole
    class whose groups cannot fit its grouping."""
    if conflicting(delivered):
        return True
    for cls in required:
        touching = [d for d in delivered if d.inputs & cls.instances]
        if len(touching) > 1:
            return True
        for d in touching:
            if cls.instances <= d.inputs and not _groups_fit(d, cls, fds):
                return True
    return False
