"""Whether a statement's answer depends only on the data it reads: no clock (``now()``,
``current_date``), no randomness, no session state, no function the parser does not know.
Only such statements' local answers may be kept and reused while the views they read are
unchanged (`cache.execution.memo`)."""

from __future__ import annotations

from sqlglot import exp

# sqlglot's classes for functions whose value changes between calls (by name prefix:
# CurrentDate, CurrentTimestamp, CurrentUser, ..., Rand, Randn, Uuid, Localtimestamp, ...)
_VOLATILE_PREFIXES = ("Current", "Rand", "Uuid", "Localtime", "Systimestamp", "Generate", "Seq")
# functions sqlglot leaves as calls that are immutable (the rest may be anything)
_IMMUTABLE_CALLS = frozenset({"date_part"})


def repeatable(tree: exp.Expr) -> bool:
    """Does the statement give the same answer for the same data and parameters?"""
    for node in tree.walk():
        if isinstance(node, exp.Anonymous):
            if node.name.lower() not in _IMMUTABLE_CALLS:
                return False
        elif isinstance(node, exp.Func) and type(node).__name__.startswith(_VOLATILE_PREFIXES):
            return False
    return True
