"""A batch's changes to one table staged for DuckDB: the keys touched and the final rows, in
the typed form a pull gives, through the CSV reader a pull's rows go through
(`stage_changes`)."""

from __future__ import annotations

import contextlib
import typing as t
from collections.abc import Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cache.backend.copy_arrow import read_texts
from cache.backend.pgoutput.rows import RowChanges
from cache.maintenance.stream.position import StreamProblem
from control_tables.schema import CachedView
from control_tables.types import BPCHAR, NUMBERED, numbered, transfer_type
from sql_ext.catalog import Catalog


class Staged:
    """One table's batch: the keys touched and the final rows, typed as the cache stores
    them, registered in DuckDB as ``mtcache_del_<table>`` and ``mtcache_put_<table>``."""

    def __init__(self, con_name: str):
        self.name = con_name
        self.count = 0
        self.dels: pa.Table | None = None
        self.puts: pa.Table | None = None

    @property
    def del_name(self) -> str:
        return f"mtcache_del_{self.name}"

    @property
    def put_name(self) -> str:
        return f"mtcache_put_{self.name}"

    def register(self, con: duckdb.DuckDBPyConnection) -> None:
        assert self.dels is not None and self.puts is not None
        con.register(self.del_name, self.dels)
        con.register(self.put_name, self.puts)

    def close(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.dels is not None:
            with contextlib.suppress(duckdb.Error):
                con.unregister(self.del_name)
                con.unregister(self.put_name)


def stage_changes(
    readers: Sequence[CachedView],
    catalog: Catalog,
    table_name: str,
    changes: list[tuple[np.ndarray, RowChanges]],
) -> Staged:
    """The changes to one table (each `RowChanges` with its changes' positions in the batch),
    with the columns its ``readers`` keep (continuously maintained views of it, and derived
    views' copies of it): every key touched, and each key's row after its last change (none
    if that deleted it), typed as a pull types them. Set-based: one event per tuple sent, the
    last per key kept (Arrow's ordered grouping)."""
    table = catalog.table(table_name)
    assert table is not None
    wanted: list[str] = []
    for view in readers:
        wanted += [c for c in view.columns if c not in wanted]
    types = {c.name: c.type for c in table.columns}
    columns = [(c, t.cast(str, transfer_type(types[c]))) for c in wanted]
    stage = Staged(str(len(table_name)) + "_" + "".join(ch for ch in table_name if ch.isalnum()))
    count = sum(len(at) for at, _ in changes)
    if not count:
        return stage
    key = list(table.primary_key)
    transfer = dict(columns)
    key_columns = [(k, transfer.get(k) or t.cast(str, transfer_type(types[k]))) for k in key]
    carried = [*key, *(c for c in wanted if c not in key)]
    events = []
    for at, rows in changes:
        names = [c.name for c in rows.relation.columns]
        missing = [c for c in carried if c not in names]
        if missing:
            relation = rows.relation
            raise StreamProblem(
                f"table {relation.schema}.{relation.name} has no column {', '.join(missing)} "
                "any more: continuous maintenance stopped; recreate the cached views of that "
                "table (DROP CACHED VIEW, CREATE CACHED VIEW)"
            )
        if rows.has_old.any():  # the row of the old key leaves (a new tuple may bring it back)
            old = pa.array(rows.has_old)
            events.append(
                _event(
                    rows.old.select(key).filter(old),
                    at[rows.has_old] * 2,
                    alive=False,
                    unchanged={},
                )
            )
        new = pa.array(rows.has_new)
        unchanged = {c: m[rows.has_new] for c, m in rows.unchanged.items() if c in wanted}
        events.append(
            _event(
                rows.new.select(carried).filter(new),
                at[rows.has_new] * 2 + 1,
                alive=True,
                unchanged=unchanged,
            )
        )
    ordered = pa.concat_tables(events, promote_options="default").sort_by(_SEQ)
    flagged = [c for c in wanted if FLAG + c in ordered.column_names]
    if flagged:
        final = _merged(ordered, key, carried, flagged)
    else:
        final = ordered.take(_last_per_key(ordered, key))
    stage.count = count
    stage.dels = _typed(final, key_columns)
    puts = final.filter(final.column(_ALIVE))
    stage.puts = _typed(puts, columns)
    for name in flagged:
        stage.puts = stage.puts.append_column(FLAG + name, puts.column(FLAG + name))
    return stage


_SEQ, _ALIVE = "mtcache_seq", "mtcache_alive"
FLAG = "mtcache_unchanged_"  # a column of the final rows: the value was not sent (TOASTed)


def _last_per_key(ordered: pa.Table, key: list[str]) -> np.ndarray:
    """The row of each key's last event (``ordered``: events in order): keys numbered by
    Arrow's dictionary encoding, the last of each number found by numpy."""
    codes: np.ndarray | None = None
    for name in key:
        column = ordered.column(name).combine_chunks()
        if column.null_count:
            raise StreamProblem(
                f"a change without its key's value (column {name}): continuous "
                "maintenance stopped; recreate the cached views of that table "
                "(DROP CACHED VIEW, CREATE CACHED VIEW)"
            )
        encoded = pc.dictionary_encode(column)
        numbers = encoded.indices.to_numpy().astype(np.int64)
        if codes is not None:  # (numbered again: the products stay small)
            numbers = np.unique(codes * len(encoded.dictionary) + numbers, return_inverse=True)[1]
        codes = numbers
    assert codes is not None
    _, first = np.unique(codes[::-1], return_index=True)  # the last, counted from the end
    return len(codes) - 1 - first


def _event(
    values: pa.Table, seq: np.ndarray, alive: bool, unchanged: dict[str, np.ndarray]
) -> pa.Table:
    events = values.append_column(_SEQ, pa.array(seq)).append_column(
        _ALIVE, pa.array(np.full(len(seq), alive))
    )
    for name, mask in unchanged.items():
        events = events.append_column(FLAG + name, pa.array(mask))
    return events


def _merged(ordered: pa.Table, key: list[str], carried: list[str], flagged: list[str]) -> pa.Table:
    """Each key's row after its last change when some updates did not send a TOASTed value:
    row by row, the value the key's previous change in the batch brought, else still
    unsent (flagged: the cached copy supplies it, `apply_view`)."""
    final: dict[tuple[t.Any, ...], dict[str, t.Any] | None] = {}
    for event in ordered.to_pylist():
        k = tuple(event[c] for c in key)
        if not event[_ALIVE]:
            final[k] = None
            continue
        row = {c: event[c] for c in carried}
        row[_ALIVE] = True
        previous = final.get(k)
        for name in flagged:
            sent = not event.get(FLAG + name)
            if not sent and previous is not None:
                row[name], row[FLAG + name] = previous[name], previous[FLAG + name]
            else:
                row[FLAG + name] = not sent
        final[k] = row
    rows = [dict(zip(key, k, strict=True)) | (r or {_ALIVE: False}) for k, r in final.items()]
    types = {
        **{c: pa.large_string() for c in carried},
        _ALIVE: pa.bool_(),
        **{FLAG + c: pa.bool_() for c in flagged},
    }
    return pa.Table.from_pylist(rows, schema=pa.schema(types))


def _typed(texts: pa.Table, columns: list[tuple[str, str]]) -> pa.Table:
    """PostgreSQL text values typed as a pull's rows are, from the text form a pull sends
    (`_text_form`)."""
    forms = texts.select([name for name, _ in columns])
    for index, (name, kind) in enumerate(columns):
        forms = forms.set_column(index, name, _text_form(name, kind, forms.column(name)))
    return read_texts(forms, columns)


def _text_form(column: str, kind: str, values: pa.ChunkedArray) -> pa.ChunkedArray:
    """Values of the stream in the form a pull sends (control_tables.types.select_list):
    char(n) without its padding, dates and times as numbers (`control_tables.types.NUMBERED`),
    read from the text PostgreSQL wrote."""
    if kind == BPCHAR:
        return pc.utf8_rtrim(values, characters=" ")
    if kind in NUMBERED:
        try:
            return pa.chunked_array(
                [
                    pa.array(
                        [None if v is None else str(numbered(kind, v)) for v in values.to_pylist()],
                        pa.large_string(),
                    )
                ]
            )
        except ValueError as exc:
            raise StreamProblem(f"column {column}: {exc}") from None
    return values
