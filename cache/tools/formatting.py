"""How the tools print durations, counts and consistency classes."""

from __future__ import annotations

import typing as t


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def format_seconds(seconds: float) -> str:
    for unit, size in (("day", 86400.0), ("hour", 3600.0), ("min", 60.0), ("sec", 1.0)):
        if seconds >= size and (seconds / size).is_integer():
            value = int(seconds / size)
            return f"{value} {unit}{'s' if value != 1 and unit in ('day', 'hour') else ''}"
    return f"{seconds:g} sec"


def describe_class(cls: dict[str, t.Any]) -> str:
    tables = ", ".join(cls["tables"])
    if cls["bound_seconds"] == 0:
        freshness = "must be current (bound 0: read from the backend)"
    else:
        freshness = f"at most {format_seconds(cls['bound_seconds'])} stale"
    grouping = (
        f"one snapshot per group of ({', '.join(cls['by'])})" if cls["by"] else "one snapshot"
    )
    return f"({tables}): {freshness}, {grouping}"
