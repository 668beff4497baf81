"""What the cache stores of a derived cached view (`control_tables.derived`), and how the
backend computes it: the view's columns, with each aggregate kept as the states it is
computed again from when groups are merged (DBSP's and DBToaster's re-aggregable form; the
table of aggregates, `sql_ext.aggregates`, lists each one's states):

- a column of the rows, ``count`` and ``count(*)``, ``min`` and ``max``: one stored column;
- ``sum``: one stored column, in the type PostgreSQL's sum returns (bigint for smallint and
  integer, numeric for bigint and numeric, real and double precision for theirs), numerics at
  the display scale every value of the sum has (the largest of its argument's: a sum whose
  argument's scale the cache cannot tell is refused at DDL time);
- ``avg``: two stored columns, ``<name>__sum`` and ``<name>__count`` (the sum of the values and
  how many there were), its value their quotient as PostgreSQL divides them;
- kept ``REFRESH CONTINUOUSLY`` (`optimizer.derived.delta`), besides: a sum's count of values
  as ``<name>__count`` (a sum of none is NULL), and each group's rows as ``mtcache_rows``
  (a group of none leaves the view).

Each stored column has PostgreSQL's type (``pg_type``, `format_type`'s text, a numeric with
its scale) and the DuckDB type it is kept in.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from control_tables.schema import CachedView
from control_tables.types import duckdb_type
from optimizer.analysis.analyze import statement_types
from optimizer.postgres.expression_types import ExpressionTypes
from optimizer.postgres.types import DECIMAL_DIGITS, PgType
from sql_ext import CreateCachedView, Query, parse_one
from sql_ext.aggregates import AGGREGATES, COUNT_SUFFIX, SUM_SUFFIX, State
from sql_ext.catalog import Catalog
from sql_ext.errors import NotSupportedError

ROWS = "mtcache_rows"  # a continuously maintained group's row count (it leaves at none)


@dataclass(frozen=True)
class StoredColumn:
    name: str
    pg_type: str  # what PostgreSQL computes it as (format_type's text)
    duckdb_type: str  # what the cache keeps it in
    source: exp.Expr  # how the backend computes it over the view's rows (grouped)


@dataclass(frozen=True)
class Layout:
    """A derived view's stored columns, and which of them make each of its columns."""

    columns: tuple[StoredColumn, ...]
    outputs: dict[str, tuple[str, ...]]  # view column -> its stored columns (avg: sum, count)


def layout(view: CachedView, catalog: Catalog) -> Layout:
    """What the cache stores of ``view`` (see the module); `NotSupportedError` for an
    aggregate whose states it cannot keep exactly."""
    derivation = view.derivation
    assert derivation is not None
    query, select = definition(view)
    types = statement_types(query, catalog)
    columns: list[StoredColumn] = []
    outputs: dict[str, tuple[str, ...]] = {}
    for output, projection in zip(derivation.outputs, select.expressions, strict=True):
        target = projection.this if isinstance(projection, exp.Alias) else projection
        name = output.name
        if output.aggregate is None:
            columns.append(_stored(view, name, types.of(target), target, catalog, target))
            outputs[name] = (name,)
            continue
        aggregate = AGGREGATES[output.aggregate]
        value = target.this  # (count(*): a Star)
        for state in aggregate.states:
            if state.continuous_only and not view.continuous:
                continue
            columns.append(_state(view, name + state.suffix, state, value, types, catalog))
        outputs[name] = tuple(name + s.suffix for s in aggregate.stored)
    if view.continuous and derivation.aggregates:
        columns.append(StoredColumn(ROWS, "bigint", "BIGINT", exp.Count(this=exp.Star())))
    names = [c.name for c in columns]
    clash = next((n for n in names if names.count(n) > 1), None)
    if clash is not None:
        raise NotSupportedError(
            f"cached view {view.name}: the cache keeps an average as <name>{SUM_SUFFIX} and "
            f"<name>{COUNT_SUFFIX} (and, kept continuously, a sum's count as "
            f"<name>{COUNT_SUFFIX} and each group's rows as {ROWS}), and {clash!r} is also a "
            "column of the view; rename it"
        )
    return Layout(tuple(columns), outputs)


def pull_select(view: CachedView, found: Layout) -> str:
    """The backend's query of the view's stored columns (PostgreSQL SQL)."""
    _, select = definition(view)
    states = select.copy()
    states.set(
        "expressions", [exp.alias_(c.source.copy(), c.name, quoted=True) for c in found.columns]
    )
    return states.sql(dialect="postgres")


