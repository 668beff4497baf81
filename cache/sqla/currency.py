"""`with_currency`: a SELECT's own currency clause, written with SQLAlchemy's objects::

    stmt = with_currency(select(Author.name, Book.title).join(Author.books), "10 min",
                         on=[Author, Book], by=[Author.city])

renders ``... CURRENCY BOUND 10 min ON (authors, books) BY authors.city`` (with the names the
FROM clause gives the inputs: an ``aliased(Author)`` is named by its alias), in whatever
block the SELECT becomes: the outer statement, a subquery, a CTE. Called again on the result,
it adds a spec (a consistency class) to the same clause. On an engine of another dialect the
clause renders as nothing: the statement keeps PostgreSQL's semantics, the strictest bound.
"""

from __future__ import annotations

import typing as t

from sqlalchemy import inspect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import coercions, elements, roles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import DQLDMLClauseElement
from sqlalchemy.sql.selectable import Alias, Select
from sqlalchemy.sql.visitors import InternalTraversal

from cache.engine.engine import bound_seconds
from sql_ext.errors import ProgrammingError
from sql_ext.nodes import format_duration

SelectT = t.TypeVar("SelectT")


class CurrencyClause(DQLDMLClauseElement):
    """The ``CURRENCY BOUND spec, ...`` suffix of one SELECT: per spec its duration, its
    inputs (FROM clauses; none: every input of the block) and its BY columns. They make the
    clause's part of the statement's cache key, so a statement is compiled once."""

    __visit_name__ = "mtcache_currency_clause"
    _traverse_internals = [
        ("bounds", InternalTraversal.dp_string_list),
        ("inputs", InternalTraversal.dp_clauseelement_tuples),
        ("columns", InternalTraversal.dp_clauseelement_tuples),
    ]

    def __init__(
        self,
        bounds: t.Sequence[str],
        inputs: t.Sequence[tuple[t.Any, ...]],
        columns: t.Sequence[tuple[t.Any, ...]],
    ) -> None:
        self.bounds, self.inputs, self.columns = list(bounds), list(inputs), list(columns)


def with_currency(
    statement: SelectT, bound: t.Any, on: t.Iterable[t.Any] = (), by: t.Iterable[t.Any] = ()
) -> SelectT:
    """``statement`` with a currency spec: ``bound`` (``"10 min"``, seconds or a timedelta)
    on the inputs ``on`` (mapped classes, aliases or tables; none: every input of the block)
    with the rows grouped ``by`` these columns each from one snapshot (none: the whole class
    from one snapshot)."""
    if not isinstance(statement, Select):
        raise ProgrammingError(f"with_currency takes a select(), not {type(statement).__name__}")
    inputs = tuple(_selectable(entity) for entity in on)
    columns = tuple(coercions.expect(roles.ExpressionElementRole, column) for column in by)
    kept = [(s, d) for s, d in statement._suffixes if not isinstance(s, CurrencyClause)]
    found = [s for s, _ in statement._suffixes if isinstance(s, CurrencyClause)]
    before = found[0] if found else CurrencyClause([], [], [])
    clause = CurrencyClause(
        [*before.bounds, duration(bound)], [*before.inputs, inputs], [*before.columns, columns]
    )
    copy = statement._generate()
    copy._suffixes = (*kept, (clause, "postgresql"))
    return t.cast(SelectT, copy)


def _selectable(entity: t.Any) -> t.Any:
    found = inspect(entity, raiseerr=False)
    if found is None or not hasattr(found, "selectable"):
        raise ProgrammingError(
            f"with_currency's on= takes mapped classes, aliases or tables, not {entity!r}"
        )
    return found.selectable


def duration(bound: t.Any) -> str:
    """A bound (``"10 min"``, seconds, a timedelta; checked as the DB-API checks a session
    bound) as a clause writes it."""
    seconds = bound_seconds(bound)
    if seconds is None:
        raise ProgrammingError("a currency bound is a duration, not None")
    return format_duration(seconds)


def has_currency_clause(statement: t.Any) -> bool:
    return any(isinstance(s, CurrencyClause) for s, _ in getattr(statement, "_suffixes", ()))


@compiles(CurrencyClause)
def _render(element: CurrencyClause, compiler: SQLCompiler, **kw: t.Any) -> str:
    if compiler.dialect.driver != "mtcache":  # another dialect: PostgreSQL's own semantics
        return ""
    specs = []
    for bound, inputs, columns in zip(element.bounds, element.inputs, element.columns, strict=True):
        text = bound
        if inputs:
            text += f" ON ({', '.join(_input_name(compiler, i) for i in inputs)})"
        if columns:
            text += f" BY {', '.join(compiler.process(c, **kw) for c in columns)}"
        specs.append(text)
    return f"CURRENCY BOUND {', '.join(specs)}"


def _input_name(compiler: SQLCompiler, selectable: t.Any) -> str:
    """The name the FROM clause gives an input: its alias, else its table's name."""
    if isinstance(selectable, Alias):
        name = selectable.name
        if isinstance(name, elements._truncated_label):
            name = compiler._truncated_identifier("alias", name)
        return compiler.preparer.format_alias(selectable, name)
    return compiler.preparer.quote(selectable.name)
