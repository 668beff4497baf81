"""The allowlist whole: every family's entries in one list (`ENTRIES`), in the order they
are tried, and their lookup by node (`resolve`, which the type inference asks for the type of
every node that computes a value); which nodes must have an entry (`computes`) and which
only arrange a query (`QUERY_PARTS`)."""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from optimizer.postgres.allowlist import (
    aggregates,
    arithmetic,
    casts,
    comparisons,
    conditionals,
    date_time,
    literals,
    math_functions,
    patterns,
    series,
    strings,
    window,
)
from optimizer.postgres.allowlist.base import Call, Entry, Result, Settings, no_keys
from optimizer.postgres.types import PgType
from sql_ext.nodes import ConstantList

# the families in the order the entries are tried: of the entries for one form, the first whose
# signature takes the arguments resolves the node
ENTRIES: list[Entry] = [
    *literals.FAMILY.entries,
    *casts.FAMILY.entries,
    *arithmetic.FAMILY.entries,
    *comparisons.FAMILY.entries,
    *patterns.FAMILY.entries,
    *conditionals.FAMILY.entries,
    *strings.FAMILY.entries,
    *math_functions.FAMILY.entries,
    *date_time.FAMILY.entries,
    *aggregates.FAMILY.entries,
    *window.FAMILY.entries,
    *series.FAMILY.entries,
]

_BY_FORM: dict[type[exp.Expr] | str, list[Entry]] = {}
for _entry in ENTRIES:
    for _form in _entry.forms:
        _BY_FORM.setdefault(_form, []).append(_entry)
BY_NAME = {e.name: e for e in ENTRIES}


def entries_for(node: exp.Expr) -> list[Entry]:
    if isinstance(node, exp.Anonymous):
        return _BY_FORM.get(node.name.lower(), [])
    return _BY_FORM.get(type(node), [])


def resolve(
    node: exp.Expr,
    typer: Callable[[exp.Expr], PgType],
    settings: Settings,
    identifies_rows: Callable[[exp.Expr, list[exp.Expr]], bool] = no_keys,
) -> tuple[Entry | None, Result]:
    """The entry that computes ``node`` and the type of its result, or (None, why no entry
    does)."""
    found = entries_for(node)
    if not found:
        why = WHY_NOT_LISTED.get(name_of(node))
        return None, (
            f"it calls {name_of(node)}, which is not on the list of what DuckDB "
            "computes as PostgreSQL does" + (f" ({why})" if why else "")
        )
    call = Call(node, typer, settings, identifies_rows)
    reason = ""
    for candidate in found:
        result = candidate.signature(call)
        if isinstance(result, PgType):
            return candidate, result
        reason = reason or result
    return None, reason or f"it applies {name_of(node)} to arguments the list does not take"


# why the commonest forms the list leaves out are left out, for EXPLAIN's reason
_ARRAYS = "the cache does not hold arrays, whose values and text form are PostgreSQL's own"
WHY_NOT_LISTED = {
    "filter": "FILTER is answered only on an aggregate that skips NULLs, which array_agg does not",
    "arraysize": _ARRAYS,
    "explode": _ARRAYS,
    "json_agg": "the cache does not build json, whose text form is PostgreSQL's own",
    "jsonb_agg": "the cache does not build jsonb, whose text form is PostgreSQL's own",
    "corr": "a statistic of doubles, whose last bits PostgreSQL's order of additions decides",
    "covarsamp": "a statistic of doubles, whose last bits PostgreSQL's order of additions decides",
    "covarpop": "a statistic of doubles, whose last bits PostgreSQL's order of additions decides",
    "withingroup": "an ordered-set aggregate, not proven alike yet",
    "regexp_matches": "a set-returning function of arrays",
    "tonumber": "its template reading follows lc_numeric, which a session may set",
}


def name_of(node: exp.Expr) -> str:
    """A function's name as SQL writes it (an operator's node name)."""
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    if isinstance(node, exp.JSONArrayAgg):
        return "json_agg"  # (sqlglot's name spells its capitals out)
    return node.sql_name().lower() if isinstance(node, exp.Func) else node.key


def computes(node: exp.Expr) -> bool:
    """Does the node compute a value that an entry must cover (rather than structure a query:
    a column, a subquery, a clause)?"""
    return isinstance(node, _COMPUTING) and not isinstance(node, _STRUCTURAL)


_COMPUTING = (
    exp.Func,
    exp.Binary,
    exp.Unary,
    exp.Predicate,
    exp.Literal,
    ConstantList,
    exp.Null,
    exp.Boolean,
    exp.Interval,
    exp.Cast,
)
# nodes that are typed by the inference itself or only arrange a query
_STRUCTURAL = (
    exp.Paren,
    exp.Alias,
    exp.Column,
    exp.Subquery,
    exp.Window,
    exp.Distinct,
    exp.Ordered,
    exp.Order,
    exp.Star,
    exp.Tuple,
    exp.Dot,
    exp.If,
)

# the parts a query is made of, which compute nothing themselves (anything else - a
# TABLESAMPLE, a recursive CTE's search clause - keeps the statement at the backend)
QUERY_PARTS = (
    *_STRUCTURAL,
    exp.Select,
    exp.From,
    exp.Join,
    exp.Where,
    exp.Group,
    exp.Having,
    exp.Limit,
    exp.Offset,
    exp.Union,
    exp.Intersect,
    exp.Except,
    exp.With,
    exp.CTE,
    exp.TableAlias,
    exp.Table,
    exp.Identifier,
    exp.WindowSpec,
    exp.DataType,
    exp.DataTypeParam,
    exp.Var,
    exp.Placeholder,
    exp.Collate,
    exp.Values,
    exp.Qualify,
    # ROLLUP, CUBE and GROUPING SETS: DuckDB groups by them as PostgreSQL does (each set's
    # rows, the columns outside it NULL, duplicate sets kept); grouping() is on the list
    exp.Rollup,
    exp.Cube,
    exp.GroupingSets,
    # a LATERAL derived table: DuckDB joins it row by row as PostgreSQL does (a LATERAL
    # function call, or Hive's LATERAL VIEW, is refused in optimizer.postgres.semantics)
    exp.Lateral,
)
