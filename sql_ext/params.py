"""Query parameters, in one place (STYLE 6): pyformat (``%s``, ``%(name)s``, as psycopg) is the
module's paramstyle; statements evaluated by DuckDB get the values bound as literals."""

from __future__ import annotations

import typing as t
from collections.abc import Mapping, Sequence

from sqlglot import exp

from sql_ext.errors import ProgrammingError

Params = Sequence[t.Any] | Mapping[str, t.Any] | None


def placeholders(tree: exp.Expr) -> list[exp.Placeholder]:
    """The statement's placeholders in textual order."""
    found = [p for p in tree.find_all(exp.Placeholder)]
    return sorted(found, key=lambda p: p.meta.get("offset", 0))


def bind_literals(tree: exp.Expr, params: Params) -> exp.Expr:
    """A copy of the tree with every placeholder replaced by its value as a SQL literal."""
    bound = tree.copy()
    marks = placeholders(bound)
    if params is None:
        params = ()
    keys = [mark.name if mark.this is not None else position
            for position, mark in enumerate(marks)]  # fmt: skip
    for mark, value in zip(marks, values_for(keys, params), strict=True):
        mark.replace(_literal(value, mark))
    return bound


def values_for(keys: Sequence[int | str], params: Params) -> list[t.Any]:
    """The value of each placeholder (its position for %s, its name for %(name)s), with the
    errors psycopg would give for parameters that do not fit the statement."""
    if params is None:
        params = ()
    if isinstance(params, Mapping):
        found = []
        for key in keys:
            if isinstance(key, int):
                raise ProgrammingError(
                    "a %s placeholder needs a sequence of parameters, got a mapping"
                )
            if key not in params:
                raise ProgrammingError(f"no value for the parameter %({key})s")
            found.append(params[key])
        return found
    if isinstance(params, str | bytes):
        raise ProgrammingError("parameters must be a sequence or a mapping, not a string")
    values = list(params)
    if len(values) != len(keys):
        raise ProgrammingError(
            f"the statement has {len(keys)} placeholder(s) but {len(values)} parameter(s) "
            "were passed"
        )
    for key in keys:
        if isinstance(key, str):
            raise ProgrammingError(f"%({key})s needs a mapping of parameters")
    return values


def _literal(value: t.Any, mark: exp.Placeholder) -> exp.Expr:
    literal = exp.convert(value)
    literal.meta.update(mark.meta)  # keeps the node's identity for whoever mapped the tree
    return literal
