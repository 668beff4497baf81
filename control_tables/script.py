"""A cache DDL script applied to a cache schema (§3.3-3.6, SPEC §3), without touching any
file: the schema the whole script leads to - forward references within the script allowed -
checked for validity and Rules 1-5, and the create / drop actions that get it there. The store
carries the actions out in one transaction (`cache.store.cache_file`); tests and tools can build
schemas with it alone."""

from __future__ import annotations

from collections.abc import Sequence

from control_tables.safety import backend_table, check_schema, view_key
from control_tables.schema import CacheSchema, view_from_statement
from sql_ext import CreateCachedView, CreateControlTable, DropCacheObject, Statement
from sql_ext.catalog import Catalog
from sql_ext.errors import ProgrammingError

Action = tuple[str, str]  # ("create" | "drop", object name), in script order


def apply_script(
    schema: CacheSchema, statements: Sequence[Statement], catalog: Catalog
) -> tuple[CacheSchema, list[Action]]:
    """The schema after ``statements`` and the actions that make it, or the error of the
    first statement or rule the script breaks."""
    actions: list[tuple[str, str]] = []  # ("create"|"drop", name) in script order
    for statement in statements:
        if isinstance(statement, CreateControlTable):
            _refuse_existing(schema, statement.name)
            schema = schema.with_control_table(statement)
            actions.append(("create", statement.name))
        elif isinstance(statement, CreateCachedView):
            _refuse_existing(schema, statement.name)
            table = backend_table(catalog, statement.name, statement.table)
            columns = statement.columns or table.column_names
            view = view_from_statement(
                statement, columns, view_key(statement.name, table, columns)
            )
            schema = schema.with_view(view)
            actions.append(("create", statement.name))
        elif isinstance(statement, DropCacheObject):
            kind = schema.kind_of(statement.name)
            if kind is None:
                if statement.if_exists:
                    continue
                raise ProgrammingError(
                    f"DROP {statement.object_kind.upper()} {statement.name}: there is no "
                    f"{statement.object_kind} {statement.name!r}"
                )
            if kind != statement.object_kind:
                raise ProgrammingError(
                    f"DROP {statement.object_kind.upper()} {statement.name}: "
                    f"{statement.name} is a {kind}; use DROP {kind.upper()}"
                )
            schema = schema.without(statement.name)
            actions.append(("drop", statement.name))
        else:
            raise ProgrammingError(
                "a cache schema script holds only CREATE CONTROL TABLE, CREATE CACHED VIEW "
                f"and DROP statements; found a {statement.kind} statement: "
                f"{statement.text.strip()[:60]!r}"
            )
    for name in [n for a, n in actions if a == "drop"]:
        users = [v for v, _ in schema.users_of(name)]
        if users and schema.kind_of(name) is None:
            holders = ", ".join(sorted(set(users)))
            raise ProgrammingError(
                f"cannot drop {name}: it is still a control of {holders}; "
                "drop or redefine those views first"
            )
    check_schema(schema, catalog)
    return schema, actions


def _refuse_existing(schema: CacheSchema, name: str) -> None:
    kind = schema.kind_of(name)
    if kind is not None:
        raise ProgrammingError(
            f"{kind} {name} already exists: drop it first (DROP {kind.upper()} {name}) or "
            "choose another name"
        )
