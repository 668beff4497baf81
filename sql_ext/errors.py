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
one tree whichever engine answered. A backend error keeps PostgreSQL's ``sqlstate`` and ``diag``
(as psycopg's errors do), and its class follows the SQLSTATE (``psycopg.errors.lookup``): a
unique violation is an `IntegrityError`, a lost connection a `BackendUnavailableError`.

This module sits in the lowest layer (sql_ext), so every package can raise these errors without
importing the DB-API; `cache` re-exports them.
"""

from __future__ import annotations

import builtins
import contextlib
import sys
import typing as t

T = t.TypeVar("T")


class Warning(builtins.Warning):
    """Important warnings, e.g. stale local data returned under ``stale_ok``."""


class Error(Exception):
    """Base class of every mtcache error. ``sqlstate`` and ``diag`` are PostgreSQL's for an
    error the backend raised (None otherwise), as on psycopg's errors."""

    sqlstate: str | None = None
    diag: t.Any = None


class InterfaceError(Error):
    """Misuse of the DB-API interface itself (a closed cursor, a bad argument)."""


class DatabaseError(Error):
    """Errors related to the database: the cache or the backend."""


class DataError(DatabaseError):
    """Problems with processed data: division by zero, a value out of range."""


class OperationalError(DatabaseError):
    """Errors outside the application's control: backend down, data too stale, a cluster setup."""


class QueryCanceledError(OperationalError):
    """The statement was cancelled (a CancelRequest, or the server shutting down)."""

    def __init__(self, message: str = "canceling statement due to user request") -> None:
        super().__init__(message)


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


def offset_position(text: str, offset: int) -> tuple[int, int]:
    """(line, column), 1-based, of a character offset in ``text``."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


class SqlSyntaxError(PositionedError):
    """A statement (SQL, currency clause, cache DDL or TIMEORDERED) that does not parse or check."""


class CatalogError(PositionedError):
    """A name the backend's catalog does not know; ``relation``: for a table reference, the
    name as the statement gives it (`Source.written`) and as SQL writes it (quoted)."""

    relation: tuple[str, str] | None = None


class BackendUnavailableError(OperationalError):
    """The PostgreSQL backend could not be reached."""


class EmbeddedBackendError(OperationalError):
    """The private PostgreSQL cluster could not be created, started or stopped."""


# sqlglot parses and prints SQL by recursion, about 20 Python frames per level of nesting, so
# the interpreter's default limit (1000) refuses 50 nested parentheses that PostgreSQL accepts.
# Importing sql_ext raises the limit (never lowers it) to allow about 1,000 levels; Python
# calls since 3.11 do not grow the C stack, so this is safe on threads' default stacks.
RECURSION_LIMIT = 25_000


def allow_deep_statements() -> None:
    if sys.getrecursionlimit() < RECURSION_LIMIT:
        sys.setrecursionlimit(RECURSION_LIMIT)


def too_deep() -> ProgrammingError:
    """The error for a statement whose nesting exhausted the recursion limit."""
    return ProgrammingError(
        "the statement is nested too deeply (about 1,000 levels of parentheses, operators or "
        "subqueries are supported): flatten it, e.g. a long OR of equalities as IN (...)"
    )


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

# SQLSTATEs that mean the session is gone or cannot be had: connection exceptions (class 08)
# and the server shutting down or starting up.
_CONNECTION_LOST = ("08", "57P01", "57P02", "57P03")


def interrupted(exc: BaseException) -> bool:
    """DuckDB's error after an interrupt() (a cancel, a statement timeout)."""
    return type(exc).__name__ == "InterruptException"


def translate(exc: BaseException, context: str = "", *, unreachable: str = "") -> Error:
    """The mtcache error for a psycopg or DuckDB exception (most specific class first), to be
    raised ``from exc``. ``context`` prefixes the message. A backend connection that is lost or
    cannot be had becomes a `BackendUnavailableError` whose message ends with ``unreachable``
    (what that stops, and what to do)."""
    if isinstance(exc, Error):
        return exc
    if interrupted(exc):
        return QueryCanceledError()
    prefix = f"{context}: " if context else ""
    text = str(exc).strip() or type(exc).__name__
    sqlstate = getattr(exc, "sqlstate", None)
    klass: type = type(exc)
    if sqlstate and _is_psycopg(exc):
        from psycopg import errors as pg_errors  # loaded already: exc is one of its errors

        # a SQLSTATE psycopg does not know keeps the class it raised
        with contextlib.suppress(KeyError):
            klass = pg_errors.lookup(sqlstate)
    name = next((k.__name__ for k in klass.__mro__ if k.__name__ in _DBAPI_NAMES), None)
    error: Error
    if name == "OperationalError" and connection_lost(exc):
        consequence = f"; {unreachable}" if unreachable else ""
        error = BackendUnavailableError(
            f"{prefix}the backend is unreachable ({first_line(exc)}){consequence}"
        )
    else:
        error = globals()[name or "DatabaseError"](prefix + text)
    if _is_psycopg(exc):
        error.sqlstate = sqlstate
        error.diag = getattr(exc, "diag", None)
    return error


def translating(action: t.Callable[[], T]) -> T:
    """``action()``, a driver error it raises raised as the mtcache error `translate` makes
    of it."""
    try:
        return action()
    except Error:
        raise
    except Exception as exc:
        if not _is_psycopg(exc):
            raise
        raise translate(exc) from exc


def _is_psycopg(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("psycopg")


def connection_lost(exc: BaseException) -> bool:
    """A psycopg OperationalError without SQLSTATE (the client lost or could not open the
    connection), or with one that says the session is gone."""
    if not (_is_psycopg(exc) and any(k.__name__ == "OperationalError" for k in type(exc).__mro__)):
        return False
    sqlstate = getattr(exc, "sqlstate", None)
    return not sqlstate or sqlstate.startswith(_CONNECTION_LOST)


# The SQLSTATE an error of the cache's own carries on the wire, by class (most specific first);
# a backend error keeps the one PostgreSQL gave.
_SQLSTATES: tuple[tuple[type, str], ...] = (
    (SqlSyntaxError, "42601"),  # syntax_error
    (CatalogError, "42P01"),  # undefined_table (42703 for a column, below)
    (ProgrammingError, "42000"),  # syntax_error_or_access_rule_violation
    (NotSupportedError, "0A000"),  # feature_not_supported
    (BackendUnavailableError, "08006"),  # connection_failure
    (QueryCanceledError, "57014"),  # query_canceled
    (EmbeddedBackendError, "58000"),  # system_error
    (OperationalError, "55000"),  # object_not_in_prerequisite_state: data too stale, ...
    (DataError, "22000"),
    (IntegrityError, "23000"),
    (InterfaceError, "08003"),  # connection_does_not_exist
    (Error, "XX000"),
)

_DIAG_FIELDS = (
    ("severity", "severity"),
    ("severity_nonlocalized", "severity_nonlocalized"),
    ("sqlstate", "sqlstate"),
    ("message", "message_primary"),
    ("detail", "message_detail"),
    ("hint", "message_hint"),
    ("position", "statement_position"),
    ("internal_position", "internal_position"),
    ("internal_query", "internal_query"),
    ("context", "context"),
    ("schema", "schema_name"),
    ("table", "table_name"),
    ("column", "column_name"),
    ("datatype", "datatype_name"),
    ("constraint", "constraint_name"),
    ("file", "source_file"),
    ("line", "source_line"),
    ("routine", "source_function"),
)


def diag_fields(diag: t.Any) -> list[tuple[str, str]]:
    """The fields of a psycopg ``Diagnostic`` (an error's or a notice's), as `diagnostics`
    names them."""
    return [
        (name, str(value))
        for name, attribute in _DIAG_FIELDS
        if (value := getattr(diag, attribute, None)) is not None
    ]


def diagnostics(exc: BaseException, statement: str | None = None) -> list[tuple[str, str]]:
    """An error as PostgreSQL's error fields, (name, value) in protocol order: every field
    the backend sent for one of its errors; SQLSTATE by class, message and position (a
    1-based character offset in ``statement``) for one of the cache's own."""
    diag = getattr(exc, "diag", None)
    if diag is not None and getattr(diag, "sqlstate", None):
        return diag_fields(diag)
    own = getattr(exc, "sqlstate", None)
    if isinstance(exc, Error) or _is_psycopg(exc) or isinstance(own, str):
        sqlstate = own or next(
            (code for klass, code in _SQLSTATES if isinstance(exc, klass)), "XX000"
        )
        if isinstance(exc, CatalogError) and exc.relation is None:
            sqlstate = "42703"  # undefined_column
        text = exc.reason if isinstance(exc, PositionedError) else first_line(exc)
    else:
        sqlstate, text = "XX000", f"internal error in the cache: {first_line(exc)}"
    fields = [
        ("severity", "ERROR"),
        ("severity_nonlocalized", "ERROR"),
        ("sqlstate", sqlstate),
        ("message", text),
    ]
    if isinstance(exc, PositionedError) and statement is not None and exc.line is not None:
        lines = statement.split("\n")
        if exc.line <= len(lines):
            offset = sum(len(line) + 1 for line in lines[: exc.line - 1]) + (exc.col or 1)
            fields.append(("position", str(offset)))
    return fields


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
    "QueryCanceledError",
    "SqlSyntaxError",
    "Warning",
    "connection_lost",
    "diag_fields",
    "diagnostics",
    "first_line",
    "interrupted",
    "translate",
    "translating",
]
