"""What PostgreSQL would type an expression as, as far as DuckDB's answer depends on it (SPEC
§5.11): a small inference over the statement's tree, without the backend.

It knows the classes that matter for rewriting and routing - blank-padded ``char(n)`` (with n
when every value is a char(n) value of one n), ``varchar``, ``text``, an untyped string (a
literal or parameter PostgreSQL types by its context), integers, numerics (with the declared
scale of a column), floats - and whether text is collated by bytes, as DuckDB orders it. An
expression it cannot type is ``unknown``; rules that depend on the type then keep the
statement remote.
"""

from __future__ import annotations

import typing as t
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation

from sqlglot import exp

from sql_ext import Block, Query, Source
from sql_ext.catalog import Catalog, Column

Kind = t.Literal["char", "varchar", "text", "string", "integer", "numeric", "float", "null",
                 "other", "unknown"]  # fmt: skip
STRINGS = frozenset({"char", "varchar", "text", "string"})
NUMBERS = frozenset({"integer", "numeric", "float"})


@dataclass(frozen=True)
class PgType:
    kind: Kind
    # char: n, when every value is a char(n) value of that one n; integer: bytes (2, 4, 8)
    width: int | None = None
    scale: int | None = None  # numeric: the declared scale, when every value has it
    byte_order: bool = True  # strings: collated by bytes (C), as DuckDB compares text
    deterministic: bool = True  # strings: equal only when byte-equal

    @property
    def is_string(self) -> bool:
        return self.kind in STRINGS


NULL = PgType("null")
OTHER = PgType("other")
UNKNOWN = PgType("unknown")
NUMERIC = PgType("numeric")
FLOAT = PgType("float")
INT2, INT4, INT8 = PgType("integer", 2), PgType("integer", 4), PgType("integer", 8)

_INTEGER_NAMES = {"smallint": INT2, "int2": INT2, "integer": INT4, "int": INT4, "int4": INT4,
                  "bigint": INT8, "int8": INT8}  # fmt: skip
_FLOAT_NAMES = ("real", "double precision", "float4", "float8", "double", "float")


def column_type(column: Column, database_byte_order: bool) -> PgType:
    """A catalog column's type (``format_type`` text) as a `PgType`."""
    return _declared(column.type, column.byte_order if column.byte_order is not None
                     else database_byte_order, column.deterministic)  # fmt: skip


def _declared(name: str, byte_order: bool = True, deterministic: bool = True) -> PgType:
    text = name.strip().lower()
    base, _, rest = text.partition("(")
    base = base.strip()
    inside = rest.rstrip(")").split(",")
    if base in ("character", "char", "bpchar"):
        width = int(inside[0]) if inside[0].strip().isdigit() else (1 if not rest else None)
        return PgType("char", width=width, byte_order=byte_order, deterministic=deterministic)
    if base in ("character varying", "varchar"):
        return PgType("varchar", byte_order=byte_order, deterministic=deterministic)
    if base in ("text", "name"):
        return PgType("text", byte_order=byte_order, deterministic=deterministic)
    if base in _INTEGER_NAMES:
        return _INTEGER_NAMES[base]
    if base in ("numeric", "decimal"):
        scale = inside[1].strip() if len(inside) == 2 else ("0" if rest else "")
        return PgType("numeric", scale=int(scale) if scale.isdigit() else None)
    if base in _FLOAT_NAMES:
        return FLOAT
    return OTHER


# Functions whose result keeps the type of their value arguments (PostgreSQL's "anyelement"
# family): CASE, COALESCE, NULLIF, GREATEST, LEAST, MIN, MAX, ...
VALUE_PRESERVING = (exp.Case, exp.If, exp.Coalesce, exp.Nullif, exp.Greatest, exp.Least,
                    exp.Min, exp.Max, exp.AnyValue, exp.First, exp.Last, exp.FirstValue,
                    exp.LastValue, exp.Lag, exp.Lead, exp.NthValue)  # fmt: skip
