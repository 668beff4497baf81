"""What every family of the allowlist builds on: an entry (`Entry`), the call it resolves
(`Call`: a node with its arguments' types), the backend settings entries depend on
(`Settings`), the helpers the families' signatures and rewrites share, and `Family`, the list
a family's module adds its entries to."""

from __future__ import annotations

import typing as t
from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from optimizer.postgres.types import FLOAT4, FLOAT8, NUMBERS, STRINGS, UNKNOWN, PgType

Result = PgType | str  # the result's type, or why the entry does not take these arguments
# an entry's answer that it is not the one for these arguments (another entry may be; it is not
# the reason given when none is)
NOT_MINE = ""


@dataclass(frozen=True)
class Settings:
    """What of the backend's configuration the entries depend on."""

    # the database's LC_CTYPE is C: upper, lower, ILIKE and ~* change ASCII letters only
    ascii_case: bool = True
    utf8: bool = True  # the server's encoding is UTF8 (octet_length counts UTF-8 bytes)
    # under another ctype: DuckDB's upper and lower proven PostgreSQL's ("equal"), or all
    # but upper('ß') ("sharp_s"), or not ("") (sql_ext.catalog.Catalog.unicode_case)
    unicode_case: str = ""


def no_keys(_node: exp.Expr, _keys: list[exp.Expr]) -> bool:
    """What a caller that knows no FROM items says of an aggregate's keys: nothing."""
    return False


class Call:
    """A node to resolve, with the types of its arguments; ``identifies_rows``: whether
    these columns, equal, single out one input row of an aggregate (a key of each of its
    FROM items: `optimizer.postgres.expression_types.ExpressionTypes.identifies_rows`)."""

    def __init__(
        self,
        node: exp.Expr,
        typer: Callable[[exp.Expr], PgType],
        settings: Settings,
        identifies_rows: Callable[[exp.Expr, list[exp.Expr]], bool] = no_keys,
    ) -> None:
        self.node = node
        self.typer = typer
        self.settings = settings
        self.identifies_rows = identifies_rows

    def type(self, key: str = "this") -> PgType:
        value = self.node.args.get(key)
        return self.typer(value) if isinstance(value, exp.Expr) else UNKNOWN

    def of(self, node: exp.Expr | None) -> PgType:
        return self.typer(node) if node is not None else UNKNOWN

    def arg(self, key: str = "this") -> exp.Expr | None:
        value = self.node.args.get(key)
        return value if isinstance(value, exp.Expr) else None


@dataclass(frozen=True)
class Entry:
    """One form DuckDB computes as PostgreSQL does."""

    name: str  # how documents and reasons name it: "substring(text, int, int)"
    forms: tuple[type[exp.Expr] | str, ...]  # sqlglot classes, or names of calls it leaves as is
    signature: Callable[[Call], Result]
    rewrite: Callable[[exp.Expr], exp.Expr] | None = None  # the DuckDB form (None: as it is)
    proofs: tuple[str, ...] = ()  # expressions over the edge table, answered as PostgreSQL does
    raises: tuple[str, ...] = ()  # expressions PostgreSQL raises for: the cache raises the same
    ctype: str = "C"  # the database ctype its proofs run under (its signature needs it)


# -- helpers for signatures ---------------------------------------------------------------------


def _literal_int(node: exp.Expr | None) -> int | None:
    """The value of an integer literal (negative ones included), else None."""
    if isinstance(node, exp.Neg):
        inner = _literal_int(node.this)
        return -inner if inner is not None else None
    if isinstance(node, exp.Paren):
        return _literal_int(node.this)
    if isinstance(node, exp.Literal) and node.is_int:
        return int(node.this)
    return None


def _string_literal(node: exp.Expr | None) -> str | None:
    if isinstance(node, exp.Paren):
        return _string_literal(node.this)
    return node.this if isinstance(node, exp.Literal) and node.is_string else None


def _text(*types: PgType) -> PgType:
    return PgType(
        "text",
        byte_order=all(t_.byte_order for t_ in types if t_.is_string),
        collated=any(t_.collated for t_ in types if t_.is_string),
    )


def _own_collation(call: Call, *keys: str) -> str | None:
    """Why case mapping is not the cache's where an argument carries a collation of its own
    (whose ctype, not the database's, maps case in PostgreSQL), or None."""
    if any(call.type(k).collated for k in keys if call.arg(k) is not None):
        return (
            f"it takes {call.node.key} of a value under a collation of its own (whose ctype, "
            "not the database's, maps its case)"
        )
    return None


def _strings(*types: PgType) -> bool:
    return all(t_.kind in STRINGS | {"null"} for t_ in types)


def _integers(*types: PgType) -> bool:
    return all(t_.kind in ("integer", "null") for t_ in types)


def _wider_integer(a: PgType, b: PgType) -> PgType:
    """The integer type of an operator over two integers: the wider one (int4 at least)."""
    return PgType("integer", max(a.width or 4, b.width or 4))


def _exact(*types: PgType) -> bool:
    """Integers and numerics (and NULL)."""
    return all(t_.kind in ("integer", "numeric", "null") for t_ in types)


def _scale(*types: PgType, rule: Callable[[list[int]], int]) -> int | None:
    """A numeric result's display scale from its operands' (None if one is not known)."""
    scales = [t_.as_numeric().scale if t_.kind != "null" else 0 for t_ in types]
    if any(s is None for s in scales):
        return None
    return rule(t.cast(list[int], scales))


def _floating(a: PgType, b: PgType) -> PgType | None:
    """The type of arithmetic on two numbers one of which is floating point: real only when
    both are real (PostgreSQL widens a real to double precision for anything else, and the
    local statement does too: `optimizer.postgres.semantics`); None when neither is floating."""
    kinds = {a.kind, b.kind} - {"null"}
    if "float" not in kinds or not kinds <= NUMBERS:
        return None
    floats = [t_ for t_ in (a, b) if t_.kind == "float"]
    return FLOAT4 if len(floats) == 2 and all(t_.width == 4 for t_ in floats) else FLOAT8


def _func(name: str, *args: exp.Expr) -> exp.Expr:
    return exp.Anonymous(this=name, expressions=list(args))


def _error_if(condition: exp.Expr, message: str, value: exp.Expr) -> exp.Expr:
    """``CASE WHEN condition THEN error(message) ELSE value END``: DuckDB raises where
    PostgreSQL raises (the cache then asks the backend, which raises its own error)."""
    return exp.Case(
        ifs=[exp.If(this=condition, true=_func("error", exp.Literal.string(message)))],
        default=value,
    )


_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LOWER = _UPPER.lower()


def _ascii_map(node: exp.Expr, source: str, target: str) -> exp.Expr:
    return exp.Translate(this=node, from_=exp.Literal.string(source), to=exp.Literal.string(target))


Forms = type[exp.Expr] | str | tuple[type[exp.Expr] | str, ...]


class Family:
    """One family's entries, in the order its module lists them (`table` joins the families in
    a fixed order: of the entries for one form, the first whose signature takes the arguments
    resolves the node)."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def entry(
        self,
        name: str,
        forms: Forms,
        signature: Callable[[Call], Result],
        *,
        rewrite: Callable[[exp.Expr], exp.Expr] | None = None,
        proofs: tuple[str, ...] = (),
        raises: tuple[str, ...] = (),
        ctype: str = "C",
    ) -> None:
        self.entries.append(
            Entry(
                name,
                forms if isinstance(forms, tuple) else (forms,),
                signature,
                rewrite,
                proofs,
                raises,
                ctype,
            )
        )
