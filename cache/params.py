"""Query parameters, in one place (STYLE 6): pyformat (``%s``, ``%(name)s``, as psycopg) is the
module's paramstyle; statements evaluated by DuckDB get the values bound as literals."""

from __future__ import annotations

import typing as t
from collections.abc import Mapping, Sequence

from sqlglot import exp

from cache.errors import ProgrammingError

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
    if isinstance(params, Mapping):
        for mark in marks:
            if mark.this is None:
                raise ProgrammingError(
                    "a %s placeholder needs a sequence of parameters, got a mapping"
                )
            name = mark.name
            if name not in params:
                raise ProgrammingError(f"no value for the parameter %({name})s")
            mark.replace(_literal(params[name], mark))
        return bound
    if isinstance(params, str | bytes):
        raise ProgrammingError("parameters must be a sequence or a mapping, not a string")
    values = list(params)
    if len(values) != len(marks):
        raise ProgrammingError(
            f"the statement has {len(marks)} placeholder(s) but {len(values)} parameter(s) "
            "were passed"
        )
    for mark, value in zip(marks, values, strict=True):
        if mark.this is not None:
            raise ProgrammingError(f"%({mark.name})s needs a mapping of parameters")
        mark.replace(_literal(value, mark))
    return bound


def _literal(value: t.Any, mark: exp.Placeholder) -> exp.Expr:
    literal = exp.convert(value)
    literal.meta.update(mark.meta)  # keeps the node's identity for whoever mapped the tree
    return literal
