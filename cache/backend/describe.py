"""What a statement returns, as PostgreSQL says: its result columns' names, types
and type modifiers. A local answer is given exactly these (`cache.execution.convert`): the
same `cursor.description`, and values of the Python types psycopg gives for them.

`describe_result` asks the backend without running the statement (the extended protocol's
Describe of an unnamed prepared statement, `describe_statement`, the parameters of a first
execution bound);
`ResultShape` also carries a result the backend did return, so its description is built only
when read.
"""

from __future__ import annotations

import typing as t

import psycopg
from psycopg import pq
from psycopg._queries import _split_query  # psycopg's reading of % marks (no public one)

from cache.backend.pool import pooled
from optimizer.describe_result import ResultColumn
from sql_ext.params import Params


class ResultShape:
    """A backend result's columns. psycopg.Column reads exactly these attributes of a cursor,
    frozen here at one result (a psycopg cursor is reused by the next statement)."""

    __slots__ = ("_encoding", "adapters", "pgresult")

    pgresult: pq.abc.PGresult | DescribedColumns  # (the backend's, or one described here)

    def __init__(self, result: pq.abc.PGresult, cursor: psycopg.Cursor[t.Any]) -> None:
        self.pgresult = result
        self._encoding = cursor._encoding
        self.adapters = cursor.adapters

    def description(self) -> list[tuple[t.Any, ...]]:
        """Seven items per column (PEP 249), as psycopg's cursor.description gives them."""
        columns = (psycopg.Column(t.cast(t.Any, self), i) for i in range(self.pgresult.nfields))
        return [
            (c.name, c.type_code, c.display_size, c.internal_size, c.precision, c.scale, c.null_ok)
            for c in columns
        ]

    @property
    def types(self) -> tuple[tuple[int, int], ...]:
        """(type OID, type modifier) per column."""
        result = self.pgresult
        return tuple((result.ftype(i), result.fmod(i)) for i in range(result.nfields))


class DescribedColumns:
    """A result's columns as a ``PGresult`` gives them (what psycopg's ``Column`` and a
    RowDescription read), from a description worked out without the backend
    (`optimizer.describe_result`)."""

    __slots__ = ("_columns",)

    def __init__(self, columns: t.Sequence[ResultColumn]) -> None:
        self._columns = tuple(columns)

    @property
    def nfields(self) -> int:
        return len(self._columns)

    def fname(self, index: int) -> bytes:
        return self._columns[index].name.encode()

    def ftype(self, index: int) -> int:
        return self._columns[index].type_oid

    def fmod(self, index: int) -> int:
        return self._columns[index].type_modifier

    def fsize(self, index: int) -> int:
        return self._columns[index].size

    def ftable(self, index: int) -> int:
        return self._columns[index].table_oid

    def ftablecol(self, index: int) -> int:
        return self._columns[index].column_number

    def fformat(self, index: int) -> int:
        return 0

    command_status = None  # (a description, not a statement's outcome)


def described_here(columns: t.Sequence[ResultColumn]) -> ResultShape:
    """A result shape from a description the cache worked out itself."""
    shape = ResultShape.__new__(ResultShape)
    shape.pgresult = DescribedColumns(columns)
    shape._encoding = "utf-8"
    shape.adapters = psycopg.adapters
    return shape


def dollar_text(sql: str) -> str:
    """The text of a statement executed with parameters, its placeholders (``%s``,
    ``%(name)s``) written as PostgreSQL's ``$n``, as psycopg sends it (``%%``: one ``%``)."""
    *marked, tail = _split_query(sql.encode(), "utf-8")  # (each part ends at a mark)
    numbers: dict[int | str, int] = {}
    out = []
    for part in marked:
        out.append(part.pre.decode())
        out.append(f"${numbers.setdefault(part.item, len(numbers) + 1)}")
    out.append(tail.pre.decode())
    return "".join(out)


def describe_result(dsn: str, sql: str, params: Params) -> ResultShape | None:
    """The result shape of a query on the backend (None if it will not describe it)."""
    with pooled(dsn) as conn:
        cursor = psycopg.ClientCursor(conn)
        try:
            bound = cursor.mogrify(sql, params)  # type: ignore[arg-type]
        except psycopg.Error:
            return None
        described = describe_statement(conn, bound.encode(conn.info.encoding))
        if described.status != pq.ExecStatus.COMMAND_OK:
            return None
        return ResultShape(described, cursor)


def describe_statement(
    conn: psycopg.Connection[t.Any], sql: bytes, param_types: t.Sequence[int] = ()
) -> pq.abc.PGresult:
    """The backend's Describe of a statement (``$n`` parameters of these types, 0: to
    infer) as the unnamed prepared statement: its parameter types and result columns, or
    the error result that refused it."""
    pgconn = conn.pgconn
    prepared = pgconn.prepare(b"", sql, param_types or None)
    if prepared.status != pq.ExecStatus.COMMAND_OK:
        return prepared
    return pgconn.describe_prepared(b"")
