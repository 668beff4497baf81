"""The PEP 249 exception tree of mtcache, and the mapping of driver errors into it.

    Warning
    Error
     +-- InterfaceError
     +-- DatabaseError
          +-- DataError
          +-- OperationalError
          |    +-- BackendUnavailableError   the PostgreSQL backend cannot be reached
          |    +-- EmbeddedBackendError      the private PostgreSQL cluster cannot be set up
          +-- IntegrityError
          +-- InternalError
          +-- ProgrammingError
          |    +-- PositionedError           about a place in the statement (line, col)
          |         +-- SqlSyntaxError       malformed SQL, currency clause or cache DDL
          |         +-- CatalogError         an unknown table, view or column
          +-- NotSupportedError

Every message says what was asked, what was found, and what to do. Errors from psycopg and
DuckDB are re-raised as the class of the same name here (`translate`), so an application catches
one tree whichever engine answered.
"""

from __future__ import annotations

import builtins


class Warning(builtins.Warning):
    """Important warnings, e.g. stale local data returned under ``stale_ok``."""


class Error(Exception):
    """Base class of every mtcache error."""


class InterfaceError(Error):
    """Misuse of the DB-API interface itself (a closed cursor, a bad argument)."""


class DatabaseError(Error):
    """Errors related to the database: the cache or the backend."""


class DataError(DatabaseError):
    """Problems with processed data: division by zero, a value out of range."""


class OperationalError(DatabaseError):
    """Errors outside the application's control: backend down, data too stale, a cluster setup."""


class IntegrityError(DatabaseError):
    """A constraint of the backend was violated."""


class InternalError(DatabaseError):
    """The cache found itself in an inconsistent state."""


class ProgrammingError(DatabaseError):
    """Malformed SQL, unknown names, wrong parameter counts, unsafe cache schemas."""


class NotSupportedError(DatabaseError):
    """A feature the cache or the backend does not support."""


class PositionedError(ProgrammingError):
    """A ProgrammingError about a place in the statement: ``line`` and ``col`` are 1-based and
    point at the start of the offending token; ``reason`` is the message without them."""

    def __init__(self, message: str, line: int | None = None, col: int | None = None) -> None:
        self.line = line
        self.col = col
        self.reason = message
        where = f"line {line}, column {col}: " if line is not None and col is not None else ""
        super().__init__(f"{where}{message}")


class SqlSyntaxError(PositionedError):
    """A statement (SQL, currency clause, cache DDL or TIMEORDERED) that does not parse or check."""


class CatalogError(PositionedError):
    """A name the backend's catalog does not know."""


class BackendUnavailableError(OperationalError):
    """The PostgreSQL backend could not be reached."""


class EmbeddedBackendError(OperationalError):
    """The private PostgreSQL cluster could not be created, started or stopped."""


def first_line(exc: BaseException) -> str:
    """An exception's first line, for one-line messages that embed a driver's error."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


_DBAPI_NAMES = (
    "NotSupportedError",
    "ProgrammingError",
    "InternalError",
    "IntegrityError",
    "OperationalError",
    "DataError",
    "DatabaseError",
    "InterfaceError",
)


def translate(exc: BaseException, context: str = "") -> Error:
    """Return the mtcache error for a psycopg or DuckDB exception (most specific class first).

    Both drivers define the PEP 249 classes by the same names, so the class name decides. The
    original exception is kept as ``__cause__`` by ``raise translate(e) from e``.
    """
    prefix = f"{context}: " if context else ""
    text = str(exc).strip() or type(exc).__name__
    for klass in type(exc).__mro__:
        if klass.__name__ in _DBAPI_NAMES:
            return globals()[klass.__name__](prefix + text)  # type: ignore[no-any-return]
    return DatabaseError(prefix + text)


__all__ = [
    "BackendUnavailableError",
    "CatalogError",
    "DataError",
    "DatabaseError",
    "EmbeddedBackendError",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "NotSupportedError",
    "OperationalError",
    "PositionedError",
    "ProgrammingError",
    "SqlSyntaxError",
    "Warning",
    "first_line",
    "translate",
]
