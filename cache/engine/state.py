"""A session's state the guards depend on: the backend clock, the
session's writes (uncommitted, then committed at a backend time), and its TIMEORDERED
timeline. `guard_session` freezes it into the optimizer's `Session` value for one decision.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import typing as t
from collections.abc import Iterable

import psycopg
from psycopg import pq

from cache.store.cache_file import CacheStore
from heartbeat.clock import CLOCK_MAX_AGE, DRIFT, BackendClock, measure
from optimizer.rules.evaluate_guards import Session
from sql_ext.errors import BackendUnavailableError, ProgrammingError

# libpq's transaction statuses of a session outside any transaction (or with no session)
_OUTSIDE = (pq.TransactionStatus.IDLE, pq.TransactionStatus.UNKNOWN)
OFFLINE_RETRY = 60.0  # seconds between measurement attempts while the backend is unreachable


class SessionState:
    def __init__(
        self,
        pg: t.Callable[[], psycopg.Connection[t.Any] | None],
        store: CacheStore,
        process_clock: t.Callable[[], BackendClock | None] = lambda: None,
        process_clock_at_hand: t.Callable[
            [dt.datetime], tuple[bool, BackendClock | None]
        ] = lambda now: (False, None),
        ran: t.Callable[[], None] = lambda: None,
    ) -> None:
        """``process_clock``: the clock this process keeps (its heartbeat's, a measurement
        shared by sessions without a connection), which may be measured when asked;
        ``process_clock_at_hand``: at a moment, whether asking it would measure it, and the
        clock it has (asking nothing of the backend)."""
        self._pg = pg  # the session's backend connection now (None: the backend is down)
        self._ran = ran  # told of each statement this state runs on that connection
        self._store = store
        self._process_clock = process_clock  # a heartbeat of this process measures too
        self._process_clock_at_hand = process_clock_at_hand
        self._use_clock(*self._measure_or_last())  # currency is judged on the backend's clock
        self.uncommitted: set[str] = set()  # tables written in the open backend transaction
        self.uncommitted_unknown = False  # a write whose tables the parser could not name
        self.written_at: dict[str, dt.datetime] = {}  # committed writes of this session
        self.unknown_written_at: dt.datetime | None = None
        self.timeline_active = False
        self.timeline_floor: dt.datetime | None = None  # None: not inside TIMEORDERED
        # the session's freshness position (`position`): the newest backend moment of the data
        # its reads saw, the local time of its last remote read (on the backend's clock: plus
        # the offset), and a position it presented from elsewhere, which no read goes below
        self.seen_at: dt.datetime | None = None
        self._remote_at: dt.datetime | None = None
        self.min_position: dt.datetime | None = None
        self._guarded: Session | None = None  # what the guards see, until something changes

    # -- the backend clock ---------------------------------------------------------------------

    def now(self) -> dt.datetime:
        """The backend's clock (erring late): the process's estimate when it keeps one and it
        is newer, else re-measured every CLOCK_MAX_AGE seconds."""
        local = self._adopt_process_clock()
        if local > self._remeasure_at:
            self._use_clock(*self._measure_or_last(self.clock))
        return local + self._offset

    def now_at_hand(self) -> dt.datetime | None:
        """`now`, or None when it is time to measure (an event loop may not wait for it)."""
        local = dt.datetime.now(dt.UTC)
        due, beat = self._process_clock_at_hand(local)
        if due:
            return None
        if beat is not None and beat.measured_at > self.clock.measured_at:
            self._use_clock(beat, save=False)
        return None if local > self._remeasure_at else local + self._offset

    def _adopt_process_clock(self) -> dt.datetime:
        """The process's clock taken when it is newer than the session's; the local time."""
        local = dt.datetime.now(dt.UTC)
        beat = self._process_clock()
        if beat is not None and beat.measured_at > self.clock.measured_at:
            self._use_clock(beat, save=False)
        return local

    def _measure_or_last(self, last: BackendClock | None = None) -> tuple[BackendClock, float]:
        """A measurement on the backend session; while the backend is unreachable, the last
        one (this session's, else the cache file's) pushed later by the drift it may have
        accumulated since (so the estimate still errs late), re-tried a minute later."""
        pg = self._pg()
        if pg is not None and not pg.closed:
            self._ran()
            try:
                return measure(pg), CLOCK_MAX_AGE
            except psycopg.Error:
                pass
        else:  # no connection of its own: the process's clock, if it has one
            shared = self._process_clock()
            if shared is not None:
                return shared, CLOCK_MAX_AGE
        last = last or self._store.load_clock()
        if last is None:
            raise BackendUnavailableError(
                "the backend is unreachable and this cache file has never measured its clock: "
                "connect once while the backend is up"
            )
        local = dt.datetime.now(dt.UTC)
        aged = max(0.0, (local - last.measured_at).total_seconds())
        pushed = dataclasses.replace(
            last,
            offset_seconds=last.offset_seconds + DRIFT * max(aged, OFFLINE_RETRY),
            measured_at=local,
        )
        return pushed, OFFLINE_RETRY

    def _use_clock(
        self, clock: BackendClock, retry: float = CLOCK_MAX_AGE, save: bool = True
    ) -> None:
        self.clock = clock
        self._offset = dt.timedelta(seconds=clock.offset_seconds)
        self._remeasure_at = clock.measured_at + dt.timedelta(seconds=retry)
        if save:  # for tools without a backend (status); the heartbeat's every beat is not
            self._store.save_clock(clock)

    # -- the session's own writes (read your writes) -----------------------------------------

    @property
    def writing(self) -> bool:
        return bool(self.uncommitted or self.uncommitted_unknown)

    def wrote(self, tables: Iterable[str] | None) -> None:
        """A write reached the backend (tables None: the parser could not name them): noted
        as uncommitted until `settle` finds its transaction over."""
        if tables is None:
            self.uncommitted_unknown = True
        else:
            self.uncommitted.update(tables)
        self._guarded = None

    def settle(self, rolled_back: bool = False) -> None:
        """Once the backend session is outside any transaction, its writes are over: committed
        (autocommit, a COMMIT sent as SQL, the end of a transaction block) or rolled back. A
        rollback the session cannot tell from a commit counts as a commit: stricter reads."""
        if self._over():
            if rolled_back:
                self.rolled_back()
            else:
                self.committed()

    def settle_at_hand(self) -> bool:
        """`settle` if its commit time needs no measurement of the clock; False: nothing
        changed (the writes stay uncommitted, stricter, until `settle`)."""
        if self._over():
            now = self.now_at_hand()
            if now is None:
                return False
            self._committed_at(now)
        return True

    def _over(self) -> bool:
        """Whether the session wrote and its backend session is outside any transaction."""
        if not self.writing:
            return False
        pg = self._pg()
        return pg is None or pg.pgconn.transaction_status in _OUTSIDE

    def committed(self) -> None:
        self._committed_at(self.now())

    def _committed_at(self, now: dt.datetime) -> None:
        for table in self.uncommitted:
            self.written_at[table] = now
        if self.uncommitted_unknown:
            self.unknown_written_at = now
        self.rolled_back()

    def rolled_back(self) -> None:
        self.uncommitted.clear()
        self.uncommitted_unknown = False
        self._guarded = None

    # -- the session timeline (§2.3) -----------------------------------------------------------

    def begin_timeordered(self) -> None:
        if self.timeline_active:
            raise ProgrammingError("BEGIN TIMEORDERED inside a TIMEORDERED block: end it first")
        self.timeline_active = True
        self.timeline_floor = None
        self._guarded = None

    def end_timeordered(self) -> None:
        if not self.timeline_active:
            raise ProgrammingError("END TIMEORDERED without BEGIN TIMEORDERED")
        self.timeline_active = False
        self.timeline_floor = None
        self._guarded = None

    def read_at(self, moment: dt.datetime) -> None:
        """A query read data as of ``moment``: later ones inside TIMEORDERED may not read
        older data."""
        if self.timeline_active and (self.timeline_floor is None or moment > self.timeline_floor):
            self.timeline_floor = moment
            self._guarded = None

    # -- the freshness position (several servers, one backend) -------------------------------

    def saw(self, moment: dt.datetime) -> None:
        """A read saw data as of ``moment`` (the backend's clock)."""
        if self.seen_at is None or moment > self.seen_at:
            self.seen_at = moment

    def saw_backend(self) -> None:
        """The backend answered a read just now (its moment is taken on the local clock: the
        backend's is the clock's estimate of it, which errs late, when the position is asked)."""
        self._remote_at = dt.datetime.now(dt.UTC)

    def position(self) -> dt.datetime | None:
        """The newest backend moment the session has seen: of the data it read, of its
        committed writes, and any position it presented (None: nothing yet). Another cache
        given it (`require`) never answers the session from older data."""
        moments = [
            m
            for m in (self.seen_at, self.unknown_written_at, self.min_position, self.timeline_floor)
            if m is not None
        ]
        moments += self.written_at.values()
        if self._remote_at is not None:
            moments.append(self._remote_at + self._offset)
        return max(moments, default=None)

    def require(self, moment: dt.datetime | None) -> None:
        """From now on no read answers from data older than ``moment`` (a position another
        cache gave the session; None: no such floor)."""
        self.min_position = moment
        self._guarded = None

    # -- what one decision sees ----------------------------------------------------------------

    def guard_session(self, tables: Iterable[str], ignore_currency: bool = False) -> Session:
        """The session as the guards see it now; ``tables``: every table a write the parser
        could not name may have touched. Kept until the session's state changes."""
        if ignore_currency:
            return self._session(tables)._replace(ignore_currency=True)
        if self._guarded is None:
            self._guarded = self._session(tables)
        return self._guarded

    def _session(self, tables: Iterable[str]) -> Session:
        uncommitted = frozenset(self.uncommitted)
        if self.uncommitted_unknown:
            uncommitted |= frozenset(tables)
        written = dict(self.written_at)
        unknown = self.unknown_written_at
        floor = self.min_position  # (as a write of every table then: nothing older is read)
        if floor is not None and (unknown is None or unknown < floor):
            unknown = floor
        if unknown is not None:
            for table in tables:
                previous = written.get(table)
                if previous is None or previous < unknown:
                    written[table] = unknown
        return Session(
            timeline_floor=self.timeline_floor,
            uncommitted=uncommitted,
            written_at=written,
        )
