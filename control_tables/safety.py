"""Checks a cache schema before anything is created: validity against the backend catalog, and
the safety Rules 1-5 (§3.5, Theorem 5.1: together they make every view safe, so regions nest
and a refresh's affected closure is computed top-down in one pass).

Every failure is a `ProgrammingError` naming the rule (or the problem) and the views involved.
"""

from __future__ import annotations

from sqlglot import exp

from control_tables.derived import check_presence, derived_column_type
from control_tables.schema import CachedView, CacheSchema
from control_tables.types import duckdb_type
from sql_ext.catalog import Catalog, Table
from sql_ext.errors import CatalogError, NotSupportedError, ProgrammingError
from sql_ext.fds import FD, closure

RULES = {
    1: "the cache graph is acyclic",
    2: "a gray view (CONSISTENCY ROOT) has no consistency or completeness control of its own",
    3: "a view with more than one presence control is white and view-level consistent",
    4: "a gray view is controlled by a key of its parent",
    5: "a white view's consistency and completeness keys are FD-comparable and determined by "
    "its presence key",
}


class UnsafeSchemaError(ProgrammingError):
    """A cache schema that breaks one of Rules 1-5."""

    def __init__(self, rule: int, views: list[str], detail: str, fix: str) -> None:
        self.rule = rule
        self.views = views
        super().__init__(
            f"Rule {rule} ({RULES[rule]}) is broken by {', '.join(views)}: {detail}; {fix}"
        )


def check_schema(schema: CacheSchema, catalog: Catalog) -> None:
    """Raise on the first problem of the whole schema (views in name order; a derived view
    is checked when it is created, `control_tables.derived`, and has no controls)."""
    views = sorted((v for v in schema.views.values() if not v.is_derived), key=lambda v: v.name)
    for view in views:
        _check_view(schema, view, catalog)
    for view in sorted((v for v in schema.views.values() if v.is_derived), key=lambda v: v.name):
        _check_presence(schema, view, catalog)
    _check_single_use(schema)
    _check_rule_1(schema)
    for view in views:
        _check_rules_2_to_5(schema, view, catalog)
    for view in views:
        _check_supported(schema, view)
        _check_continuous(schema, view)


def backend_table(catalog: Catalog, view_name: str, table: str) -> Table:
    found = catalog.table(table)
    if found is None:
        known = ", ".join(sorted(catalog.tables)[:12]) or "none"
        raise CatalogError(
            f"cached view {view_name}: the backend has no table {table!r} (known: {known}); "
            "create it on the backend first, or run `mtcache init` if it was just created"
        )
    return found


def view_key(view_name: str, table: Table, columns: tuple[str, ...]) -> tuple[str, ...]:
    """The backend key a view keeps rows by: the primary key, else a NOT NULL unique key."""
    keys = table.candidate_keys()
    if not keys:
        raise ProgrammingError(
            f"cached view {view_name}: backend table {table.name} has no primary key or NOT NULL "
            "unique key; the cache identifies rows by the backend key (add one on the backend)"
        )
    for key in keys:
        if set(key) <= set(columns):
            return key
    raise ProgrammingError(
        f"cached view {view_name} must include a key of {table.name} "
        f"({', '.join(keys[0])}) among its columns, to identify rows across refreshes"
    )


def _need_columns(view: CachedView, what: str, columns: tuple[str, ...]) -> None:
    missing = [c for c in columns if c not in view.columns]
    if missing:
        raise ProgrammingError(
            f"cached view {view.name}: {what} names {', '.join(missing)}, which the view "
            f"does not select (it selects {', '.join(view.columns)})"
        )


