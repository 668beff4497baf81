"""The cache's size budget (``cache_size_limit``): what its data weighs, and what each held
presence region has been worth lately.

The data's bytes are its rows as Arrow holds them, uncompressed: each table's row count
times its bytes per row, measured on a sample of its rows (DuckDB's file is usually smaller,
compressed, but keeps the blocks a delete frees for the next rows). Every table holding
cached rows counts: the cached views, the derived views and their copies. The control tables
and the metadata do not.

A region's worth (`RegionHits`) is what the eviction policy (`optimizer.eviction_policy`)
weighs against its size: the hits in a recent window (counted with exponential decay, a
window being a half-life) and the backend cost those hits avoided, as the cost model
estimated it for each statement answered. It lives in the process that answers (the server,
an application's engine): a process that opens the file anew starts with none and evicts
by size and refresh cost alone until hits come.
"""

from __future__ import annotations

import math
import re
import threading
import time
import typing as t
from collections.abc import Iterable

import duckdb

from control_tables.schema import CacheSchema
from optimizer.derived_delta import AUX_PREFIX
from sql_ext.errors import ProgrammingError
from sql_ext.quoting import ident

Key = tuple[t.Any, ...]

HITS_HALF_LIFE = 300.0  # seconds: a hit counts half after this long (the recent window)
WIDTH_SAMPLE = 2048  # rows a table's bytes per row are measured on (one DuckDB vector)

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(value: t.Any, name: str = "cache_size_limit") -> int:
    """Bytes from a size: a whole number of bytes, or a number with its unit as DuckDB's
    memory_limit takes them ('500MB', '2GiB'; KB = 1000 bytes, KiB = 1024)."""
    if isinstance(value, bool):
        raise ProgrammingError(f"{name} must be a size in bytes, or with a unit as '2GB', "
                               f"not {value!r}")  # fmt: skip
    if isinstance(value, int):
        found = value
    else:
        match = _SIZE.fullmatch(value) if isinstance(value, str) else None
        unit = _UNITS.get(match.group(2).lower()) if match else None
        if match is None or unit is None:
            raise ProgrammingError(
                f"{name} must be a size in bytes, or with a unit as '2GB' or '512MiB' (B, KB, "
                f"MB, GB, TB, KiB, MiB, GiB, TiB), not {value!r}")  # fmt: skip
        found = int(float(match.group(1)) * unit)
    if found <= 0:
        raise ProgrammingError(f"{name} must be more than 0 bytes, not {value!r}")
    return found


def data_tables(con: duckdb.DuckDBPyConnection, schema: CacheSchema) -> list[str]:
    """Every table holding cached rows: the cached views and the derived views' copies."""
    copies = [name for (name,) in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' AND "
        "starts_with(table_name, ?) ORDER BY 1", [AUX_PREFIX]).fetchall()]  # fmt: skip
    return [*schema.views, *copies]


def data_bytes(con: duckdb.DuckDBPyConnection, tables: Iterable[str],
               widths: dict[str, tuple[int, float]]) -> dict[str, int]:  # fmt: skip
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
    """Hits per presence region (control table, key) in this process: a decayed count (each
    hit counts 1, halving every ``half_life`` seconds) and the mean backend cost a hit saved
    (the cost model's units)."""

    def __init__(self, half_life: float = HITS_HALF_LIFE) -> None:
        self.half_life = half_life
        self._hits: dict[tuple[str, Key], list[float]] = {}  # [count, at, saved per hit]
        self._lock = threading.Lock()

    def hit(self, control: str, key: Key, saved: float, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            kept = self._hits.get((control, key))
            if kept is None:
                self._hits[control, key] = [1.0, now, saved]
                return
            count = kept[0] * self._decay(now - kept[1]) + 1.0
            kept[2] += (saved - kept[2]) / min(count, 16.0)  # a moving mean of the last hits
            kept[0], kept[1] = count, now

    def worth(self, control: str, key: Key, now: float | None = None) -> tuple[float, float]:
        """(hits in the window, as decayed now; backend cost saved per hit)."""
        now = time.monotonic() if now is None else now
        kept = self._hits.get((control, key))
        if kept is None:
            return 0.0, 0.0
        return kept[0] * self._decay(now - kept[1]), kept[2]

    def forget(self, control: str, keys: Iterable[Key]) -> None:
        """Evicted regions start again from nothing (a key admitted again is new)."""
        with self._lock:
            for key in keys:
                self._hits.pop((control, key), None)

    def __len__(self) -> int:
        return len(self._hits)

    def _decay(self, elapsed: float) -> float:
        return 0.5 ** (max(elapsed, 0.0) / self.half_life)


class Budget:
    """A cache file's budget in this process (every handle shares it): the limit (None:
    none), the measured bytes per row of its tables, and its regions' hits."""

    def __init__(self) -> None:
        self.limit: int | None = None
        self.widths: dict[str, tuple[int, float]] = {}
        self.hits = RegionHits()
