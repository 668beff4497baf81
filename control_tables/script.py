"""A cache DDL script applied to a cache schema (§3.3-3.6), without touching any
file: the schema the whole script leads to - forward references within the script allowed -
checked for validity and Rules 1-5, and the create / drop actions that get it there. The store
carries the actions out in one transaction (`cache.store.cache_file`); tests and tools can build
schemas with it alone."""

from __future__ import annotations

import re
from collections.abc import Sequence

from control_tables.derived import check_derived
from control_tables.safety import backend_table, check_schema, view_key
from control_tables.schema import CacheSchema, view_from_statement
from sql_ext import CreateCachedView, CreateControlTable, DropCacheObject, Statement
from sql_ext.catalog import Catalog
from sql_ext.ddl import position_in_script
from sql_ext.errors import NotSupportedError, PositionedError, ProgrammingError

Action = tuple[str, str]  # ("create" | "drop", object name), in script order


def apply_script(
    schema: CacheSchema, statements: Sequence[Statement], catalog: Catalog
) -> tuple[CacheSchema, list[Action]]:
    """The schema after ``statements`` and the actions that make it, or the error of the
    first statement or rule the script breaks, with the line and column in the script of the
    statement it is about (of the name it quotes, when the statement holds it)."""
    try:
        return _apply(schema, statements, catalog)
    except (ProgrammingError, NotSupportedError) as exc:
        _locate(exc, statements)
        raise


def _apply(
    schema: CacheSchema, statements: Sequence[Statement], catalog: Catalog
) -> tuple[CacheSchema, list[Action]]:
    actions: list[tuple[str, str]] = []  # ("create"|"drop", name) in script order
    for statement in statements:
        try:
            schema = _apply_one(schema, statement, catalog, actions)
        except (ProgrammingError, NotSupportedError) as exc:
            _place(exc, statement)  # about this statement, whatever else it names
            raise
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


def _apply_one(
    schema: CacheSchema, statement: Statement, catalog: Catalog, actions: list[Action]
) -> CacheSchema:
    if isinstance(statement, CreateControlTable):
        _refuse_existing(schema, statement.name)
        schema = schema.with_control_table(statement)
        actions.append(("create", statement.name))
    elif isinstance(statement, CreateCachedView) and statement.derivation is not None:
        _refuse_existing(schema, statement.name)
        resolved = check_derived(statement, catalog)
        assert statement.columns is not None
        view = view_from_statement(statement, statement.columns, resolved.key)
        schema = schema.with_view(view)
        actions.append(("create", statement.name))
    elif isinstance(statement, CreateCachedView):
        _refuse_existing(schema, statement.name)
        table = backend_table(catalog, statement.name, statement.table)
        columns = statement.columns or table.column_names
        view = view_from_statement(statement, columns, view_key(statement.name, table, columns))
        schema = schema.with_view(view)
        actions.append(("create", statement.name))
    elif isinstance(statement, DropCacheObject):
        kind = schema.kind_of(statement.name)
        if kind is None:
            if statement.if_exists:
                return schema
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
        if ("create", statement.name) in actions:  # made by this script: never made at all
            actions.remove(("create", statement.name))
        else:
            actions.append(("drop", statement.name))
    else:
        raise ProgrammingError(
            "a cache schema script holds only CREATE CONTROL TABLE, CREATE CACHED VIEW "
            f"and DROP statements; found a {statement.kind} statement: "
            f"{statement.text.strip()[:60]!r}"
        )
    return schema


def _refuse_existing(schema: CacheSchema, name: str) -> None:
    kind = schema.kind_of(name)
    if kind is not None:
        raise ProgrammingError(
            f"{kind} {name} already exists: drop it first (DROP {kind.upper()} {name}) or "
            "choose another name"
        )
    # DuckDB, which holds every cache object as a table, matches names case-insensitively
    # (quoted or not): "Copy" and copy would be one table
    for other in [*schema.views, *schema.control_tables]:
        if other.casefold() == name.casefold():
            raise ProgrammingError(
                f"{name} and {other} differ only in case: the cache file matches names "
                "case-insensitively, so both cannot be cache objects; choose another name"
            )


Placed = CreateControlTable | CreateCachedView | DropCacheObject  # statements with a position


def _locate(exc: ProgrammingError | NotSupportedError, statements: Sequence[Statement]) -> None:
    """Give an error found checking the whole script the position of the statement whose
    object its message names first."""
    found = [
        (named.start(), statement)
        for statement in statements
        if isinstance(statement, Placed) and (named := _word(statement.name).search(str(exc)))
    ]
    if found:
        _place(exc, min(found, key=lambda f: f[0])[1])


def _place(exc: ProgrammingError | NotSupportedError, statement: Statement) -> None:
    """Give an error about ``statement`` its line and column in the script: of the first name
    the message quotes that the statement holds, else of the statement's object name. The
    error is changed in place (its class stays); one that has a position keeps it."""
    if getattr(exc, "line", None) is not None or not isinstance(statement, Placed):
        return
    message = str(exc)
    quoted = (_word(q).search(statement.text) for q in re.findall(r"'([^'\s]+)'", message))
    hit = next((h for h in quoted if h), None) or _word(statement.name).search(statement.text)
    at = hit.start() if hit else len(statement.text) - len(statement.text.lstrip())
    line, col = position_in_script(statement, at)
    exc.args = (f"line {line}, column {col}: {message}",)
    exc.line, exc.col = line, col  # type: ignore[union-attr]
    if isinstance(exc, PositionedError):
        exc.reason = message


def _word(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w$]){re.escape(name)}(?![\w$])", re.IGNORECASE)