def _check_presence(schema: CacheSchema, view: CachedView, catalog: Catalog) -> None:
    """Each PRESENCE edge: its columns selected by the view, its control there with the
    control key's columns, of the types of the view columns it controls (a derived view's:
    by a control table, on columns of its rows: `control_tables.derived.check_presence`)."""
    if view.is_derived:
        check_presence(view, schema.kind_of)
    for edge in view.presence:
        _need_columns(view, "PRESENCE ON", edge.columns)
        kind = schema.kind_of(edge.control)
        if kind is None:
            raise ProgrammingError(
                f"cached view {view.name}: PRESENCE ... IN {edge.control}: no control table or "
                f"cached view {edge.control!r}; create it (before or in the same script)"
            )
        if kind == "cached view" and schema.views[edge.control].is_derived:
            raise NotSupportedError(
                f"cached view {view.name}: PRESENCE ... IN {edge.control}: a derived view "
                "controls no other view in this release; control it by a control table or a "
                "view of one table"
            )
        control_columns = (
            schema.control_tables[edge.control].column_names
            if kind == "control table"
            else schema.views[edge.control].columns
        )
        missing = [c for c in edge.control_columns if c not in control_columns]
        if missing:
            raise ProgrammingError(
                f"cached view {view.name}: {kind} {edge.control} has no column "
                f"{', '.join(missing)} (it has {', '.join(control_columns)})"
            )
        for mine, theirs in zip(edge.columns, edge.control_columns, strict=True):
            ours = _view_column_type(catalog, view, mine)
            other = (
                _control_column_type(schema, edge.control, theirs)
                if kind == "control table"
                else _view_column_type(catalog, schema.views[edge.control], theirs)
            )
            if not compatible(ours, other):
                raise ProgrammingError(
                    f"cached view {view.name}: PRESENCE ON ({mine}) IN {edge.control} "
                    f"({theirs}): {mine} is {ours} but {edge.control}.{theirs} is {other}; "
                    "a control key must have the type of the view column it controls"
                )
        if kind == "control table" and set(edge.control_columns) != set(control_columns):
            raise ProgrammingError(
                f"cached view {view.name}: presence control table {edge.control} must hold "
                f"exactly the control key ({', '.join(edge.control_columns)}); it has "
                f"{', '.join(control_columns)}"
            )


def _check_view(schema: CacheSchema, view: CachedView, catalog: Catalog) -> None:
    table = backend_table(catalog, view.name, view.table)
    for column in view.columns:
        if not table.has_column(column):
            raise CatalogError(
                f"cached view {view.name}: {table.name} has no column {column!r} "
                f"(columns: {', '.join(table.column_names)})"
            )
        pg_type = next(c.type for c in table.columns if c.name == column)
        if duckdb_type(pg_type) is None:
            raise NotSupportedError(
                f"cached view {view.name}: column {column} has type {pg_type}, which the cache "
                "cannot store yet; leave it out of the view's column list"
            )

    _check_presence(schema, view, catalog)

    for what, spec in (
        ("CONSISTENCY ON", view.consistency),
        ("COMPLETENESS ON", view.completeness),
    ):
        if spec is None or not spec.columns:
            continue
        _need_columns(view, what, spec.columns)
        if spec.control is None:
            continue
        if spec.control not in schema.control_tables:
            detail = "a cached view" if spec.control in schema.views else "no control table"
            raise ProgrammingError(
                f"cached view {view.name}: {what} (...) IN {spec.control}: {spec.control} is "
                f"{detail}; consistency and completeness are listed in a CREATE CONTROL TABLE"
            )
        control = schema.control_tables[spec.control]
        if set(control.column_names) != set(spec.columns):
            raise ProgrammingError(
                f"cached view {view.name}: control table {spec.control} must hold exactly "
                f"({', '.join(spec.columns)}); it has ({', '.join(control.column_names)})"
            )

    if view.is_gray:
        parent_edge = view.presence[0] if len(view.presence) == 1 else None
        if parent_edge is not None and parent_edge.control in schema.control_tables:
            raise ProgrammingError(
                f"cached view {view.name}: CONSISTENCY ROOT makes it consistent with the parent "
                f"view that controls it, but {parent_edge.control} is a control table; control "
                "it by a cached view, or drop CONSISTENCY ROOT"
            )


def _check_supported(schema: CacheSchema, view: CachedView) -> None:
    """What this release does not maintain yet (checked after the rules, which say more)."""
    if (
        not view.is_gray
        and not view.view_level
        and any(p.control in schema.views for p in view.presence)
    ):
        raise NotSupportedError(
            f"cached view {view.name}: a white view controlled by another cached view must be "
            "view-level consistent; add CONSISTENCY ON ALL, or CONSISTENCY ROOT to follow its "
            "parent (group-level white children are not supported yet)"
        )


