"""The cache's size budget (``cache_size_limit``): what its data weighs, and what each held
presence region has been worth lately.

The data's bytes are its rows as Arrow holds them, uncompressed: each table's row count
times its bytes per row, measured on a sample of its rows (DuckDB's file is usually smaller,
compressed, but keeps the blocks a delete frees for the next rows). Every table holding
cached rows counts: the cached views, the derived views and their copies. The control tables
and the metadata do not.

A region's worth (`RegionHits`) is what the eviction policy (`optimizer.rules.eviction_policy`)
weighs against its size: the reads of its key in a recent window - hits, and the misses that
admit it again (halving every window) - and the backend cost a hit avoids, as the cost model
estimated it for each statement. A key's count outlives its eviction (TinyLFU's lesson: a key
asked for often comes back with its history, not as a newcomer the next eviction takes), in
a sketch of fixed memory. It lives in the process that answers (the server, an application's
engine): a process that opens the file anew starts with none and evicts by size and refresh
cost alone until reads come.
"""

from __future__ import annotations

import math
import re
import threading
import time
import typing as t
from collections.abc import Iterable

import duckdb
import numpy

from control_tables.schema import CacheSchema
from optimizer.derived.delta import AUX_PREFIX
from sql_ext.errors import ProgrammingError
from sql_ext.quoting import ident

Key = tuple[t.Any, ...]

HITS_HALF_LIFE = 300.0  # seconds: a hit counts half after this long (the recent window)
WIDTH_SAMPLE = 2048  # rows a table's bytes per row are measured on (one DuckDB vector)
SKETCH_WIDTH = 1 << 18  # counters per row of the reads' sketch (4 rows: 4 MiB in all)

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(value: t.Any, name: str = "cache_size_limit") -> int:
    """Bytes from a size: a whole number of bytes, or a number with its unit as DuckDB's
    memory_limit takes them ('500MB', '2GiB'; KB = 1000 bytes, KiB = 1024)."""
    if isinstance(value, bool):
        raise ProgrammingError(
            f"{name} must be a size in bytes, or with a unit as '2GB', not {value!r}"
        )
    if isinstance(value, int):
        found = value
    else:
        match = _SIZE.fullmatch(value) if isinstance(value, str) else None
        unit = _UNITS.get(match.group(2).lower()) if match else None
        if match is None or unit is None:
            raise ProgrammingError(
                f"{name} must be a size in bytes, or with a unit as '2GB' or '512MiB' (B, KB, "
                f"MB, GB, TB, KiB, MiB, GiB, TiB), not {value!r}"
            )
        found = int(float(match.group(1)) * unit)
    if found <= 0:
        raise ProgrammingError(f"{name} must be more than 0 bytes, not {value!r}")
    return found


def copy_tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The copies continuously maintained derived views keep of the tables they read."""
    return [
        name
        for (name,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' AND "
            "starts_with(table_name, ?) ORDER BY 1",
            [AUX_PREFIX],
        ).fetchall()
    ]


def pulled_copies(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[int, t.Any]]:
    """The copies of tables pulled (their view state says when), each with its pull's
    snapshot and time (a pull changes them; the stream does not): the stream keeps those."""
    return {
        name: (snapshot_id, refreshed_at)
        for name, snapshot_id, refreshed_at in con.execute(
            "SELECT view, snapshot_id, refreshed_at FROM mtcache.view_state "
            "WHERE starts_with(view, ?)",
            [AUX_PREFIX],
        ).fetchall()
    }


def data_tables(con: duckdb.DuckDBPyConnection, schema: CacheSchema) -> list[str]:
    """Every table holding cached rows: the cached views and the derived views' copies."""
    return [*schema.views, *copy_tables(con)]


