"""The cache's own session settings, ``mtcache.<name>``: what ``SET mtcache.name = value``,
``SHOW mtcache.name`` and ``RESET mtcache.name`` read and write (on a connection of the cache
server, also the startup option ``-c mtcache.name=value``), each a named value of the session
with a reader of its text and a printer for SHOW. PostgreSQL's own settings are the backend's
and pass through to it.
"""

from __future__ import annotations

import datetime as dt
import math
import typing as t
from collections.abc import Callable
from dataclasses import dataclass

from cache.defaults import ENGINES
from cache.engine.engine import bound_seconds
from cache.maintenance.spark import check_master_url
from sql_ext.errors import ProgrammingError
from sql_ext.nodes import format_duration

PREFIX = "mtcache."

_TRUE = frozenset({"on", "true", "yes", "1", "t", "y"})
_FALSE = frozenset({"off", "false", "no", "0", "f", "n"})


@dataclass(frozen=True)
class Setting:
    name: str  # without the prefix
    attribute: str  # the session's attribute that holds it
    read: Callable[[str, str], t.Any]  # (text, full name) -> the value
    show: Callable[[t.Any], str]
    help: str
    writable: bool = True  # False: SHOW only


def _flag(text: str, name: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ProgrammingError(f'parameter "{name}" requires a Boolean value (on or off), not {text!r}')


def _bound(text: str, name: str) -> float | None:
    """A duration as in a clause ('10 min'), or a number of seconds; none: no bound."""
    word = text.strip().lower()
    if word in ("none", "default", ""):
        return None
    try:
        seconds = float(word)
    except ValueError:
        return bound_seconds(text, name)
    if not math.isfinite(seconds):
        raise ProgrammingError(f"{name} must be a finite duration, not {text!r}")
    return bound_seconds(seconds, name)


def _engine(text: str, name: str) -> str:
    if text not in ENGINES:
        raise ProgrammingError(f'parameter "{name}" is one of {", ".join(ENGINES)}, not {text!r}')
    return text


def _spark_master(text: str, name: str) -> str | None:
    word = text.strip()
    if word.lower() in ("none", "default", ""):
        return None
    check_master_url(word)
    return word


def _moment(text: str, name: str) -> dt.datetime | None:
    """A backend moment with its time zone, as SHOW mtcache.position gives it (none: none)."""
    word = text.strip()
    if word.lower() in ("none", "default", ""):
        return None
    try:
        moment = dt.datetime.fromisoformat(word)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise ProgrammingError(
            f'parameter "{name}" takes a position as SHOW mtcache.position '
            f"gives it (a timestamp with its time zone), not {text!r}"
        )
    return moment.astimezone(dt.UTC)


def _show_moment(value: dt.datetime | None) -> str:
    return value.isoformat(timespec="microseconds") if value is not None else "none"


def show_flag(value: bool) -> str:
    return "on" if value else "off"


def _show_bound(value: float | None) -> str:
    return format_duration(value) if value is not None else "none"


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "currency_bound",
            "currency_bound",
            _bound,
            _show_bound,
            "the bound of every SELECT block without a clause of its own (none: such "
            "reads go to the backend); also SET CURRENCY BOUND",
        ),
        Setting(
            "provenance",
            "provenance_notices",
            _flag,
            show_flag,
            "a NOTICE after each statement saying where its rows came from (its detail: "
            "the provenance as JSON)",
        ),
        Setting(
            "stale_ok",
            "stale_ok",
            _flag,
            show_flag,
            "answer from stale local data while the backend is down, with a notice",
        ),
        Setting(
            "admit_on_miss",
            "admit_on_miss",
            _flag,
            show_flag,
            "admit a missed presence key in the background",
        ),
        Setting(
            "admit_empty",
            "admit_empty",
            _flag,
            show_flag,
            "INSERT into a presence control table admits keys the backend has no rows for "
            "(as empty regions) instead of refusing them",
        ),
        Setting(
            "refresh_engine",
            "refresh_engine",
            _engine,
            str,
            f"what REFRESH CACHED VIEW pulls with ({', '.join(ENGINES)})",
        ),
        Setting(
            "spark_master",
            "spark_master",
            _spark_master,
            lambda v: v or "",
            "where REFRESH CACHED VIEW pulls on Spark: local[*], spark://HOST:PORT or "
            "sc://HOST:PORT (empty: the process's --spark-master, else local[*])",
        ),
        Setting(
            "position",
            "position",
            _moment,
            _show_moment,
            "the newest backend moment the session has seen (its reads' data, its committed "
            "writes): give it to another cache server as mtcache.min_position",
            writable=False,
        ),
        Setting(
            "min_position",
            "min_position",
            _moment,
            _show_moment,
            "no read answers from data older than this position (from mtcache.position of "
            "another cache server in front of the same backend)",
        ),
        Setting(
            "report_position",
            "report_position",
            _flag,
            show_flag,
            "a ParameterStatus mtcache.position after each statement that moved it",
        ),
    )
}


def setting(name: str) -> Setting:
    """The setting of a full name (``mtcache.provenance``), or an error naming them all."""
    short = name.lower().removeprefix(PREFIX)
    found = SETTINGS.get(short) if name.lower().startswith(PREFIX) else None
    if found is None:
        known = ", ".join(PREFIX + n for n in SETTINGS)
        raise UnknownSetting(
            f'unrecognized configuration parameter "{name}": the cache\'s settings are {known}'
        )
    return found


class UnknownSetting(ProgrammingError):
    sqlstate = "42704"  # undefined_object, as PostgreSQL says for an unknown parameter


class CantChange(ProgrammingError):
    sqlstate = "55P02"  # cant_change_runtime_param
