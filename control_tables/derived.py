"""Derived cached views (beyond the dissertation's selections and projections of one table):
tables joined along keys, filtered, grouped and aggregated (count, sum, avg, min, max), as
`sql_ext.Derivation` says, resolved and checked against the backend catalog at DDL time.

- Each table the view reads exists; a column is qualified by its table's alias or found in
  exactly one of the tables.
- Joins are along keys: the columns one side of a JOIN ... ON compares form the primary key
  or a NOT NULL unique key of its table (each row of the other side meets at most one row).
- A view that groups (GROUP BY, or aggregates over all rows) projects its grouping columns,
  which are its key (one row per group; none: one row); a join view without aggregates
  projects the key of every table it joins, which together are its key.
- Columns and aggregate arguments are of types the cache stores.

What the cache keeps of each aggregate, and in which types, is the store's
(`cache.store.derived_storage`); this module only says what the view means.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass

from sqlglot import exp

from control_tables.schema import CachedView
from control_tables.types import duckdb_type
from sql_ext import CreateCachedView, Derivation
from sql_ext.catalog import Catalog, Table
from sql_ext.errors import CatalogError, NotSupportedError, ProgrammingError
from sql_ext.quoting import folded
from sql_ext.quoting import qualifier as column_qualifier

RESERVED = frozenset({"refreshed_at", "snapshot_id"})


@dataclass(frozen=True)
class Resolved:
    """A derived view's names resolved against the catalog: each alias's table, and the
    key the view keeps its rows by."""

    tables: t.Mapping[str, Table]  # alias -> backend table
    key: tuple[str, ...]  # the view's columns that identify a row (none: one row)


def resolve(view_name: str, derivation: Derivation, catalog: Catalog) -> Resolved:
    """The derived view's tables and key, or the first problem with it (see the module)."""
    tables: dict[str, Table] = {}
    for source in derivation.sources:
        table = catalog.table(source.table, source.schema)
        if table is None:
            known = ", ".join(sorted(catalog.tables)[:12]) or "none"
            raise CatalogError(
                f"cached view {view_name}: the backend has no table {source.table!r} (known: "
                f"{known}); create it on the backend first, or run `mtcache init` if it was "
                "just created"
            )
        if source.alias in tables:
            raise ProgrammingError(
                f"cached view {view_name}: {source.alias!r} names two of its tables; give "
                "each its own alias"
            )
        tables[source.alias] = table

    def owner(column: exp.Column) -> str:
        """The alias of the table a column of the view's SELECT belongs to."""
        name = folded(column)
        qualifier = column_qualifier(column) if column.table else None
        if qualifier is not None:
            if qualifier not in tables:
                raise CatalogError(
                    f"cached view {view_name}: no table {qualifier!r} in its FROM (tables: "
                    f"{', '.join(tables)})"
                )
            if not tables[qualifier].has_column(name):
                raise CatalogError(
                    f"cached view {view_name}: {tables[qualifier].name} has no column "
                    f"{name!r} (columns: {', '.join(tables[qualifier].column_names)})"
                )
            return qualifier
        found = [alias for alias, table in tables.items() if table.has_column(name)]
        if not found:
            raise CatalogError(f"cached view {view_name}: none of its tables has a column {name!r}")
        if len(found) > 1:
            raise ProgrammingError(
                f"cached view {view_name}: column {name!r} is in {', '.join(found)}; qualify "
                "it by its table's alias"
            )
        return found[0]

    def column_type(column: exp.Column) -> str:
        table = tables[owner(column)]
        return next(c.type for c in table.columns if c.name == folded(column))

    statement_columns = [c for node in _expressions(derivation) for c in node.find_all(exp.Column)]
    for column in statement_columns:
        pg_type = column_type(column)
        if duckdb_type(pg_type) is None:
            raise NotSupportedError(
                f"cached view {view_name}: column {folded(column)} has type {pg_type}, which "
                "the cache cannot store yet"
            )

    _check_joins(view_name, derivation, tables, owner)

    names = [o.name for o in derivation.outputs]
    for name in names:
        if names.count(name) > 1:
            raise ProgrammingError(
                f"cached view {view_name}: two of its columns are named {name!r}; name each "
                "with its own AS"
            )
        if name in RESERVED:
            raise ProgrammingError(
                f"cached view {view_name}: column name {name!r} is reserved for the cache's "
                "regions; choose another with AS"
            )

    def identity(column: exp.Column) -> tuple[str, str]:
        return owner(column), folded(column)

    if derivation.aggregates:
        grouped = {identity(c) for c in derivation.group}
        outputs = {
            identity(t.cast(exp.Column, o.expression)): o.name
            for o in derivation.outputs
            if o.aggregate is None
        }
        for identified, name in outputs.items():
            if identified not in grouped:
                raise ProgrammingError(
                    f"cached view {view_name}: column {name} is neither grouped by nor "
                    "aggregated; add it to GROUP BY or aggregate it"
                )
        missing = [f"{a}.{c}" for a, c in grouped if (a, c) not in outputs]
        if missing:
            raise ProgrammingError(
                f"cached view {view_name}: it groups by {', '.join(missing)} without "
                "projecting it; project every grouping column (they are the view's key)"
            )
        return Resolved(tables, tuple(outputs[identity(c)] for c in derivation.group))
    outputs = {identity(t.cast(exp.Column, o.expression)): o.name for o in derivation.outputs}
    key: list[str] = []
    for alias, table in tables.items():
        keys = table.candidate_keys()
        chosen = next((k for k in keys if all((alias, c) in outputs for c in k)), None)
        if chosen is None:
            wanted = ", ".join(f"{alias}.{c}" for c in keys[0]) if keys else "a key"
            raise ProgrammingError(
                f"cached view {view_name}: a join view projects the key of each table it "
                f"joins, to identify its rows; add {wanted}"
            )
        key += [outputs[(alias, c)] for c in chosen]
    return Resolved(tables, tuple(key))