# Functions returning text from text arguments: a char(n) argument is read as text (its
# padding stripped), exactly as the cache stores it.
TEXT_FUNCTIONS = (exp.DPipe, exp.Upper, exp.Lower, exp.Substring, exp.Trim, exp.Replace,
                  exp.Left, exp.Right, exp.Pad, exp.Reverse, exp.MD5, exp.SplitPart,
                  exp.GroupConcat, exp.Translate, exp.Repeat, exp.RegexpReplace,
                  exp.Initcap)  # fmt: skip
INTEGER_FUNCTIONS = (exp.Length, exp.StrPosition, exp.Ascii)
# Functions that read a char(n) value with its padding (they print it: its output function)
PADDED_READERS = (exp.Concat, exp.ConcatWs, exp.Format)
PADDED_READER_NAMES = frozenset({"octet_length"})
# ... and functions whose arguments are text, returning a boolean
TEXT_PREDICATES = (exp.StartsWith,)


class ExpressionTypes:
    """Types of a statement's expressions; ``resolve``: a column's source in a block."""

    def __init__(
        self,
        query: Query,
        catalog: Catalog,
        resolve: Callable[[Block, exp.Column], tuple[Source, str] | None],
    ) -> None:
        self.query = query
        self.catalog = catalog
        self._resolve = resolve
        self._memo: dict[int, PgType] = {}
        self._visiting: set[int] = set()
        # a string literal or parameter is collated as the database is
        self._string = PgType("string", byte_order=catalog.text_byte_order)

    def of(self, node: exp.Expr, block: Block | None = None) -> PgType:
        """The type of an expression (``block``: the SELECT block it is evaluated in; found
        from the tree when not given)."""
        key = id(node)
        found = self._memo.get(key)
        if found is not None:
            return found
        if key in self._visiting:
            return UNKNOWN  # a recursive CTE reads itself
        self._visiting.add(key)
        try:
            if block is None:
                block = self.block_of(node)
            found = self._infer(node, block)
        finally:
            self._visiting.discard(key)
        self._memo[key] = found
        return found

    def block_of(self, node: exp.Expr) -> Block | None:
        return self.query.analysis.enclosing(node)

    def output(self, select: exp.Expr, index: int) -> PgType:
        """The type of a query expression's output column (both sides of a UNION)."""
        types = []
        for branch in self.query.analysis.body_blocks(select):
            projections = branch.select.expressions
            if index >= len(projections) or isinstance(projections[index], exp.Star):
                return UNKNOWN
            types.append(self.of(_unaliased(projections[index]), branch))
        return combine(types) if types else UNKNOWN

    # -- inference -----------------------------------------------------------------------------

    def _infer(self, node: exp.Expr, block: Block | None) -> PgType:
        if isinstance(node, exp.Column):
            return self._column(node, block)
        if isinstance(node, exp.Null):
            return NULL
        if isinstance(node, exp.Literal):
            if node.is_string:
                return self._string
            if node.is_int and abs(int(node.this)) < 2**63:
                return INT4 if abs(int(node.this)) < 2**31 else INT8
            return PgType("numeric", scale=literal_scale(node.this))
        if isinstance(node, exp.Placeholder | exp.Parameter):
            return self._string  # typed by its context (psycopg sends strings untyped)
        if isinstance(node, exp.Query):
            return self.output(node, 0)
        if isinstance(node, exp.Any | exp.All):
            return self.of(node.this, block)
        if isinstance(node, exp.Boolean | exp.Predicate | exp.Not | exp.And | exp.Or):
            return OTHER
        if isinstance(node, exp.Paren | exp.Neg | exp.Alias | exp.Window):
            return self.of(node.this, block)
        if isinstance(node, exp.Collate):
            inner = self.of(node.this, block)
            collation = node.expression.name if isinstance(node.expression,
                                                           exp.Expr) else ""  # fmt: skip
            return replace(inner, byte_order=byte_order_name(collation), deterministic=True)
        if isinstance(node, exp.Cast):
            return self._cast(node, block)
        if isinstance(node, exp.Subquery):
            return self.output(node.this, 0)
        if isinstance(node, exp.Case):
            values = [i.args["true"] for i in node.args.get("ifs") or []]
            if node.args.get("default") is not None:
                values.append(node.args["default"])
            return combine([self.of(v, block) for v in values])
        if isinstance(node, exp.If):
            values = [v for v in (node.args.get("true"), node.args.get("false")) if v is not None]
            return combine([self.of(v, block) for v in values])
        if isinstance(node, exp.Nullif):
            return self.of(node.this, block)
        if isinstance(node, exp.Lag | exp.Lead | exp.NthValue):
            return self.of(node.this, block)
        if isinstance(node, VALUE_PRESERVING):
            return combine([self.of(v, block) for v in arguments(node)])
        if isinstance(node, TEXT_FUNCTIONS):
            return PgType("text", byte_order=all(self.of(a, block).byte_order
                                                 for a in arguments(node)))  # fmt: skip
        if isinstance(node, INTEGER_FUNCTIONS):
            return INT4
        if isinstance(node, exp.Count):
            return INT8
        if isinstance(node, exp.Sum):
            inner = self.of(node.this, block)
            if inner.kind == "integer":  # sum(int2/int4) is bigint, sum(bigint) numeric
                return INT8 if (inner.width or 8) < 8 else PgType("numeric", scale=0)
            return inner if inner.kind in NUMBERS else UNKNOWN
        if isinstance(node, exp.Avg):
            inner = self.of(node.this, block)
            return FLOAT if inner.kind == "float" else NUMERIC if inner.kind in NUMBERS \
                else UNKNOWN  # fmt: skip
        if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Mod | exp.Div):
            return _arithmetic(self.of(node.this, block), self.of(node.expression, block))
        if isinstance(node, exp.Extract):
            return NUMERIC
        if isinstance(node, exp.Round | exp.Abs | exp.Ceil | exp.Floor):
            inner = self.of(node.this, block)
            return replace(inner, scale=None) if inner.kind in NUMBERS else UNKNOWN
        if isinstance(node, exp.Anonymous) and node.name.lower() == "date_part":
            return FLOAT
        if isinstance(node, PADDED_READERS):
            return PgType("text", byte_order=self._string.byte_order)
        typed = [self.of(a, block) for a in arguments(node)]
        if any(a.kind in ("char", "unknown") for a in typed):
            return UNKNOWN  # a function the inference does not know, over char(n) values
        strings = [a for a in typed if a.is_string]
        if strings:  # text, as far as comparisons with char(n) and ordering need to know
            return PgType("text", byte_order=all(a.byte_order for a in strings))
        return OTHER

    def _column(self, column: exp.Column, block: Block | None) -> PgType:
        if block is None:
            return UNKNOWN
        found = self._resolve(block, column)
        if found is None:
            return UNKNOWN
        source, name = found
        if source.is_table and not source.body:
            table = self.catalog.table(source.table or "")
            if table is None:
                return UNKNOWN  # a backend view: never answered locally
            declared = next((c for c in table.columns if c.name == name), None)
            return column_type(declared, self.catalog.text_byte_order) if declared \
                else UNKNOWN  # fmt: skip
        return self._derived(source, name)

    def _derived(self, source: Source, name: str) -> PgType:
        """A column of a derived table or CTE: its body's projection (every UNION branch)."""
        if not source.body:
            return UNKNOWN
        first = source.body[0]
        aliases = source.column_aliases
        for position, projection in enumerate(first.select.expressions):
            if isinstance(projection, exp.Star):
                return UNKNOWN if len(source.body) > 1 else self._star(first, name)
            label = aliases[position] if position < len(aliases) else projection.alias_or_name
            if label.lower() == name:
                types = []
                for branch in source.body:
                    projections = branch.select.expressions
                    if position >= len(projections) or isinstance(projections[position],
                                                                  exp.Star):  # fmt: skip
                        return UNKNOWN
                    types.append(self.of(_unaliased(projections[position]), branch))
                return combine(types)
        return UNKNOWN

    def _star(self, body: Block, name: str) -> PgType:
        """A column a derived table's ``SELECT *`` passes through."""
        return self._column(exp.column(name), body)

    def _cast(self, node: exp.Cast, block: Block | None) -> PgType:
        target = node.to.sql(dialect="postgres").lower()
        inner = self.of(node.this, block)
        if target.startswith(("char", "character", "bpchar")) and "varying" not in target:
            found = _declared(target)
            return replace(found, byte_order=inner.byte_order if inner.is_string else True)
        declared = _declared(target)
        if declared.is_string:
            return replace(declared, byte_order=inner.byte_order if inner.is_string else True)
        return declared


