"""The presence regions read since they were last refreshed, per key: what a refresh of a
`REFRESH AUTO` view pulls (`cache.maintenance.auto_refresh`). A region nobody read since its
last refresh is left as it is: its guard sends a read of it to the backend once its data is
too old for the read, and that read counts as one, so its next refresh pulls it.

A read is noted where a guard finds the key held (a local answer reads it; a currency miss
would have), at the moment its currency was judged (the backend's clock, as the regions'
stamps are): a region was read since its refresh when a read's moment is not before its stamp.
Only the control tables of `REFRESH AUTO` views are watched (`watch`), and only keys held are
noted (a miss is admitted fresh), so what is kept is bounded by the regions held; keys no
longer held are dropped when their control's regions are next looked over (`read_since`). It is
kept in memory only: a process counts every region refreshed before it began watching its
control as read (it cannot know), so its first refresh pulls them all.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterable, Mapping

from control_tables.regions import Key, Stamp


class RegionReads:
    """The regions read in this process (every handle of a cache file shares it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reads: dict[str, dict[Key, dt.datetime]] = {}  # control -> key -> last read
        self._since: dict[str, dt.datetime] = {}  # control -> when it began to be watched
        # the controls watched (read without the lock on the hit path: replaced, never changed)
        self.watched: frozenset[str] = frozenset()
        # when the scheduler last looked over each REFRESH AUTO view's regions: it looks again
        # an interval later (`cache.store.refresh_times`), whether it refreshed some or none
        self.looked: dict[str, dt.datetime] = {}

    def watch(self, controls: Iterable[str], now: dt.datetime) -> None:
        """Watch these controls' reads from ``now`` on (and no others)."""
        wanted = frozenset(controls)
        if wanted == self.watched:
            return
        with self._lock:
            for control in wanted - self.watched:
                self._since[control] = now
                self._reads[control] = {}
            for control in self.watched - wanted:
                del self._since[control], self._reads[control]
            self.watched = wanted

    def read(self, reads: Iterable[tuple[str, Key]], at: dt.datetime) -> None:
        """Reads of these (control, key) at ``at``; those of controls not watched are left."""
        watched = self.watched
        with self._lock:
            for control, key in reads:
                if control in watched:
                    found = self._reads[control]
                    last = found.get(key)
                    if last is None or last < at:
                        found[key] = at

    def read_since(self, control: str, listed: Mapping[Key, Stamp]) -> list[Key] | None:
        """The keys of ``listed`` (a control's regions: key -> stamp) read since their last
        refresh, never refreshed, or refreshed before the control was watched; None: it is
        not watched (every one counts). Keys no longer listed are forgotten."""
        with self._lock:
            found = self._reads.get(control)
            if found is None:
                return None
            reads, since = dict(found), self._since[control]
        chosen = []
        for key, (refreshed_at, _snapshot) in listed.items():
            if refreshed_at is None or refreshed_at < since:
                chosen.append(key)
                continue
            last = reads.get(key)
            if last is not None and last >= refreshed_at:
                chosen.append(key)
        gone = [key for key in reads if key not in listed]
        if gone:
            with self._lock:
                found = self._reads.get(control, {})
                for key in gone:  # (unless read again meanwhile: admitted again)
                    if found.get(key) == reads[key]:
                        del found[key]
        return chosen
