"""The DB-API 2.0 cursor (PEP 249): a façade over its connection's session
(`cache.engine.session`), which runs each statement and returns its `Result`; the cursor keeps
the last one and hands out its rows.

``cursor.provenance`` tells, per table access of the last query, where its rows came from;
``cursor.plan`` is the plan the last cached read or EXPLAIN ran with, ``cursor.executed`` what
the last statement sent to PostgreSQL and to DuckDB, ``cursor.statusmessage`` the command
status PostgreSQL would give (as psycopg's).
"""

from __future__ import annotations

import typing as t
from collections.abc import Iterator, Sequence
from pathlib import Path

from cache.dbapi.remote import ServerSession
from cache.engine.boundary import public
from cache.engine.result import Result, no_rows
from cache.engine.session import Session
from cache.execution.provenance import Executed, Provenance
from optimizer.plan import Plan
from sql_ext import errors as _errors
from sql_ext.errors import InterfaceError, ProgrammingError
from sql_ext.params import Params


class _Closable(t.Protocol):
    closed: bool
    cache_path: Path


_NOTHING = no_rows()

# the public methods' edge (cache.engine.boundary), naming this cache file
_public = public(lambda self: self.connection.cache_path, lambda self: self._session.lock)


class Cursor:
    """PEP 249 cursor. ``provenance`` tells, per table access of the last query, where the
    data came from; ``messages`` holds warnings as (class, text) pairs."""

    def __init__(self, connection: _Closable, session: Session | ServerSession) -> None:
        self.connection = connection
        self._session = session
        self.arraysize = 1
        self.closed = False
        self._result: Result = _NOTHING
        self._rows: list[tuple[t.Any, ...]] = []
        self._position = 0
        self.rowcount = -1
        self.messages: list[tuple[type[Warning], str]] = []

    # -- PEP 249 --------------------------------------------------------------------------

    def execute(self, operation: str, parameters: Params = None) -> Cursor:
        # the session serializes the call and gives its errors in the PEP 249 tree
        if self.closed or self.connection.closed:
            self._check_open()
        try:
            self._use(self._session.execute(operation, parameters))
        except BaseException:
            self._use(_NOTHING)  # a failed statement leaves no result behind
            raise
        return self

    @_public
    def executemany(self, operation: str, seq_of_parameters: Sequence[Params]) -> Cursor:
        self._check_open()
        total = 0
        for parameters in seq_of_parameters:
            self.execute(operation, parameters)
            total += max(self.rowcount, 0)
        self._use(no_rows(self._result.status, total))
        return self

    @property
    def description(self) -> list[tuple[t.Any, ...]] | None:
        """Seven items per result column (PEP 249), None when the statement returned no rows."""
        return self._result.description

    @property
    def provenance(self) -> Provenance:
        """Per table access of the last query: where its rows came from. It stays readable
        after the cursor is closed, until the cursor runs another statement."""
        return self._result.provenance

    @property
    def plan(self) -> Plan | None:
        """The plan of the last cached read or EXPLAIN."""
        return self._result.plan

    @property
    def executed(self) -> Executed | None:
        """What the last statement sent to PostgreSQL and to DuckDB."""
        return self._result.executed

    @property
    def statusmessage(self) -> str | None:
        """The last statement's command status, as PostgreSQL gives it (``SELECT 2``)."""
        return self._result.status

    @property
    def result(self) -> Result:
        """The last statement's `Result` (its columns' type OIDs and modifiers, ...)."""
        return self._result

    def fetchone(self) -> tuple[t.Any, ...] | None:
        self._check_result()
        if self._position >= len(self._rows):
            return None
        row = self._rows[self._position]
        self._position += 1
        return row

    def fetchmany(self, size: int | None = None) -> list[tuple[t.Any, ...]]:
        self._check_result()
        count = self.arraysize if size is None else size
        rows = self._rows[self._position : self._position + count]
        self._position += len(rows)
        return rows

    def fetchall(self) -> list[tuple[t.Any, ...]]:
        self._check_result()
        rows = self._rows[self._position :]
        self._position = len(self._rows)
        return rows

    def __iter__(self) -> Iterator[tuple[t.Any, ...]]:
        while (row := self.fetchone()) is not None:
            yield row

    def close(self) -> None:
        self.closed = True
        self._rows = []

    def setinputsizes(self, sizes: t.Any) -> None:
        """PEP 249 lets an implementation ignore size hints; this one does."""

    def setoutputsize(self, size: t.Any, column: int | None = None) -> None:
        """PEP 249 lets an implementation ignore size hints; this one does."""

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state ----------------------------------------------------------------------------

    def _use(self, result: Result) -> None:
        self._result = result
        rows = result.rows
        self._rows = rows if rows is not None else []
        self._position = 0
        self.rowcount = result.rowcount
        notices = result.notices
        self.messages = [(_errors.Warning, notice) for notice in notices] if notices else []

    def _check_open(self) -> None:
        if self.closed:
            raise InterfaceError("the cursor is closed")
        if self.connection.closed:
            raise InterfaceError("the connection is closed")

    def _check_result(self) -> None:
        self._check_open()
        if self._result.rows is None:
            raise ProgrammingError("the last statement returned no rows to fetch")
