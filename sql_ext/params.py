"""Query parameters, in one place (STYLE 6). pyformat (``%s``, ``%(name)s``, as psycopg) is the
module's paramstyle. Each placeholder of a statement has a *key*: its position among the ``%s``
marks, or its name. Statements run by DuckDB name them ``$p0`` / ``$name``; leaf queries sent to
PostgreSQL name them ``%(p0)s`` / ``%(name)s`` (bound by psycopg); the optimizer reads their
values through `ParameterValues` to probe the cache's regions.
"""

from __future__ import annotations

import typing as t
from collections.abc import Mapping, Sequence

from sqlglot import exp

from sql_ext.errors import ProgrammingError

Params = Sequence[t.Any] | Mapping[str, t.Any] | None
Key = int | str  # a placeholder's position (%s) or its name (%(name)s)

NODE_ID = "mt_id"  # meta key numbering a parsed tree's nodes: copies keep it (see number_nodes)


def number_nodes(tree: exp.Expr) -> None:
    """Give every node of a parsed tree a number in its meta (once): a copy of the tree keeps
    the numbers, so a node of the original can be found again in a rewritten copy."""
    for number, node in enumerate(tree.walk()):
        node.meta.setdefault(NODE_ID, number)


def placeholders(tree: exp.Expr) -> list[exp.Placeholder]:
    """The statement's placeholders in textual order."""
    found = [p for p in tree.find_all(exp.Placeholder)]
    return sorted(found, key=lambda p: p.meta.get("offset", 0))


def placeholder_keys(tree: exp.Expr) -> dict[int, Key]:
    """Each placeholder's key, by its node number (see `number_nodes`)."""
    number_nodes(tree)
    return {
        mark.meta[NODE_ID]: mark.name if mark.this is not None else position
        for position, mark in enumerate(placeholders(tree))
    }


def duckdb_name(key: Key) -> str:
    """The DuckDB named parameter of a placeholder key (``$p0``, ``$name``)."""
    return f"p{key}" if isinstance(key, int) else key


def bind_literals(tree: exp.Expr, params: Params) -> exp.Expr:
    """A copy of the tree with every placeholder replaced by its value as a SQL literal."""
    bound = tree.copy()
    marks = placeholders(bound)
    if params is None:
        params = ()
    keys = [mark.name if mark.this is not None else position for position, mark in enumerate(marks)]
    for mark, value in zip(marks, values_for(keys, params), strict=True):
        mark.replace(_literal(value, mark))
    return bound


def values_for(keys: Sequence[Key], params: Params) -> list[t.Any]:
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


UNKNOWN: t.Final = object()  # a constant whose value cannot be known before execution

# Casts that keep a key: when the value cast is equal (in Python) to a key of the column,
# PostgreSQL's cast gives that key (``%(id)s::INTEGER`` with 2, 2.0, Decimal("2") or True;
# ``%(d)s::DATE`` with a date). A value that is not equal to any key - "2" for an integer -
# finds none, so the guard sends the query to the backend, which casts it. SQLAlchemy's
# psycopg dialect writes every parameter this way.
KEY_CASTS = frozenset(
    {
        exp.DType.TINYINT,
        exp.DType.SMALLINT,
        exp.DType.INT,
        exp.DType.BIGINT,
        exp.DType.TEXT,
        exp.DType.VARCHAR,
        exp.DType.DECIMAL,
        exp.DType.BOOLEAN,
        exp.DType.DATE,
        exp.DType.TIMESTAMP,
        exp.DType.UUID,
    }
)
LITERALS = (exp.Literal, exp.Placeholder, exp.Boolean)


def is_constant(node: exp.Expr, null: bool = False) -> bool:
    """A literal, a placeholder (``null``: or NULL), or one of them cast to a type that keeps
    keys (`KEY_CASTS`): what a key may be probed with."""
    if isinstance(node, exp.Cast):
        to = node.to
        if to.this not in KEY_CASTS or (to.this == exp.DType.VARCHAR and to.expressions):
            return False
        node = node.this
    return isinstance(node, LITERALS) or (null and isinstance(node, exp.Null))


class ParameterValues:
    """The values of a statement's constants for one execution: literals as written,
    placeholders from the parameters. Lenient: a missing parameter is `UNKNOWN` (the statement
    itself reports it when it runs), and so is anything but a plain literal."""

    __slots__ = ("keys", "params")

    def __init__(self, keys: Mapping[int, Key], params: Params) -> None:
        self.keys = keys
        self.params = params

    def value(self, constant: exp.Expr) -> t.Any:
        if isinstance(constant, exp.Placeholder):
            key = self.keys.get(constant.meta.get(NODE_ID, -1))
            params = self.params
            try:
                if isinstance(key, int) and isinstance(params, Sequence):
                    return params[key]
                if isinstance(key, str) and isinstance(params, Mapping):
                    return params[key]
            except (IndexError, KeyError):
                return UNKNOWN
            return UNKNOWN
        if isinstance(constant, exp.Literal | exp.Boolean):
            return constant.to_py()
        if isinstance(constant, exp.Cast) and is_constant(constant):
            return self.value(constant.this)  # a cast that keeps keys (KEY_CASTS)
        return UNKNOWN  # NULL matches no key; other casts and expressions are not guessed


def _literal(value: t.Any, mark: exp.Placeholder) -> exp.Expr:
    literal = exp.convert(value)
    literal.meta.update(mark.meta)  # keeps the node's identity for whoever mapped the tree
    return literal
