"""Which presence regions leave when the cache's data passes its size budget.

The dissertation leaves the admission and eviction policy open (§3.5). A region is worth, per
byte it holds, what it saved the backend lately minus what keeping it current costs:

    worth = (hits x saved - refresh) / bytes

``hits``: its hits in the recent window (decayed: `cache.store.budget.RegionHits`);
``saved``: the backend cost a hit avoided, as the cost model estimated the statement whole
remote against its guarded plan (PostgreSQL's units); ``refresh``: what pulling its rows
costs in the same window, ``rows x TRANSFER_ROW_COST`` per refresh (a region of a view
refreshed every f seconds is pulled window / f times; a view kept by the stream, or refreshed
only on demand, pays nothing here); ``bytes``: what it holds (`cache.store.budget`).

The least worth goes first (GreedyDual-Size's order, with frequency as GDSF's): a small
region hit often stays, a large one hit rarely leaves, a region no one hit since it came is
worth less than any that was hit. Ties go to the region that frees more bytes, then by key,
so the choice is the same for the same state.
"""

from __future__ import annotations

import typing as t
from collections.abc import Iterable
from dataclasses import dataclass

from optimizer.rules.estimate_cost import TRANSFER_ROW_COST

Key = tuple[t.Any, ...]


@dataclass(frozen=True)
class Held:
    """A presence region the budget may evict."""

    control: str  # its control table
    key: Key
    rows: int  # the rows of its view it holds
    bytes: int
    hits: float = 0.0  # in the recent window, decayed
    saved: float = 0.0  # backend cost avoided per hit
    refreshes: float = 0.0  # pulls of its rows per window

    @property
    def refresh_cost(self) -> float:
        return self.rows * TRANSFER_ROW_COST * self.refreshes

    @property
    def worth(self) -> float:
        return (self.hits * self.saved - self.refresh_cost) / max(self.bytes, 1)


def victims(held: Iterable[Held], excess: int) -> list[Held]:
    """The regions of least worth whose bytes add up to at least ``excess`` (all of them if
    they do not)."""
    chosen: list[Held] = []
    freed = 0
    for region in sorted(held, key=lambda h: (h.worth, -h.bytes, h.control, repr(h.key))):
        if freed >= excess:
            break
        chosen.append(region)
        freed += region.bytes
    return chosen


def refreshes_per_window(refresh_seconds: float | None, window: float, continuous: bool) -> float:
    """How often a region of a view is pulled in ``window`` seconds (see the module)."""
    if continuous or refresh_seconds is None or refresh_seconds <= 0:
        return 0.0
    return window / refresh_seconds
