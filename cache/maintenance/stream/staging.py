"""A batch's changes to one table staged for DuckDB: the keys touched and the final rows, in
the typed form a pull gives, through CSV and DuckDB's reader (`stage`)."""

from __future__ import annotations

import contextlib
import io
import operator
import typing as t
from collections.abc import Callable, Iterable, Sequence

import duckdb
import pyarrow as pa

from cache.backend.copy_arrow import read_csv
from cache.backend.pgoutput import (
    UNCHANGED,
    Relation,
)
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
    readers: Sequence[CachedView], catalog: Catalog, table_name: str,
    changes: list[tuple[Relation, t.Any]],
) -> Staged:
    """The changes to one table, with the columns its ``readers`` keep (continuously
    maintained views of it, and derived views' copies of it)."""
    table = catalog.table(table_name)
    assert table is not None
    wanted: list[str] = []
    for view in readers:
        wanted += [c for c in view.columns if c not in wanted]
    types = {c.name: c.type for c in table.columns}
    columns = [(c, t.cast(str, transfer_type(types[c]))) for c in wanted]
    stage = Staged(str(len(table_name)) + "_" + "".join(ch for ch in table_name if ch.isalnum()))
    if not changes:
        return stage
    final: dict[tuple[t.Any, ...], tuple[t.Any, ...] | None] = {}
    touched: dict[tuple[t.Any, ...], None] = {}  # keys in the stream's text form
    transfer = dict(columns)
    key_columns = [(k, transfer.get(k) or t.cast(str, transfer_type(types[k])))
                   for k in table.primary_key]  # fmt: skip
    getters: dict[int, tuple[Callable[[t.Any], tuple[t.Any, ...]], ...]] = {}
    for relation, change in changes:
        got = getters.get(id(relation))
        if got is None:
            names = [c.name for c in relation.columns]
            missing = [c for c in [*table.primary_key, *(c for c, _ in columns)]
                       if c not in names]  # fmt: skip
            if missing:
                raise StreamProblem(
                    f"table {relation.schema}.{relation.name} has no column "
                    f"{', '.join(missing)} any more: continuous maintenance stopped; recreate "
                    "the cached views of that table (DROP CACHED VIEW, CREATE CACHED VIEW)"
                )
            got = getters[id(relation)] = (
                _picker([names.index(k) for k in table.primary_key]),
                _picker([names.index(c) for c, _ in columns]),
            )
        key_of, row_of = got
        if change.old is not None:
            old_key = key_of(change.old)
            touched[old_key] = None
            final[old_key] = None
        new = change.new
        if new is not None:
            key, row = key_of(new), row_of(new)
            previous = final.get(key)
            if previous is not None and UNCHANGED in row:
                row = tuple(p if v is UNCHANGED else v for v, p in zip(row, previous, strict=True))
            touched[key] = None
            final[key] = row
    stage.count = len(changes)
    stage.dels = read_csv(_csv(touched, key_columns), key_columns)
    rows = [r for r in final.values() if r is not None]
    if any(UNCHANGED in r for r in rows):
        # a TOASTed value the update did not send: the row's cached copy has it, else a pull
        flags = [[v is UNCHANGED for v in r] for r in rows]
        rows = [tuple(None if v is UNCHANGED else v for v in r) for r in rows]
        puts = read_csv(_csv(rows, columns), columns)
        for index, (name, _) in enumerate(columns):
            puts = puts.append_column(f"mtcache_unchanged_{name}",
                                      pa.array([f[index] for f in flags]))  # fmt: skip
        stage.puts = puts
    else:
        stage.puts = read_csv(_csv(rows, columns), columns)
    return stage


def _picker(indexes: list[int]) -> Callable[[t.Any], tuple[t.Any, ...]]:
    if len(indexes) == 1:
        (only,) = indexes
        return lambda row: (row[only],)
    return operator.itemgetter(*indexes)


def _text_form(column: str, kind: str) -> Callable[[t.Any], t.Any]:
    """A value of the stream in the form a pull sends (control_tables.types.select_list):
    char(n) without its padding, dates and times as numbers (`control_tables.types.NUMBERED`),
    read from the text PostgreSQL wrote."""
    if kind == BPCHAR:
        return lambda v: v.rstrip(" ") if isinstance(v, str) else v
    if kind in NUMBERED:

        def number(value: t.Any) -> t.Any:
            if not isinstance(value, str):
                return value
            try:
                return str(numbered(kind, value))
            except ValueError as exc:
                raise StreamProblem(f"column {column}: {exc}") from None

        return number
    return lambda v: v


def _csv(rows: Iterable[tuple[t.Any, ...]], columns: list[tuple[str, str]]) -> bytes:
    """PostgreSQL text values as the CSV `read_csv` reads a pull's rows from (NULL unquoted
    and empty, every other value quoted), in the text form a pull sends (`_text_form`)."""
    forms = [(i, _text_form(c, kind)) for i, (c, kind) in enumerate(columns)
             if kind == BPCHAR or kind in NUMBERED]  # fmt: skip
    out = io.StringIO()
    write = out.write
    for row in rows:
        values = list(row) if forms else row
        for index, form in forms:
            values[index] = form(values[index])  # type: ignore[index]
        write(",".join("" if v is None else '"' + v.replace('"', '""') + '"' for v in values))
        write("\n")
    return out.getvalue().encode()