def _check_continuous(schema: CacheSchema, view: CachedView) -> None:
    """REFRESH CONTINUOUSLY (issue 11): what the WAL consumer can keep exact; and REFRESH
    AUTO, which a gray view cannot choose either (it follows its root)."""
    if view.auto and view.is_gray:
        root = schema.consistency_root(view.name)
        raise ProgrammingError(
            f"cached view {view.name}: a gray view is refreshed with its consistency root; "
            f"declare REFRESH AUTO on {root} instead"
        )
    if view.within_seconds is not None and view.within_seconds <= 0:
        raise ProgrammingError(
            f"cached view {view.name}: REFRESH AUTO WITHIN needs an age above 0 (no copy is "
            "ever 0 seconds old); give the most its data may lag, e.g. WITHIN 30 SEC"
        )
    if view.continuous and view.is_gray:
        root = schema.consistency_root(view.name)
        raise ProgrammingError(
            f"cached view {view.name}: a gray view is maintained with its consistency root; "
            f"declare REFRESH CONTINUOUSLY on {root} instead"
        )
    if view.continuous and view.refresh_seconds is not None:
        raise ProgrammingError(
            f"cached view {view.name}: REFRESH EVERY and REFRESH "
            "CONTINUOUSLY exclude each other; keep one"
        )
    if not schema.continuous(view.name):
        for parent in schema.parents(view.name):
            if schema.continuous(parent):
                raise ProgrammingError(
                    f"cached view {view.name} is controlled by {parent}, which is maintained "
                    f"continuously: declare REFRESH CONTINUOUSLY on {view.name} too (its "
                    "regions follow the parent's rows as they change)"
                )
        return
    if view.where is not None and not view.is_derived:  # (a derived view's: its maintenance)
        raise NotSupportedError(
            f"cached view {view.name}: a REFRESH CONTINUOUSLY view selects whole rows of its "
            "table (its WHERE would be evaluated by the cache, not the backend); move the "
            "condition into a presence or completeness control, or use REFRESH EVERY"
        )
    for parent in schema.parents(view.name):
        if not schema.continuous(parent):
            raise ProgrammingError(
                f"cached view {view.name} is maintained continuously but its parent {parent} "
                f"is not: declare REFRESH CONTINUOUSLY on {schema.consistency_root(parent)} "
                "too (a child's regions follow its parent's rows)"
            )


_INTEGERS = {"SMALLINT", "INTEGER", "BIGINT"}
_ALIASES = {
    "INT": "INTEGER",
    "INT4": "INTEGER",
    "INT2": "SMALLINT",
    "INT8": "BIGINT",
    "TEXT": "VARCHAR",
    "STRING": "VARCHAR",
    "CHAR": "VARCHAR",
    "BOOL": "BOOLEAN",
    "FLOAT4": "FLOAT",
    "REAL": "FLOAT",
    "FLOAT8": "DOUBLE",
    "TIMESTAMP WITH TIME ZONE": "TIMESTAMPTZ",
}


def compatible(a: str | None, b: str | None) -> bool:
    """Can values of DuckDB types a and b be compared as keys without surprises?"""
    if a is None or b is None:
        return False
    return a == b or (a in _INTEGERS and b in _INTEGERS)


def _view_column_type(catalog: Catalog, view: CachedView, column: str) -> str | None:
    if view.derivation is not None:
        found = derived_column_type(view.name, view.derivation, column, catalog)
        return duckdb_type(found) if found is not None else None
    table = catalog.table(view.table)
    types = {c.name: c.type for c in table.columns} if table is not None else {}
    return duckdb_type(types[column]) if column in types else None


def _control_column_type(schema: CacheSchema, control: str, column: str) -> str | None:
    types = dict(schema.control_tables[control].columns)
    if column not in types:
        return None
    rendered = exp.DataType.build(types[column], dialect="postgres").sql(dialect="duckdb")
    base = rendered.split("(")[0].upper()
    return _ALIASES.get(base, rendered.upper().replace(" ", "") if base == "DECIMAL" else base)