def data_bytes(
    con: duckdb.DuckDBPyConnection, tables: Iterable[str], widths: dict[str, tuple[int, float]]
) -> dict[str, int]:
    """Each table's rows times its bytes per row. ``widths`` keeps each table's bytes per
    row and the row count it was measured at: measured again once the count has doubled or
    halved since (a per-row width changes slowly; sampling it each time would cost more
    than the count)."""
    found: dict[str, int] = {}
    for table in tables:
        [(rows,)] = con.execute(f"SELECT count(*) FROM {ident(table)}").fetchall()
        if rows == 0:
            found[table] = 0
            continue
        kept = widths.get(table)
        if kept is None or not kept[0] / 2 <= rows <= kept[0] * 2:
            sample = con.sql(f"SELECT * FROM {ident(table)} LIMIT {WIDTH_SAMPLE}").to_arrow_table()
            kept = (rows, sample.nbytes / max(sample.num_rows, 1))
            widths[table] = kept
        found[table] = math.ceil(rows * kept[1])
    return found


class RegionHits:
    """Reads per presence key (control table, key) in this process, held or not, in fixed
    memory: a count-min sketch (TinyLFU's frequency sketch: ``DEPTH`` rows of ``width``
    counters; a key's count is the least of its counters, never less than its reads) whose
    counters all halve every ``half_life`` seconds; and the backend cost a hit on a key
    saves, for the last ``SAVED_KEYS`` keys read (else its control table's mean)."""

    DEPTH = 4
    SAVED_KEYS = 100_000

    def __init__(self, half_life: float = HITS_HALF_LIFE, width: int = SKETCH_WIDTH) -> None:
        self.half_life = half_life
        self.width = width
        self._counts = numpy.zeros((self.DEPTH, width), dtype=numpy.float32)
        self._rows = numpy.arange(self.DEPTH)
        self._halved_at: float | None = None  # when the counters last halved
        self._saved: dict[tuple[str, Key], float] = {}  # oldest first
        self._mean: dict[str, float] = {}  # per control table
        self._lock = threading.Lock()

    def hit(self, control: str, key: Key, saved: float, now: float | None = None) -> None:
        """A read of the key: a hit, or a miss (what a hit would have saved)."""
        now = time.monotonic() if now is None else now
        at = self._slots(control, key)
        with self._lock:
            self._age(now)
            self._counts[self._rows, at] += 1.0
            kept = self._saved
            kept.pop((control, key), None)
            kept[control, key] = saved
            if len(kept) > self.SAVED_KEYS:
                del kept[next(iter(kept))]
            mean = self._mean.get(control)
            self._mean[control] = saved if mean is None else mean + (saved - mean) / 64

    def worth(self, control: str, key: Key, now: float | None = None) -> tuple[float, float]:
        """(its reads in the window, as decayed now; the backend cost a hit saves)."""
        return self.worths(control, [key], now)[0]

    def worths(
        self, control: str, keys: list[Key], now: float | None = None
    ) -> list[tuple[float, float]]:
        """`worth` of many keys of one control table at once (the budget weighs every held
        region at an eviction)."""
        now = time.monotonic() if now is None else now
        if not keys:
            return []
        at = numpy.array([self._slots(control, key) for key in keys], dtype=numpy.int64)
        with self._lock:
            self._age(now)
            counts = self._counts[self._rows, at].min(axis=1).tolist()
            saved, mean = self._saved, self._mean.get(control, 0.0)
            return [(c, saved.get((control, k), mean)) for c, k in zip(counts, keys, strict=True)]

    def _slots(self, control: str, key: Key) -> list[int]:
        """The key's counter in each row (double hashing of one hash)."""
        found = hash((control, key))
        step = (found >> 17) | 1
        return [(found + row * step) % self.width for row in range(self.DEPTH)]

    def _age(self, now: float) -> None:
        if self._halved_at is None:
            self._halved_at = now
            return
        periods = int((now - self._halved_at) // self.half_life)
        if periods > 0:
            self._counts *= numpy.float32(0.5**periods)
            self._halved_at += periods * self.half_life


class Budget:
    """A cache file's budget in this process (every handle shares it): the limit (None:
    none), the measured bytes per row of its tables, and its regions' hits."""

    def __init__(self) -> None:
        self.limit: int | None = None
        self.widths: dict[str, tuple[int, float]] = {}
        self.hits = RegionHits()
