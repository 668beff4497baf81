"""What a statement sent to the backend may leave in the backend session, read off its text
(over-approximately: a statement that might do something counts as doing it).

The session's link keeps its books by these (`BackendLink.left`): a statement that may change the
role has the role asked again (`cache.engine.privileges`); on a pooled connection
(`cache.backend.session_pool`), one that may change a setting has the session's settings
read before the connection is given back, one that leaves what a connection cannot carry to
another session pins the session to its connection, and the custom settings (``bars.tag``)
it may define are carried by name. Every statement that reaches the backend is read so,
whatever the route that sent it: a cached read the backend answers is such a statement too.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

# words of a statement that may change the role the backend checks reads as (SET ROLE, SET
# SESSION AUTHORIZATION, RESET ALL, DISCARD ALL, set_config('role', ...)), over-approximately
_MAY_CHANGE_ROLE = re.compile(r"role|authorization|set_config|reset|discard", re.IGNORECASE)

# what a statement may leave in the backend session that a pooled connection cannot carry to
# another: the session is pinned to its connection
_PINS = [
    (re.compile(pattern, re.IGNORECASE), why)
    for pattern, why in (
        (r"\b(TEMP|TEMPORARY)\s+(TABLE|SEQUENCE|VIEW|RECURSIVE\s+VIEW)\b", "a temporary relation"),
        (r"\bINTO\s+(TEMP|TEMPORARY|UNLOGGED\s+TEMP)\b", "a temporary relation"),
        (r"\bpg_temp\b", "a temporary object"),
        (r"^\s*LISTEN\b", "LISTEN"),
        (r"\bpg_(try_)?advisory_lock", "a session advisory lock"),
        (r"\bWITH\s+HOLD\b", "a WITH HOLD cursor"),
        (r"^\s*PREPARE\b", "a prepared statement (PREPARE)"),
        (r"^\s*LOAD\b", "a loaded library"),
        (
            r"^\s*(SET|RESET)\s+(SESSION\s+|LOCAL\s+)?(ROLE|SESSION\s+AUTHORIZATION)\b",
            "a role change",
        ),
        (r"set_config\s*\(\s*'(role|session_authorization)'", "a role change"),
    )
]
# statements that may change a session-level setting a pooled connection must carry over
_SETTING = re.compile(r"^\s*(SET|RESET|DISCARD)\b|set_config", re.IGNORECASE)
# statements after which the backend session holds none of the server's prepared statements
_UNPREPARES = re.compile(r"^\s*(DEALLOCATE|DISCARD)\b", re.IGNORECASE)

# a custom setting's name (a dotted one: ``bars.tag``), as SET, SET LOCAL and RESET write it
_PART = r'(?:"[^"]+"|[A-Za-z_][\w$]*)'
_SET_NAME = re.compile(
    rf"^\s*(?:SET|RESET)\s+(?:SESSION\s+|LOCAL\s+)?({_PART}\s*\.\s*{_PART})", re.IGNORECASE
)
# set_config's first argument: a string constant (its name), or anything else (no name)
_SET_CONFIG = re.compile(r"set_config\s*\(\s*(?:'((?:[^']|'')*)'\s*,)?", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class BackendEffects:
    """What a statement may leave in its backend session (see the module)."""

    may_change_role: bool
    pins: str | None  # why it pins a pooled session to its connection (None: it does not)
    may_change_settings: bool
    unprepares: bool  # the backend session keeps none of its prepared statements after it
    # the custom settings it may define (a placeholder, once defined, stays so in its backend
    # session: RESET makes it empty, not unknown)
    custom_settings: frozenset[str]


NONE = BackendEffects(False, None, False, False, frozenset())


@functools.lru_cache(maxsize=4096)
def effects_of(sql: str) -> BackendEffects:
    """What the statement ``sql`` may leave in its backend session."""
    custom, computed = custom_settings(sql)
    pins = _pins(sql)
    if pins is None and computed:
        pins = "a setting whose name is computed (set_config with a name that is not a constant)"
    return BackendEffects(
        _MAY_CHANGE_ROLE.search(sql) is not None,
        pins,
        _SETTING.search(sql) is not None,
        _UNPREPARES.search(sql) is not None,
        custom,
    )


def custom_settings(sql: str) -> tuple[frozenset[str], bool]:
    """The custom settings a statement names in SET, RESET or set_config (lower case, as the
    backend compares them), and whether it calls set_config with a name it computes."""
    names = set()
    found = _SET_NAME.match(sql)
    if found is not None:
        names.add(_setting_name(found.group(1)))
    computed = False
    for call in _SET_CONFIG.finditer(sql):
        literal = call.group(1)
        if literal is None:
            computed = True
        elif "." in literal:
            names.add(literal.replace("''", "'").lower())
    return frozenset(names), computed


def _setting_name(written: str) -> str:
    return ".".join(part.strip().strip('"') for part in written.split(".")).lower()


def _pins(sql: str) -> str | None:
    for pattern, why in _PINS:
        if pattern.search(sql) is not None:
            return why
    return None


__all__ = ["NONE", "BackendEffects", "custom_settings", "effects_of"]