def _expressions(derivation: Derivation) -> list[exp.Expr]:
    found: list[exp.Expr] = [*derivation.group]
    for left, right in derivation.joins:
        found += [left, right]
    found += [o.expression for o in derivation.outputs if o.expression is not None]
    return found


def _check_joins(
    view_name: str,
    derivation: Derivation,
    tables: t.Mapping[str, Table],
    owner: t.Callable[[exp.Column], str],
) -> None:
    """Every joined table is joined along a key of one side (see the module)."""
    pairs: dict[frozenset[str], list[tuple[tuple[str, str], tuple[str, str]]]] = {}
    for left, right in derivation.joins:
        a, b = owner(left), owner(right)
        if a == b:
            raise NotSupportedError(
                f"cached view {view_name}: {left.sql(dialect='postgres')} = "
                f"{right.sql(dialect='postgres')} compares two columns of one table; a JOIN "
                "... ON compares columns of the two tables it joins"
            )
        pairs.setdefault(frozenset((a, b)), []).append(((a, folded(left)), (b, folded(right))))
    joined = {derivation.sources[0].alias}
    for source in derivation.sources[1:]:
        links = [
            (pair, found)
            for pair, found in pairs.items()
            if source.alias in pair and (pair - {source.alias}) <= joined
        ]
        if not links:
            raise ProgrammingError(
                f"cached view {view_name}: {source.alias} is joined by no ON equality with "
                "the tables before it"
            )
        for pair, found in links:
            sides: dict[str, set[str]] = {alias: set() for alias in pair}
            for (a, ca), (b, cb) in found:
                sides[a].add(ca)
                sides[b].add(cb)
            if not any(
                any(set(k) <= sides[alias] for k in tables[alias].candidate_keys())
                for alias in pair
            ):
                names = " and ".join(sorted(pair))
                raise NotSupportedError(
                    f"cached view {view_name}: the join of {names} is not along a key (the "
                    "columns one side compares must be its primary key or a NOT NULL unique "
                    "key, so each row meets at most one row of that side)"
                )
        joined.add(source.alias)


def check_derived(statement: CreateCachedView, catalog: Catalog) -> Resolved:
    """A CREATE CACHED VIEW of a derived view, checked (see the module), with what this
    release does not keep yet refused."""
    derivation = statement.derivation
    assert derivation is not None
    resolved = resolve(statement.name, derivation, catalog)
    if statement.completeness is not None or (
        statement.consistency is not None and statement.consistency.kind != "all"
    ):
        raise NotSupportedError(
            f"cached view {statement.name}: a derived view takes CONSISTENCY ON ALL (every "
            "group it holds of one snapshot) and no other CONSISTENCY or COMPLETENESS clause: "
            "each group it holds is complete by construction, and one presence key's groups "
            "are one snapshot's"
        )
    if len(statement.presence) > 1:
        raise NotSupportedError(
            f"cached view {statement.name}: a derived view takes one PRESENCE clause"
        )
    return resolved


def plain_output(derivation: Derivation, name: str) -> exp.Column | None:
    """The column of the view's rows a column of the view is (None: an aggregate, or no
    such column)."""
    output = next((o for o in derivation.outputs if o.name == name), None)
    if output is None or output.aggregate is not None:
        return None
    return t.cast(exp.Column, output.expression)


def derived_column_type(
    view_name: str, derivation: Derivation, name: str, catalog: Catalog
) -> str | None:
    """The PostgreSQL type of a column of a derived view that is a column of its rows."""
    column = plain_output(derivation, name)
    if column is None:
        return None
    found = resolve(view_name, derivation, catalog)
    qualifier = column_qualifier(column) if column.table else None
    for alias, table in found.tables.items():
        if (qualifier is None or qualifier == alias) and table.has_column(folded(column)):
            return next(c.type for c in table.columns if c.name == folded(column))
    return None


def check_presence(view: CachedView, kind_of: t.Callable[[str], str | None]) -> None:
    """A derived view's PRESENCE: by a control table, on columns of its rows (a grouped
    view's grouping columns; any column of a join view's rows)."""
    derivation = view.derivation
    assert derivation is not None
    for edge in view.presence:
        if kind_of(edge.control) != "control table":
            raise NotSupportedError(
                f"cached view {view.name}: PRESENCE ... IN {edge.control}: a derived view's "
                "presence is controlled by a control table (CREATE CONTROL TABLE)"
            )
        aggregated = [
            c
            for c in edge.columns
            if c in {o.name for o in derivation.outputs} and plain_output(derivation, c) is None
        ]
        if aggregated:
            raise ProgrammingError(
                f"cached view {view.name}: PRESENCE ON ({', '.join(aggregated)}): an "
                "aggregate is no key; control the view by its grouping columns"
            )


__all__ = [
    "RESERVED",
    "Resolved",
    "check_derived",
    "check_presence",
    "derived_column_type",
    "plain_output",
    "resolve",
]