def _check_single_use(schema: CacheSchema) -> None:
    """A control table's row carries one region's refreshed_at and snapshot_id, so it controls
    one view in one role (two views would need two timestamps in one row)."""
    for name in sorted(schema.control_tables):
        users = schema.users_of(name)
        if len(users) > 1:
            listed = ", ".join(f"{v} ({role})" for v, role in users)
            raise ProgrammingError(
                f"control table {name} is used by {listed}: a control table controls one view "
                "in one role; create one control table for each"
            )


def _check_rule_1(schema: CacheSchema) -> None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = [*path[path.index(name) :], name]
            raise UnsafeSchemaError(
                1,
                sorted(set(cycle)),
                f"the presence controls form a cycle {' -> '.join(cycle)}",
                "remove one PRESENCE ... IN edge of the cycle",
            )
        state[name] = 1
        for child in schema.children(name):
            visit(child, [*path, name])
        state[name] = 2

    for name in sorted(schema.views):
        visit(name, [])


def _fds(table: Table) -> list[FD]:
    every = frozenset(("", c) for c in table.column_names)
    return [FD(frozenset(("", c) for c in key), every) for key in table.candidate_keys()]


def determines(table: Table, lhs: tuple[str, ...], rhs: tuple[str, ...]) -> bool:
    """lhs -> rhs under the backend table's keys."""
    return {("", c) for c in rhs} <= closure({("", c) for c in lhs}, _fds(table))


def _check_rules_2_to_5(schema: CacheSchema, view: CachedView, catalog: Catalog) -> None:
    table = backend_table(catalog, view.name, view.table)
    if view.is_gray and view.completeness is not None:
        raise UnsafeSchemaError(
            2,
            [view.name],
            "it is gray (CONSISTENCY ROOT) and has COMPLETENESS control",
            "drop COMPLETENESS, or make the view white",
        )
    if len(view.presence) > 1 and not (
        view.consistency is not None and view.consistency.kind == "all"
    ):
        controls = ", ".join(p.control for p in view.presence)
        raise UnsafeSchemaError(
            3,
            [view.name, *sorted(p.control for p in view.presence)],
            f"{view.name} has {len(view.presence)} presence controls ({controls}) but is not "
            "CONSISTENCY ON ALL, so one row can sit in two overlapping regions",
            "declare CONSISTENCY ON ALL (and no CONSISTENCY ROOT)",
        )
    if view.is_gray:
        edge = view.presence[0]
        parent = schema.views[edge.control]
        parent_table = backend_table(catalog, parent.name, parent.table)
        if not any(set(key) <= set(edge.control_columns) for key in parent_table.candidate_keys()):
            keys = " or ".join("(" + ", ".join(k) + ")" for k in parent_table.candidate_keys())
            raise UnsafeSchemaError(
                4,
                [view.name, parent.name],
                f"{view.name} is controlled by {parent.name}({', '.join(edge.control_columns)}), "
                f"which is not a key of {parent.name} (keys: {keys}), so a row can have two "
                "parent rows",
                "control it by a key of the parent, or make it white with CONSISTENCY ON ALL",
            )
    if view.is_gray or view.is_fully_materialized:
        return
    controlled: list[tuple[str, tuple[str, ...]]] = []
    if view.consistency is not None and view.consistency.kind == "on":
        controlled.append(("CONSISTENCY", view.consistency.columns))
    if view.completeness is not None:
        controlled.append(("COMPLETENESS", view.completeness.columns))
    if len(controlled) == 2:
        (_, k1), (_, k2) = controlled
        if not (determines(table, k1, k2) or determines(table, k2, k1)):
            raise UnsafeSchemaError(
                5,
                [view.name],
                f"the consistency key ({', '.join(k1)}) and the completeness key "
                f"({', '.join(k2)}) do not determine one another, so their regions can "
                "partially overlap",
                "use keys where one functionally determines the other",
            )
    if len(view.presence) == 1:
        k0 = view.presence[0].columns
        for what, key in controlled:
            if not determines(table, k0, key):
                raise UnsafeSchemaError(
                    5,
                    [view.name],
                    f"the presence key ({', '.join(k0)}) does not determine the {what.lower()} "
                    f"key ({', '.join(key)}), so one presence region can straddle two "
                    f"{what.lower()} regions",
                    f"choose a {what.lower()} key that the presence key determines",
                )