def combine(types: list[PgType]) -> PgType:
    """The type of a value that may come from any of several expressions (CASE branches,
    COALESCE arguments, UNION branches), as PostgreSQL resolves it; unknown when the inference
    cannot tell (strings of different kinds)."""
    known = [t_ for t_ in types if t_.kind != "null"]
    if not known:
        return NULL
    kinds = {t_.kind for t_ in known}
    byte_order = all(t_.byte_order for t_ in known)
    deterministic = all(t_.deterministic for t_ in known)
    if "unknown" in kinds:
        return UNKNOWN
    if kinds <= STRINGS:
        typed = kinds - {"string"}
        if not typed:  # PostgreSQL resolves untyped strings alone to text
            return PgType("text", byte_order=byte_order)
        if len(typed) > 1:
            return PgType("text", byte_order=byte_order) if "text" in typed else UNKNOWN
        kind = next(iter(typed))
        width = None
        if kind == "char" and "string" not in kinds:
            widths = {t_.width for t_ in known}
            width = widths.pop() if len(widths) == 1 else None
        return PgType(kind, width=width, byte_order=byte_order, deterministic=deterministic)
    if kinds <= NUMBERS:
        if "float" in kinds:
            return FLOAT
        if "numeric" in kinds:
            scales = {t_.scale for t_ in known}
            return PgType("numeric", scale=scales.pop() if len(scales) == 1 else None)
        return PgType("integer", max(t_.width or 8 for t_ in known))
    if kinds == {"other"}:
        return OTHER
    return UNKNOWN


