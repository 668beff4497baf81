"""The kinds of cache regions (§3.3.1) and of guards (§4.4), each listed once, with what the
code decides by kind.

Members are `enum.StrEnum`s: each equals, hashes and prints as its value, which is the text the
cache has always written (status documents, EXPLAIN, a region's text, metrics labels), so
output is unchanged and a kind read back as text compares equal (``RegionKind("view")`` is
the member).

Here, not in `optimizer` or `cache`, because `control_tables.regions` (regions and MaxAC),
`control_tables.schema` (a control table's role) and everything above them use them; nothing in
`sql_ext` needs them (its "presence", "consistency" and "completeness" are the names of clauses).
"""

from __future__ import annotations

import enum
import typing as t


class RegionKind(enum.StrEnum):
    """What a region is: the rows of one presence, consistency or completeness control-key
    value, or the view-level region of a fully materialized or CONSISTENCY ON ALL view."""

    PRESENCE = "presence"
    CONSISTENCY = "consistency"
    COMPLETENESS = "completeness"
    VIEW = "view"

    @property
    def strength(self) -> int:
        """Order of MaxAC's cleaning (§3.4.1): completeness is the strongest guarantee over its
        rows (Lemma 2.3), then view-level and group consistency, then presence."""
        return _STRENGTH[self]

    @property
    def keyed(self) -> bool:
        """Its regions are each a control-key value's rows (the view-level region: all rows)."""
        return self is not RegionKind.VIEW

    @classmethod
    def strongest_first(cls) -> tuple[RegionKind, ...]:
        """Every kind, by MaxAC's cleaning order (`strength`)."""
        return tuple(sorted(cls, key=lambda kind: kind.strength, reverse=True))


_STRENGTH: dict[RegionKind, int] = {
    RegionKind.PRESENCE: 0,
    RegionKind.CONSISTENCY: 1,
    RegionKind.VIEW: 2,
    RegionKind.COMPLETENESS: 3,
}

# What a control table controls: the kind of the regions its rows list.
Role = t.Literal[RegionKind.PRESENCE, RegionKind.CONSISTENCY, RegionKind.COMPLETENESS]


class GuardKind(enum.StrEnum):
    """What a guard checks before its SwitchUnion's local branch may run: a fully materialized
    view's one region, or the probed values of a presence or completeness key."""

    FULL = "full"
    PRESENCE = "presence"
    COMPLETENESS = "completeness"

    @property
    def region(self) -> RegionKind:
        """The kind of the regions the guard checks (a full guard: the view-level one)."""
        return _REGION[self]

    @property
    def probes(self) -> bool:
        """It looks up the key values the access probes (in a control table or parent view),
        so its verdict depends on the execution's parameter values."""
        return self.region.keyed


_REGION: dict[GuardKind, RegionKind] = {
    GuardKind.FULL: RegionKind.VIEW,
    GuardKind.PRESENCE: RegionKind.PRESENCE,
    GuardKind.COMPLETENESS: RegionKind.COMPLETENESS,
}
