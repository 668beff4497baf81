"""How the tools print durations, counts, consistency classes and JSON documents."""

from __future__ import annotations

import json
import typing as t

from sql_ext.nodes import format_duration


def describe_class(cls: dict[str, t.Any]) -> str:
    tables = ", ".join(cls["tables"])
    if cls["bound_seconds"] == 0:
        freshness = "must be current (bound 0: read from the backend)"
    else:
        freshness = f"at most {format_duration(cls['bound_seconds'])} stale"
    grouping = (
        f"one snapshot per group of ({', '.join(cls['by'])})" if cls["by"] else "one snapshot"
    )
    return f"({tables}): {freshness}, {grouping}"


def print_json(document: t.Any) -> None:
    """Valid JSON only (no NaN or Infinity tokens): a value that cannot be JSON is an error."""
    print(json.dumps(document, allow_nan=False))