def definition(view: CachedView) -> tuple[Query, exp.Select]:
    """The view's SELECT as a statement of its own, typed and resolved as queries are."""
    statement = parse_one(view.statement)
    assert isinstance(statement, CreateCachedView)
    query = parse_one(statement.select.sql(dialect="postgres"))
    assert isinstance(query, Query) and isinstance(query.tree, exp.Select)
    return query, query.tree


def _state(
    view: CachedView,
    name: str,
    state: State,
    value: exp.Expr,
    types: ExpressionTypes,
    catalog: Catalog,
) -> StoredColumn:
    """A state's stored column, of the type `sql_ext.aggregates.State.stored_as` says,
    computed by its function of the aggregate's argument ``value``."""
    source = state.function(this=value.copy())
    if state.stored_as == "bigint":
        return StoredColumn(name, "bigint", "BIGINT", source)
    found = types.of(value)
    if state.stored_as == "value":
        return _stored(view, name, found, value, catalog, source)
    if state.stored_as == "numeric sum" and found.kind == "integer":
        found = found.as_numeric()
    return _sum(view, name, found, source)


def _stored(
    view: CachedView, name: str, found: PgType, value: exp.Expr, catalog: Catalog, source: exp.Expr
) -> StoredColumn:
    """A column kept as its value's type: a column's declared one, else what ``found``
    says (an expression's)."""
    declared = _declared(value, view, catalog)
    pg_type = declared or _pg_name(found)
    target = duckdb_type(pg_type) if pg_type is not None else None
    if pg_type is None or target is None:
        raise NotSupportedError(
            f"cached view {view.name}: the cache cannot keep {name} "
            f"({source.sql(dialect='postgres')}) exactly yet; leave it out of the view"
        )
    return StoredColumn(name, pg_type, target, source.copy())


def _sum(view: CachedView, name: str, found: PgType, source: exp.Expr) -> StoredColumn:
    """A sum kept in PostgreSQL's result type (see the module)."""
    if found.kind == "integer" and found.width in (2, 4):
        return StoredColumn(name, "bigint", "BIGINT", source)
    if found.kind == "float":
        return StoredColumn(
            name,
            "real" if found.width == 4 else "double precision",
            "FLOAT" if found.width == 4 else "DOUBLE",
            source,
        )
    if found.kind in ("integer", "numeric"):
        # (every value's display scale, when it is one: a sum's is its values' largest)
        scale = 0 if found.kind == "integer" else found.scale
        if scale is not None and scale <= DECIMAL_DIGITS:
            return StoredColumn(
                name,
                f"numeric({DECIMAL_DIGITS},{scale})",
                f"DECIMAL({DECIMAL_DIGITS},{scale})",
                source,
            )
    raise NotSupportedError(
        f"cached view {view.name}: the cache cannot keep the sum "
        f"{source.sql(dialect='postgres')} exactly (its values' display scale varies: cast "
        "its argument to numeric(p,s))"
    )


def _declared(value: exp.Expr, view: CachedView, catalog: Catalog) -> str | None:
    """A plain column's declared type (format_type's text), from its table."""
    if not isinstance(value, exp.Column):
        return None
    derivation = view.derivation
    assert derivation is not None
    name = value.name
    qualifier = value.table
    for source in derivation.sources:
        if qualifier and qualifier != source.alias:
            continue
        table = catalog.table(source.table, source.schema)
        if table is not None and table.has_column(name):
            return next(c.type for c in table.columns if c.name == name)
    return None


def _pg_name(found: PgType) -> str | None:
    """A type's PostgreSQL name, for an expression's value (None: not one the cache keeps)."""
    if found.kind == "integer":
        return {2: "smallint", 4: "integer", 8: "bigint"}.get(found.width or 0)
    if found.kind == "numeric" and found.scale is not None:
        return f"numeric({DECIMAL_DIGITS},{found.scale})"
    if found.kind == "float":
        return "real" if found.width == 4 else "double precision"
    if found.kind in ("text", "varchar", "string"):
        return "text"
    return {
        "bool": "boolean",
        "date": "date",
        "timestamp": "timestamp without time zone",
        "timestamptz": "timestamp with time zone",
    }.get(found.kind)


__all__ = [
    "COUNT_SUFFIX",
    "ROWS",
    "SUM_SUFFIX",
    "Layout",
    "StoredColumn",
    "definition",
    "layout",
    "pull_select",
]
