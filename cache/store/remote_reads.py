"""The cached reads the backend answered, per statement shape: what `SHOW CACHE ADVICE` and
`mtcache advise` start from (`cache.engine.advice`).

A read whose whole statement went to the backend (its plan chose the backend, its guards
failed, its role may not read the cache) is counted under its shape - its text with every
constant a placeholder (`sql_ext.statements.Query.normalized`) - with the backend's time for
it and why it was not answered locally: the reason's kind (`REASONS`) and the message of its
last occurrence. The counts live in the process that answers (every handle of the file
shares them) and are kept in the cache file (``mtcache.remote_reads``) as the bounds asked
are (`cache.store.bound_asks`), so advice outlives a restart. At most ``MAX_SHAPES`` shapes
are kept: past it, the one that cost the backend least goes.
"""

from __future__ import annotations

import datetime as dt
import time
import typing as t
from dataclasses import dataclass, field

from cache.store.gathered import Gathered

MAX_SHAPES = 1000

# why the backend answered a cached read, most specific first
REASONS = {
    "no view": "no cached view holds a table it reads",
    "bound not met": "its views' data was older than its bound",
    "bound below delay": "its bound is at or below the views' refresh delay",
    "presence miss": "the keys it reads were not cached",
    "completeness miss": "a group it reads was not complete in the cache",
    "consistency": "the regions it reads were not from one snapshot",
    "timeline": "its session needed data newer than the cache's",
    "allowlist": "it uses what DuckDB cannot compute as PostgreSQL does",
    "outside": "it reads relations the cache cannot hold",
    "privileges": "its role may not read the cached tables",
    "cheaper remote": "the backend was estimated cheaper",
    "no bound": "it has no currency bound (from pg_stat_statements: the cache did not plan it)",
    "other": "the cache could not answer it",
}


@dataclass
class RemoteShape:
    statement: str
    calls: int = 0
    backend_ms: float = 0.0
    first_seen: float = 0.0
    last_seen: float = 0.0
    reasons: dict[str, list[t.Any]] = field(default_factory=dict)  # kind -> [count, message]

    @property
    def reason(self) -> tuple[str, str]:
        """The kind most of its calls had, and that kind's last message."""
        kind = max(self.reasons, key=lambda k: self.reasons[k][0], default="other")
        message = self.reasons[kind][1] if kind in self.reasons else REASONS[kind]
        return kind, message


class RemoteReads(Gathered):
    """The file's cached reads answered by the backend, in this process."""

    TABLE = "remote_reads"
    COLUMNS = "statement, calls, backend_ms, kind, reason, epoch(first_seen), epoch(last_seen)"

    def __init__(self) -> None:
        super().__init__()
        self._shapes: dict[str, RemoteShape] = {}

    def answered(
        self, statement: str, kind: str, message: str, ms: float, now: float | None = None
    ) -> None:
        """One call of ``statement`` the backend answered in ``ms`` milliseconds, because of
        ``kind`` (`REASONS`), told as ``message``."""
        now = time.time() if now is None else now
        with self._lock:
            shape = self._shapes.get(statement)
            if shape is None:
                if len(self._shapes) >= MAX_SHAPES:
                    least = min(self._shapes.values(), key=lambda s: s.backend_ms)
                    del self._shapes[least.statement]
                shape = self._shapes[statement] = RemoteShape(statement, first_seen=now)
            shape.calls += 1
            shape.backend_ms += ms
            shape.last_seen = now
            counted = shape.reasons.setdefault(kind, [0, message])
            counted[0] += 1
            counted[1] = message
            self._dirty = True

    def shapes(self) -> list[RemoteShape]:
        """Every shape, as it stands (copies)."""
        with self._lock:
            return [
                RemoteShape(
                    s.statement,
                    s.calls,
                    s.backend_ms,
                    s.first_seen,
                    s.last_seen,
                    {k: list(v) for k, v in s.reasons.items()},
                )
                for s in self._shapes.values()
            ]

    # -- in the cache file (`cache.store.cache_file.CacheStore.save_gathered`) ------------

    def load(self, rows: t.Iterable[tuple[t.Any, ...]]) -> None:
        """The shapes the file keeps (statement, calls, backend_ms, kind, reason, first and
        last seen in seconds since the epoch), once per process, added to those this process
        counted before."""
        with self._lock:
            if not self._first_load():
                return
            for statement, calls, ms, kind, reason, first, last in rows:
                # (added to what this process counted before it read them)
                shape = self._shapes.get(statement)
                if shape is None:
                    shape = self._shapes[statement] = RemoteShape(statement, 0, 0.0, first, last)
                shape.calls += int(calls)
                shape.backend_ms += float(ms)
                shape.first_seen = min(shape.first_seen, first)
                shape.last_seen = max(shape.last_seen, last)
                counted = shape.reasons.setdefault(kind, [0, reason])
                counted[0] += int(calls)

    def to_save(self, now: float, force: bool = False) -> list[tuple[t.Any, ...]] | None:
        """The rows of ``mtcache.remote_reads`` to write at ``now``; None: nothing changed, or
        not yet (at most every SAVE_EVERY seconds unless ``force``)."""
        with self._lock:
            if not self._due(now, force):
                return None
            rows = []
            for shape in self._shapes.values():
                kind, reason = shape.reason
                rows.append(
                    (
                        shape.statement,
                        shape.calls,
                        shape.backend_ms,
                        kind,
                        reason,
                        _moment(shape.first_seen),
                        _moment(shape.last_seen),
                    )
                )
            return rows


def _moment(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)
