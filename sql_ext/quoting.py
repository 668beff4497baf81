"""Identifiers in generated SQL, quoted one way everywhere (PostgreSQL and DuckDB agree: double
quotes, an embedded quote doubled). Every SQL builder of the cache uses these."""

from __future__ import annotations

from collections.abc import Iterable

from sqlglot import exp


def ident(name: str) -> str:
    """``name`` as a quoted identifier: ``"name"``."""
    return '"' + name.replace('"', '""') + '"'


def idents(names: Iterable[str], qualifier: str | None = None) -> str:
    """A comma-separated column list, each quoted (and qualified: ``v."a", v."b"``)."""
    prefix = f"{qualifier}." if qualifier else ""
    return ", ".join(prefix + ident(n) for n in names)


def qualified(*parts: str) -> str:
    """A dotted name with every part quoted: ``"schema"."table"``."""
    return ".".join(ident(p) for p in parts)


def keys_in(
    names: Iterable[str], alias: str, relation: str, inner_names: Iterable[str] | None = None
) -> str:
    """``(alias."a", alias."b") IN (SELECT "a", "b" FROM relation)``: the row's key is among
    the relation's (of keys, never NULL; named ``inner_names`` there when they differ).
    DuckDB runs it as a hash semi-join; the same test written as a correlated EXISTS
    materializes the whole outer table first (30x slower over a table of millions of
    rows)."""
    names = list(names)
    left = ", ".join(f"{alias}.{ident(n)}" for n in names)
    inner = ", ".join(ident(n) for n in (names if inner_names is None else inner_names))
    if len(names) > 1:
        left = f"({left})"
    return f"{left} IN (SELECT {inner} FROM {relation})"


def equal_columns(
    names: Iterable[str], left: str, right: str, right_names: Iterable[str] | None = None
) -> str:
    """``left."a" = right."a" AND ...``: rows of two relations agreeing on the columns (named
    ``right_names`` on the right, when they differ)."""
    names = list(names)
    others = list(right_names) if right_names is not None else names
    return " AND ".join(
        f"{left}.{ident(a)} = {right}.{ident(b)}" for a, b in zip(names, others, strict=True)
    )


def folded(node: exp.Expr | None) -> str:
    """A name as PostgreSQL reads it: unquoted folded to lower case, quoted as written (an
    identifier, or the name part of a column, table or alias)."""
    if node is None:
        return ""
    name = node if isinstance(node, exp.Identifier) else node.args.get("this")
    if isinstance(name, exp.Identifier):
        return str(name.this) if name.quoted else str(name.this).lower()
    return node.name.lower()


def folded_text(name: str) -> str:
    """A name written in SQL, as SQL folds it: "Quoted" as written, else in lower case."""
    if len(name) > 1 and name.startswith('"') and name.endswith('"'):
        return name[1:-1].replace('""', '"')
    return name.lower()


def qualifier(column: exp.Column) -> str:
    """The input name a column reference is qualified with, folded ("" when none)."""
    table = column.args.get("table")
    return folded(table) if table is not None else ""


def output_name(projection: exp.Expr) -> str:
    """The name of a select-list item's output column, as PostgreSQL names it."""
    if isinstance(projection, exp.Alias):
        return folded(projection.args.get("alias"))
    if isinstance(projection, exp.Column):
        return folded(projection)
    return projection.alias_or_name.lower()