def _arithmetic(left: PgType, right: PgType) -> PgType:
    kinds = {left.kind, right.kind}
    if not kinds <= NUMBERS | {"null", "string"}:
        return OTHER if "unknown" not in kinds else UNKNOWN
    if "float" in kinds:
        return FLOAT
    if "numeric" in kinds:
        return NUMERIC
    if kinds <= {"integer", "null"}:
        return PgType("integer", max(t_.width or 4 for t_ in (left, right)))
    return UNKNOWN


def byte_order_name(collation: str) -> bool:
    """Does a collation name (of a COLLATE clause) order by bytes?"""
    return collation.lower() in ("c", "posix", "ucs_basic", "pg_c_utf8")


def _unaliased(node: exp.Expr) -> exp.Expr:
    return node.this if isinstance(node, exp.Alias) else node


def arguments(node: exp.Expr) -> list[exp.Expr]:
    """A function's value arguments (not its names, type arguments or window clauses)."""
    found: list[exp.Expr] = []
    for key, value in node.args.items():
        if key in ("over", "partition_by", "order", "spec"):
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, exp.Expr) and not isinstance(item, exp.Identifier | exp.Var
                                                             | exp.DataType):  # fmt: skip
                found.append(item)
    return found


def literal_scale(text: str) -> int | None:
    """The scale PostgreSQL gives a numeric literal's text (``1.50`` 2, ``1.5e-3`` 4,
    ``1e3`` 0); None when it is not a number."""
    try:
        exponent = Decimal(text.strip()).as_tuple().exponent
    except InvalidOperation:
        return None
    return max(0, -exponent) if isinstance(exponent, int) else None
