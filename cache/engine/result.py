"""What one statement gave (`Session.execute`): a value every front end reads the same way.

Rows are Python values of the types psycopg gives for PostgreSQL's result columns, whichever
engine produced them. ``columns`` names each result column with its PostgreSQL type OID and
type modifier (what PostgreSQL's RowDescription carries); ``description`` is the same as PEP
249's seven-item tuples, as psycopg's ``cursor.description`` gives them. ``status`` is the
command status PostgreSQL would send (``SELECT 3``, ``INSERT 0 1``). ``plan`` is the plan a
cached read or EXPLAIN ran with, ``executed`` what the statement sent to PostgreSQL and to
DuckDB, ``provenance`` per table access where its rows came from, ``notices`` the backend's
notices and the cache's warnings, in order.

Both the description and the provenance are made when first read: most callers never read
them on the hot path.
"""

from __future__ import annotations

import typing as t
from collections.abc import Callable

import psycopg
from psycopg import pq

from cache.backend.describe import ResultShape
from cache.execution.provenance import Executed, Provenance
from optimizer.plan import Plan

Row = tuple[t.Any, ...]
Description = list[tuple[t.Any, ...]]

NO_PROVENANCE = Provenance()


class Column(t.NamedTuple):
    """A result column as PostgreSQL describes it."""

    name: str
    type_oid: int | None  # None: a type PostgreSQL has no OID for (never from the backend)
    type_modifier: int = -1  # -1: none (varchar without a length, numeric without a scale)


class Result:
    """One statement's outcome. ``rows`` is None when the statement returns no rows (an
    INSERT, a SET); ``rowcount`` is -1 when nothing tells it."""

    __slots__ = (
        "_columns",
        "_description",
        "_provenance",
        "_shape",
        "_status",
        "_types_of",
        "executed",
        "notices",
        "plan",
        "rowcount",
        "rows",
    )

    def __init__(
        self,
        rows: list[Row] | None = None,
        description: Description | None = None,
        *,
        shape: ResultShape | None = None,
        types_of: ResultShape | None = None,
        rowcount: int | None = None,
        status: str | None = None,
        plan: Plan | None = None,
        executed: Executed | None = None,
        provenance: Provenance | Callable[[], Provenance] = NO_PROVENANCE,
        notices: list[str] | None = None,
    ) -> None:
        self.rows = rows
        self._description = description
        self._shape = shape  # the backend's result, described when first read
        # PostgreSQL's description of a local answer's statement, whose columns it gives
        self._types_of = types_of
        self._columns: tuple[Column, ...] | None = None
        if rowcount is None:
            rowcount = len(rows) if rows is not None else -1
        self.rowcount = rowcount
        self._status = status
        self.plan = plan
        self.executed = executed
        self._provenance = provenance
        self.notices = notices if notices is not None else []

    @property
    def status(self) -> str | None:
        """The command status PostgreSQL sends (``SELECT 3``, ``INSERT 0 1``)."""
        if self._status is None:
            if self._shape is not None:
                found = self._shape.pgresult.command_status
                self._status = found.decode() if found is not None else None
            elif self.rows is not None:
                self._status = f"SELECT {len(self.rows)}"
        return self._status

    @property
    def returns_rows(self) -> bool:
        return self.rows is not None

    @property
    def description(self) -> Description | None:
        """Seven items per result column (PEP 249), None when the statement returned no rows."""
        if self._description is None and self._shape is not None:
            self._description = self._shape.description()
        return self._description

    @property
    def columns(self) -> tuple[Column, ...] | None:
        """Name, type OID and type modifier per result column (None: no rows returned)."""
        if self._columns is None:
            typed = self._shape or self._types_of
            if typed is not None and self.description is not None:
                names = [d[0] for d in self.description]
                self._columns = tuple(
                    Column(name, oid, mod)
                    for name, (oid, mod) in zip(names, typed.types, strict=True)
                )
            elif self.description is not None:
                self._columns = tuple(Column(d[0], d[1]) for d in self.description)
        return self._columns

    @property
    def described(self) -> t.Any:
        """PostgreSQL's description of the result's columns (a psycopg ``PGresult`` with
        their names, types, tables and column numbers), when the backend gave one."""
        shape = self._shape or self._types_of
        return shape.pgresult if shape is not None else None

    def set_provenance(self, provenance: Provenance | Callable[[], Provenance]) -> None:
        """The provenance, or how to make it when first read."""
        self._provenance = provenance

    @property
    def lineage(self) -> Provenance | Callable[[], Provenance]:
        """The provenance, or how to make it: what a session keeps of its last statement
        (never its rows)."""
        return self._provenance

    @property
    def provenance(self) -> Provenance:
        """Per table access of the statement: where its rows came from."""
        found = self._provenance
        if not isinstance(found, Provenance):
            found = self._provenance = found()
        return found


# psycopg's test for "the statement returned rows" (Cursor.description), on a result
_ROW_STATUSES = frozenset(
    (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.SINGLE_TUPLE, pq.ExecStatus.TUPLES_CHUNK)
)


def of_cursor(
    cur: psycopg.Cursor[t.Any],
    *,
    executed: Executed | None = None,
    notices: list[str] | None = None,
) -> Result:
    """The result of the statement a psycopg cursor just ran (its rows fetched)."""
    found = cur.pgresult
    if found is not None and (found.nfields or found.status in _ROW_STATUSES):
        rows = cur.fetchall()  # psycopg rows are tuples already
        return Result(rows, shape=ResultShape(found, cur), executed=executed, notices=notices)
    return no_rows(cur.statusmessage, cur.rowcount, notices, executed)


def no_rows(
    status: str | None = None,
    rowcount: int = -1,
    notices: list[str] | None = None,
    executed: Executed | None = None,
) -> Result:
    """The result of a statement that returns no rows."""
    return Result(None, None, rowcount=rowcount, status=status, notices=notices, executed=executed)
