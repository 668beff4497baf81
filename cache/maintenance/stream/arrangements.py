"""Arrangements of the derived views' copies in memory (DBSP's indexed Z-sets): a copy's
rows, indexed by the columns views join it on, so a join delta probes the other side's
rows by key instead of scanning its copy.

DuckDB's indexes serve one point query at a time (a batch of keys becomes a join over a
scan of the table), so the stream keeps, beside each copy a view joins, an arrangement of
the columns those views read: a few *runs* of rows, each with a sorted index (numpy) per
indexed column and a mask of the rows still alive. A batch's rows arrive as a run of their
own; runs of like size merge (a log-structured spine, as DBSP's), so a probe costs a few
binary searches per key and a row is merged about log(n) times. The copy in the cache file
stays the durable form: an arrangement is made from it when a batch first needs it, and
forgotten whenever it could differ from it (a pull, DDL, a TRUNCATE, a batch that failed).
Integer, date and text columns are indexed (what keys are made of); a view that joins on
anything else is computed by DuckDB as before.
"""

from __future__ import annotations

import typing as t
from collections.abc import Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sql_ext.quoting import ident, idents

# the memory arrangements may take in all, by default (a copy over it is joined by DuckDB)
ARRANGED_BYTES = 2 << 30


def indexable(kind: pa.DataType) -> bool:
    """Values an arrangement indexes exactly: integers and dates (as int64), texts (as their
    UTF-8 bytes: DuckDB compares texts byte by byte)."""
    return _family(kind) is not None


def _family(kind: pa.DataType) -> str | None:
    """Which values compare with which in an index (an integer with an integer, ...)."""
    if pa.types.is_integer(kind) and kind != pa.uint64():
        return "integer"
    if pa.types.is_date32(kind):
        return "date"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    return None


