"""The edge of the public API, one call at a time per connection (threads may share a
connection, as with psycopg: their calls are serialized by the connection's lock). Whatever
goes wrong below it leaves as an error of the PEP 249 tree (`sql_ext.errors`). Errors of the
tree pass unchanged; text that is not valid UTF-8 is a `DataError`; DuckDB's and psycopg's
errors are translated (a damaged cache file says so and what to do); anything else is a bug,
raised as an `InternalError` that names it (its traceback stays on ``__cause__``). A read
(`cache.engine.read`), which its driver runs one step at a time, has its errors translated the
same way (`public_read`)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import typing as t
from pathlib import Path

import duckdb
import psycopg

from cache.store.cache_file import damaged
from sql_ext.errors import (
    DataError,
    Error,
    InternalError,
    ProgrammingError,
    first_line,
    too_deep,
    translate,
)

F = t.TypeVar("F", bound=t.Callable[..., t.Any])
T = t.TypeVar("T")


def public(
    cache_path: t.Callable[[t.Any], Path],
    lock: t.Callable[[t.Any], threading.RLock | None],
) -> t.Callable[[F], F]:
    """Decorate a public method: ``cache_path(self)`` names the cache file in messages;
    ``lock(self)`` is held for the call (None: not yet made, while constructing)."""

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def wrapper(self: t.Any, *args: t.Any, **kwargs: t.Any) -> t.Any:
            held = lock(self)
            try:
                with held if held is not None else contextlib.nullcontext():
                    return method(self, *args, **kwargs)
            except Error:
                raise
            except TypeError as exc:
                misfit = _misfit(method, self, args, kwargs)
                raise misfit or api_error(exc, cache_path(self)) from exc
            except Exception as exc:
                raise api_error(exc, cache_path(self)) from exc

        return t.cast(F, wrapper)

    return decorate


def public_read(read: t.Generator[None, None, T], path: Path) -> t.Generator[None, None, T]:
    """A read (`cache.engine.read`) whose errors leave as a public method's."""
    try:
        return (yield from read)
    except Error:
        raise
    except Exception as exc:
        raise api_error(exc, path) from exc


def _misfit(
    method: t.Callable[..., t.Any], self: t.Any, args: tuple[t.Any, ...], kwargs: dict[str, t.Any]
) -> ProgrammingError | None:
    """The caller's error when the call itself does not fit the method's parameters (a
    misspelled option, a missing argument), else None: the TypeError came from below."""
    try:
        inspect.signature(method).bind(self, *args, **kwargs)
    except TypeError as exc:
        name = getattr(method, "__qualname__", "the call").replace(".__init__", "")
        return ProgrammingError(f"{name}(): {exc}")
    return None


def api_error(exc: Exception, path: Path) -> Error:
    """The PEP 249 error for an exception that reached the API's edge."""
    if isinstance(exc, UnicodeError):
        return DataError(
            f"text that is not valid UTF-8 ({first_line(exc)}): statements, parameters and "
            "names must be valid Unicode without lone surrogates"
        )
    if isinstance(exc, RecursionError):
        return too_deep()
    if isinstance(exc, duckdb.Error):
        return damaged(exc, path) or translate(exc, f"the cache file {path}")
    if isinstance(exc, psycopg.Error):
        return translate(exc)
    return InternalError(
        f"internal error ({type(exc).__name__}: {first_line(exc)}): this is a bug in mtcache; "
        "please report it with the statement that caused it"
    )
