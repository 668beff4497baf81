"""The presence regions read since they were last refreshed, per key: what a refresh of a
`REFRESH AUTO` view pulls (`cache.maintenance.auto_refresh`). A region nobody read since its
last refresh is left as it is: its guard sends a read of it to the backend once its data is
too old for that read, and that read counts as one, so the next refresh pulls it.

A read is noted where a guard finds the key held, whether the answer used it (a local answer)
or not (its data too old for the read, or not of the snapshot the read's class needs), at the
moment the guard judged currency: the backend's clock, as the regions' stamps are. A region
was read since its refresh when a read's moment is not before its stamp. Only the control
tables of such views are watched (`watch`), and only keys held are noted (a miss is admitted
fresh), so what is kept is bounded by the regions held; keys no longer held are dropped when
their control's regions are next looked over (`read_since`). It is kept in memory only: the
regions a control held when this process began watching it (stamped at or before the newest
stamp then, so no clock is compared with another) count as read, since it cannot know; its
first refresh pulls them all.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterable, Mapping

from control_tables.regions import Key, Stamp


class RegionReads:
    """The regions read in this process (every handle of a cache file shares it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reads: dict[str, dict[Key, dt.datetime]] = {}  # control -> key -> last read
        # control -> the newest stamp of its regions when it began to be watched (None: none)
        self._before: dict[str, dt.datetime | None] = {}
        # the controls watched (read without the lock on the hit path: replaced, never changed)
        self.watched: frozenset[str] = frozenset()
        # when the scheduler last looked over each REFRESH AUTO view's regions: it looks again
        # an interval later (`cache.store.refresh_times`), whether it refreshed some or none
        self.looked: dict[str, dt.datetime] = {}

    def watch(self, controls: Iterable[str], newest: Callable[[str], dt.datetime | None]) -> None:
        """Watch these controls' reads from now on (and no others); ``newest``: a control's
        newest region stamp now (asked of those not watched yet)."""
        wanted = frozenset(controls)
        if wanted == self.watched:
            return
        began = {control: newest(control) for control in wanted - self.watched}
        with self._lock:
            for control, stamp in began.items():
                self._before[control] = stamp
                self._reads[control] = {}
            for control in self.watched - wanted:
                del self._before[control], self._reads[control]
            self.watched = wanted

    def read(self, reads: Iterable[tuple[str, Key]], at: dt.datetime) -> None:
        """Reads of these (control, key) at ``at``; those of controls not watched are left."""
        watched = self.watched
        found = [(c, k) for c, k in reads if c in watched]
        if not found:
            return
        with self._lock:
            for control, key in found:
                keys = self._reads.get(control)  # (None: no longer watched meanwhile)
                if keys is not None:
                    last = keys.get(key)
                    if last is None or last < at:
                        keys[key] = at

    def read_since(self, control: str, listed: Mapping[Key, Stamp]) -> list[Key] | None:
        """The keys of ``listed`` (a control's regions: key -> stamp) read since their last
        refresh, never refreshed, or held before the control was watched; None: it is not
        watched (every one counts). Keys no longer listed are forgotten."""
        with self._lock:
            found = self._reads.get(control)
            if found is None:
                return None
            reads, before = dict(found), self._before[control]
        chosen = []
        for key, (refreshed_at, _snapshot) in listed.items():
            if refreshed_at is None or (before is not None and refreshed_at <= before):
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

    def forget(self, view: str) -> None:
        """A view no longer refreshed by the regions read: its last look is no more."""
        self.looked.pop(view, None)
