"""Functional dependencies and attribute closure (§5.1 Normalization Rule, Theorem 6.2).

An attribute is a column of one base-table *instance* (a table named twice in a query gives
two instances). A dependency with an empty left side marks a constant (``col = 5``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

Attr = tuple[Hashable, str]  # (instance, column)


@dataclass(frozen=True)
class FD:
    lhs: frozenset[Attr]
    rhs: frozenset[Attr]


def closure(attrs: Iterable[Attr], fds: Iterable[FD]) -> frozenset[Attr]:
    """X+ : every attribute determined by X."""
    result = set(attrs)
    pending = list(fds)
    changed = True
    while changed:
        changed = False
        remaining = []
        for fd in pending:
            if fd.lhs <= result:
                if not fd.rhs <= result:
                    result |= fd.rhs
                    changed = True
            else:
                remaining.append(fd)
        pending = remaining
    return frozenset(result)


def minimize(
    target: frozenset[Attr], fds: list[FD], keep_last: Iterable[Attr] = ()
) -> frozenset[Attr]:
    """A minimal subset M of ``target`` with M+ ⊇ target.

    Attributes are dropped greedily in sorted order; those in ``keep_last`` (the columns the
    query wrote) are tried last, so the answer uses the user's own columns where it can.
    """
    preferred = set(keep_last)
    order = sorted(target - preferred, key=_sort_key) + sorted(target & preferred, key=_sort_key)
    kept = set(target)
    for attr in order:
        trial = kept - {attr}
        if target <= closure(trial, fds):
            kept = trial
    return frozenset(kept)


def _sort_key(attr: Attr) -> tuple[str, str]:
    return (str(attr[0]), attr[1])