def _numbers(values: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Indexable values as numpy values that sort and compare alike (int64, or bytes), and
    which are not NULL."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    valid = np.asarray(values.is_valid()) if values.null_count else np.ones(len(values), bool)
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        filled = pc.fill_null(values, "") if values.null_count else values
        return np.array(filled.cast(pa.binary()).to_pylist(), dtype=np.bytes_), valid
    if pa.types.is_date32(values.type):
        values = values.cast(pa.int32())
    filled = pc.fill_null(values, 0) if values.null_count else values
    return np.asarray(filled.cast(pa.int64())), valid


TEXT_BYTES = 64  # the longest text an index holds (its values are this wide, fixed)


def _index_width(values: pa.ChunkedArray) -> int | None:
    """Bytes per row of an index of ``values`` (its value, its position), None when they
    are not indexed: not of an indexable type, or texts longer than `TEXT_BYTES`."""
    if not indexable(values.type):
        return None
    if _family(values.type) != "text":
        return 16
    longest = pc.max(pc.binary_length(values)).as_py() or 0
    return None if longest > TEXT_BYTES else 8 + max(longest, 1)


class _Run:
    """Rows with a sorted index of each indexed column (NULLs left out) and which live."""

    __slots__ = ("alive", "index", "live", "rows")

    def __init__(self, rows: pa.Table, indexed: Sequence[str]) -> None:
        self.rows = rows.combine_chunks()
        self.alive = np.ones(rows.num_rows, bool)
        self.live = rows.num_rows
        self.index: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for column in indexed:
            values, valid = _numbers(self.rows.column(column))
            order = np.argsort(values, kind="stable")
            if not valid.all():
                order = order[valid[order]]
            self.index[column] = (values[order], order)

    def probe(
        self, column: str, values: np.ndarray, valid: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """For each live row whose ``column`` equals one of ``values``: which value, its
        position."""
        keys, order = self.index[column]
        low = np.searchsorted(keys, values, "left")
        counts = np.where(valid, np.searchsorted(keys, values, "right") - low, 0)
        total = int(counts.sum())
        which = np.repeat(np.arange(len(values)), counts)
        starts = np.repeat(low - (np.cumsum(counts) - counts), counts)
        found = order[starts + np.arange(total)]
        live = self.alive[found]
        return which[live], found[live]

    @property
    def nbytes(self) -> int:
        return (
            self.rows.nbytes
            + self.alive.nbytes
            + sum(k.nbytes + o.nbytes for k, o in self.index.values())
        )


class Arrangement:
    """A copy's rows (``columns``, keyed by ``key``) indexed by the ``indexed`` columns."""

    def __init__(
        self, spec: tuple[t.Any, ...], key: Sequence[str], indexed: Sequence[str], rows: pa.Table
    ) -> None:
        self.spec = spec  # (what it was made from: the copy's stamp, columns and indexes)
        self.key = tuple(key)
        self.indexed = tuple(indexed)
        self.schema = rows.schema
        self.runs = [_Run(rows, self.indexed)]

    def probe(self, column: str, values: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Table]:
        """The live rows whose ``column`` equals each of ``values`` (an indexable array): for
        each, the position of its value, and the rows. `ValueError` for values the column
        does not compare with (a date with an integer)."""
        if _family(values.type) != _family(self.schema.field(column).type):
            raise ValueError(f"{values.type} values probing {column}")
        if _family(values.type) == "text":  # (a text longer than any indexed finds none)
            long = pc.fill_null(pc.greater(pc.binary_length(values), TEXT_BYTES), False)
            if pc.any(long).as_py():
                values = pc.if_else(long, pa.scalar(None, values.type), values)
        numbers, valid = _numbers(values)
        which: list[np.ndarray] = []
        parts: list[pa.Table] = []
        for run in self.runs:
            at, found = run.probe(column, numbers, valid)
            if len(found):
                which.append(at)
                parts.append(run.rows.take(found))
        if not parts:
            return np.zeros(0, np.int64), self.schema.empty_table()
        return np.concatenate(which), pa.concat_tables(parts)

    def remove(self, keys: pa.Table) -> bool:
        """The rows of the ``keys`` (the copy's key columns) leave; False when they were not
        all there, one row each (then the arrangement is not the copy: forget it)."""
        numbers, valid = _numbers(keys.column(self.key[0]))
        removed = 0
        for run in self.runs:
            which, found = run.probe(self.key[0], numbers, valid)
            same = np.ones(len(found), bool)
            for column in self.key[1:]:
                equal = pc.equal(
                    run.rows.column(column).take(found), keys.column(column).take(which)
                )
                same &= np.asarray(equal.fill_null(False))
            run.alive[found[same]] = False
            run.live -= int(same.sum())
            removed += int(same.sum())
        return removed == keys.num_rows

    def takes(self, rows: pa.Table) -> bool:
        """Whether its indexes hold the values of ``rows`` (not a text past `TEXT_BYTES`)."""
        return all(_index_width(rows.column(c)) is not None for c in self.indexed)

    def add(self, rows: pa.Table) -> None:
        """The rows arrive (as a run; runs of like size merge)."""
        if not rows.num_rows:
            return
        self.runs.append(_Run(rows.select(self.schema.names).cast(self.schema), self.indexed))
        while len(self.runs) > 1 and len(self.runs[-2].alive) <= 2 * len(self.runs[-1].alive):
            newer, older = self.runs.pop(), self.runs.pop()
            self.runs.append(_merged(older, newer, self.indexed))
        base = self.runs[0]  # (a run mostly dead is made again without its dead rows)
        if base.live < len(base.alive) // 2:
            self.runs[0] = _merged(base, None, self.indexed)

    @property
    def nbytes(self) -> int:
        return sum(run.nbytes for run in self.runs)

    def rows(self) -> pa.Table:
        """The live rows."""
        return pa.concat_tables([run.rows.filter(pa.array(run.alive)) for run in self.runs])


def _merged(older: _Run, newer: _Run | None, indexed: Sequence[str]) -> _Run:
    parts = [older.rows.filter(pa.array(older.alive))]
    if newer is not None:
        parts.append(newer.rows.filter(pa.array(newer.alive)))
    return _Run(pa.concat_tables(parts), indexed)


class Arrangements:
    """The arrangements of one stream consumer, by table, within ``limit`` bytes in all."""

    def __init__(self, limit: int = ARRANGED_BYTES) -> None:
        self.limit = limit
        self._by_table: dict[str, Arrangement] = {}
        self._refused: dict[str, tuple[t.Any, ...]] = {}  # (too big: not tried again)
        # the stream position the arrangements are of (None: none kept): the consumer forgets
        # them when the file's is another (another consumer of the file applied batches)
        self.position: int | None = None
        # whether the batch under way made or changed one (if it fails, they are forgotten)
        self.touched = False

    def clear(self) -> None:
        """Forget every arrangement (a batch that changed them failed: the copies are as
        before it). What was refused stays refused (its spec names the copy's pull)."""
        self._by_table.clear()
        self.position = None

    def forget(self, table: str, refuse: bool = False) -> None:
        """Forget the table's arrangement (``refuse``: and make none of the same spec again)."""
        found = self._by_table.pop(table, None)
        if refuse and found is not None:
            self._refused[table] = found.spec

    def keep_only(self, tables: t.Collection[str]) -> None:
        """Forget the arrangements of tables other than ``tables`` (those a batch keeps: one
        it would not keep could come back stale)."""
        for table in [name for name in self._by_table if name not in tables]:
            del self._by_table[table]

    def kept(self, table: str, spec: tuple[t.Any, ...]) -> Arrangement | None:
        """The table's arrangement if it is of ``spec`` (else it is forgotten)."""
        found = self._by_table.get(table)
        if found is not None and found.spec != spec:
            del self._by_table[table]
            return None
        return found

    def arranged(
        self,
        con: duckdb.DuckDBPyConnection,
        table: str,
        copy_name: str,
        key: Sequence[str],
        spec: tuple[t.Any, ...],
        columns: Sequence[str],
        indexed: Sequence[str],
    ) -> Arrangement | None:
        """The table's arrangement of ``spec``, made from its copy as it is now in ``con``'s
        transaction when there is none; None when it would exceed the limit."""
        found = self.kept(table, spec)
        if found is not None:
            return found
        if self._refused.get(table) == spec:
            return None
        rows = con.sql(f"SELECT {idents(columns)} FROM {ident(copy_name)}").to_arrow_table()
        others = sum(a.nbytes for a in self._by_table.values())
        indexes = [_index_width(rows.column(c)) for c in indexed]
        if (
            None in indexes
            or others + rows.nbytes + rows.num_rows * (1 + sum(t.cast(int, w) for w in indexes))
            > self.limit
        ):
            self._refused[table] = spec
            return None
        self.touched = True
        made = self._by_table[table] = Arrangement(spec, key, indexed, rows)
        return made

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._by_table.values())

    @property
    def tables(self) -> dict[str, Arrangement]:
        """The arrangements kept now, by table."""
        return dict(self._by_table)


__all__ = ["ARRANGED_BYTES", "Arrangement", "Arrangements", "indexable"]
