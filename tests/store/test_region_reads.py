"""The regions read since their last refresh (what a REFRESH AUTO view's refresh pulls): a
read at or after a region's stamp counts, one before it does not; regions held before the
control was watched count as read; keys no longer held are forgotten. Moments are given. No
backend needed."""

from __future__ import annotations

import datetime as dt

from cache.store.region_reads import RegionReads

T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_a_region_counts_as_read_when_read_at_or_after_its_stamp() -> None:
    reads = RegionReads()
    reads.watch(["keys"], lambda control: None)  # (watched before any was held)
    reads.read([("keys", (1,)), ("keys", (2,)), ("other", (9,))], at(10))
    reads.read([("keys", (1,))], at(5))  # (an earlier moment noted late: the later one stays)
    listed = {(1,): (at(10), 1), (2,): (at(11), 1), (3,): (at(0), 1), (4,): (None, None)}
    # 1 read at its stamp; 2 read before its refresh; 3 never read; 4 never refreshed
    assert reads.read_since("keys", listed) == [(1,), (4,)]
    assert reads.read_since("other", listed) is None  # not watched: every region counts


def test_the_regions_held_when_watching_began_count_as_read() -> None:
    reads = RegionReads()
    reads.watch(["keys"], lambda control: at(5))  # (the newest stamp then)
    listed = {(1,): (at(5), 1), (2,): (at(3), 1), (3,): (at(6), 2)}
    assert reads.read_since("keys", listed) == [(1,), (2,)]


def test_keys_no_longer_held_are_forgotten_and_unwatched_controls_dropped() -> None:
    reads = RegionReads()
    reads.watch(["keys"], lambda control: None)
    reads.read([("keys", (1,)), ("keys", (2,))], at(10))
    assert reads.read_since("keys", {(1,): (at(1), 1)}) == [(1,)]  # 2 was evicted
    assert reads.read_since("keys", {(1,): (at(1), 1), (2,): (at(1), 1)}) == [(1,)]
    reads.watch([], lambda control: None)
    reads.read([("keys", (1,))], at(20))  # (no longer watched: left, no error)
    assert reads.watched == frozenset() and reads.read_since("keys", {}) is None
