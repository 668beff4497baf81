"""Typed sqlglot nodes for mtcache's SQL extensions.

A SELECT block that carries a currency clause keeps it under the arg ``currency`` of its
``exp.Select``; standard generators ignore that arg, and `strip_extensions` removes it so the
tree prints as plain PostgreSQL or DuckDB SQL.
"""

from __future__ import annotations

import typing as t

from sqlglot import exp

# the unit names a duration may use, in seconds: the clause's words, and PostgreSQL's units of
# its time settings (``500ms``, ``2s``, ``10min``, ``1h``, ``1d``; ``us`` too)
UNIT_SECONDS: dict[str, float] = {
    "US": 0.000001,
    "MS": 0.001,
    "S": 1.0,
    "SEC": 1.0,
    "SECOND": 1.0,
    "SECONDS": 1.0,
    "MIN": 60.0,
    "MINUTE": 60.0,
    "MINUTES": 60.0,
    "HOUR": 3600.0,
    "HOURS": 3600.0,
    "H": 3600.0,
    "DAY": 86400.0,
    "DAYS": 86400.0,
    "D": 86400.0,
}


class Duration(exp.Expression):
    """``10 MIN``: this = the number literal, unit = the unit as written (upper case)."""

    arg_types = {"this": True, "unit": True}

    @property
    def seconds(self) -> float:
        return float(self.this.name) * UNIT_SECONDS[self.text("unit").upper()]


class CurrencySpec(exp.Expression):
    """One consistency class: ``10 MIN ON (b, r) BY b.isbn``.

    this = Duration; on = list of Identifier (None when ON is omitted); by = list of Column.
    """

    arg_types = {"this": True, "on": False, "by": False}


class CurrencyClause(exp.Expression):
    """``CURRENCY BOUND spec, spec ...`` attached to one SELECT block."""

    arg_types = {"expressions": True}


def plural(count: int, noun: str) -> str:
    """``1 region``, ``2 regions``: a count and its noun, for messages."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def format_duration(seconds: float) -> str:
    """A duration the way people write it: the largest unit that divides it (``10 min``)."""
    for unit, size in (("day", 86400.0), ("hour", 3600.0), ("min", 60.0), ("sec", 1.0)):
        if seconds >= size and (seconds / size).is_integer():
            value = int(seconds / size)
            return f"{value} {unit}{'s' if value != 1 and unit in ('day', 'hour') else ''}"
    return f"{seconds:g} sec"


class SessionBound(exp.Expression):
    """``SET CURRENCY BOUND d`` (this = "SET", expression = Duration), ``RESET CURRENCY BOUND``,
    ``SHOW CURRENCY BOUND``: the session's default bound for blocks without a clause."""

    arg_types = {"this": True, "expression": False}


class Inspect(exp.Expression):
    """``EXPLAIN LAST STATEMENT``, ``SHOW CACHED VIEWS``, ``SHOW CACHE STATUS [FOR VIEW a, ...]``:
    this = what is asked ("last statement", "cached views", "cache status", "cache stats",
    "cache advice", "cache seed");
    views = the views whose regions the status lists, however many (as folded names)."""

    arg_types = {"this": True, "views": False}


class CacheSetting(exp.Expression):
    """``SET mtcache.name = value`` / ``RESET mtcache.name`` / ``SHOW mtcache.name``: this =
    the action, name = the setting's full name, value = its text (SET)."""

    arg_types = {"this": True, "name": True, "value": False}


class RefreshCached(exp.Expression):
    """``REFRESH CACHED VIEW name [KEY (v, ...), ...]`` or ``REFRESH CACHED VIEWS``: this =
    the view (None: every white view), keys = tuples of the key values' texts."""

    arg_types = {"this": False, "keys": False}


class Timeline(exp.Expression):
    """``BEGIN TIMEORDERED`` (this = "BEGIN") or ``END TIMEORDERED`` (this = "END")."""

    arg_types = {"this": True}


class ExplainStatement(exp.Expression):
    """``EXPLAIN [options] statement``: this = the statement, options = their text as written."""

    arg_types = {"this": True, "options": False}


class ControlTableDef(exp.Expression):
    """``CREATE CONTROL TABLE name (col type, ...)``: this = Identifier, expressions = ColumnDef."""

    arg_types = {"this": True, "expressions": True}


