"""Local answers kept in memory and reused (issue 9's hit path): the rows of an all-local
decision's statement, keyed by the statement and its parameter values, valid while no view it
reads has changed (`CacheStore.change_token`). The guards still run on every execution - the
memo only replaces DuckDB's run of the statement they chose - so an answer is reused only
where DuckDB would return exactly these rows again.

Bounded by an estimate of the memory its rows take (least recently used entries go first);
statements whose answer depends on more than their data (``now()``, ``random()``,
`optimizer.postgres.volatility`) are never kept.
"""

from __future__ import annotations

import sys
import threading
import typing as t
from collections import OrderedDict
from collections.abc import Hashable
from pathlib import Path

DEFAULT_BYTES = 64 << 20  # per process and cache file
_ROW_OVERHEAD = 56 + 8  # a tuple and its slot in the list
_VALUE_BYTES = 48  # an average boxed value (int, Decimal, str of a few characters, date)


class ResultMemo:
    """A bounded LRU of answers: key -> (change token, description, rows)."""

    def __init__(self, max_bytes: int = DEFAULT_BYTES) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[Hashable, tuple[tuple[int, ...], t.Any, list[t.Any], int]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    def get(
        self, key: Hashable, token: tuple[int, ...], count_miss: bool = True
    ) -> tuple[t.Any, list[t.Any]] | None:
        """The description and rows kept under ``key`` at ``token``, or None (counted as a
        miss unless the caller asks again where it may wait)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] != token:
                self.misses += count_miss
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[1], entry[2]

    def put(
        self, key: Hashable, token: tuple[int, ...], description: t.Any, rows: list[t.Any]
    ) -> None:
        size = _estimate(rows)
        if size > self.max_bytes // 8:  # one answer never takes most of the memo
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.used -= old[3]
            self._entries[key] = (token, description, rows, size)
            self.used += size
            while self.used > self.max_bytes and self._entries:
                _, (_, _, _, dropped) = self._entries.popitem(last=False)
                self.used -= dropped

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.used = 0

    def __len__(self) -> int:
        return len(self._entries)


def _estimate(rows: list[t.Any]) -> int:
    if not rows:
        return sys.getsizeof(rows)
    return sys.getsizeof(rows) + len(rows) * (_ROW_OVERHEAD + len(rows[0]) * _VALUE_BYTES)


_MEMOS: dict[Path, ResultMemo] = {}
_MEMOS_LOCK = threading.Lock()


def memo_for(cache_file: Path, max_bytes: int) -> ResultMemo:
    """The memo of a cache file in this process (shared by its connections); ``max_bytes``:
    its bound, the latest connection's setting."""
    cache_file = cache_file.resolve()
    with _MEMOS_LOCK:
        memo = _MEMOS.get(cache_file)
        if memo is None:
            memo = _MEMOS[cache_file] = ResultMemo(max_bytes)
        memo.max_bytes = max_bytes
        return memo