class PresenceClause(exp.Expression):
    """``PRESENCE ON (cols) IN control [(control cols)]``."""

    arg_types = {"expressions": True, "this": True, "control_columns": False}


class ConsistencyClause(exp.Expression):
    """``CONSISTENCY ON ALL | ON (cols) [IN control] | ROOT``: kind is ALL, ON or ROOT."""

    arg_types = {"kind": True, "expressions": False, "this": False}


class CompletenessClause(exp.Expression):
    """``COMPLETENESS ON (cols) [IN control]``."""

    arg_types = {"expressions": True, "this": False}


class CachedViewDef(exp.Expression):
    """``CREATE CACHED VIEW name AS SELECT ...`` with its cache clauses."""

    arg_types = {
        "this": True,
        "expression": True,
        "presence": False,
        "consistency": False,
        "completeness": False,
        "refresh": False,  # a Duration (EVERY), or a Var: CONTINUOUSLY or AUTO
        "within": False,  # REFRESH AUTO WITHIN: the objective, a Duration
        "data": False,  # WITH [NO] DATA (absent: WITH DATA)
    }


class DropCacheObject(exp.Expression):
    """``DROP CACHED VIEW name`` / ``DROP CONTROL TABLE name``: kind is the object kind."""

    arg_types = {"this": True, "kind": True, "exists": False}


class ConstantList(exp.Expression):
    """The constants of a long ``IN (...)`` list, as one node: unsigned integers, or strings
    without backslashes or control characters (``constants`` holds their texts as
    `exp.Literal` holds one: a string without its quotes). Applications send lists of tens of
    thousands of keys; one node is planned, typed and printed at the cost of a few joins of
    strings, where one `exp.Literal` per key cost each phase a walk over every key
    (`sql_ext.long_lists` says when a list becomes one)."""

    arg_types = {"constants": True, "is_string": True}

    @property
    def constants(self) -> tuple[str, ...]:
        return t.cast(tuple[str, ...], self.args["constants"])

    @property
    def is_string(self) -> bool:
        return bool(self.args["is_string"])

    def python_values(self) -> list[int] | list[str]:
        """The constants as Python values (int or str)."""
        if self.is_string:
            return list(self.constants)
        return [int(c) for c in self.constants]

    def literals(self) -> list[exp.Literal]:
        """The constants as the `exp.Literal` nodes a short list would have."""
        return [exp.Literal(this=c, is_string=self.is_string) for c in self.constants]


E = t.TypeVar("E", bound=exp.Expr)


def copy_tree(tree: E) -> E:
    """A copy of a parsed tree, as sqlglot's ``copy`` makes it, but with each node's meta
    copied shallowly: its values are numbers and tuples (positions, node numbers, offsets),
    and a deep copy of every meta dict was most of the cost of copying a large statement.
    (It follows sqlglot's own ``Expr.__deepcopy__``, whose node attributes it reads: sqlglot
    is pinned to a minor release in pyproject.toml.)"""
    root = tree.__class__()
    stack: list[tuple[exp.Expr, exp.Expr]] = [(tree, root)]
    while stack:
        node, copy = stack.pop()
        if node.comments is not None:
            copy.comments = list(node.comments)
        if node._type is not None:
            copy._type = node._type.copy()
        if node._meta is not None:
            copy._meta = dict(node._meta)
        if node._hash is not None:
            copy._hash = node._hash
        for key, value in node.args.items():
            if isinstance(value, exp.Expr):
                child = value.__class__()
                stack.append((value, child))
                copy.set(key, child)
            elif type(value) is list:
                copy.args[key] = []
                for item in value:
                    if isinstance(item, exp.Expr):
                        child = item.__class__()
                        stack.append((item, child))
                        copy.append(key, child)
                    else:
                        copy.append(key, item)
            else:
                copy.args[key] = value
    return root


def strip_extensions(tree: exp.Expr) -> exp.Expr:
    """A copy of a query tree without currency clauses: plain SQL for PostgreSQL or DuckDB."""
    copy = copy_tree(tree)
    for select in copy.find_all(exp.Select):
        if select.args.get("currency") is not None:
            select.set("currency", None)
    return copy
