"""Where DuckDB would compute differently from PostgreSQL, and how the local statement is
rewritten to compute what PostgreSQL computes (SPEC §5.11) - or, where it cannot be made
exactly equal, why the statement stays remote.

* ``char(n)``: the cache stores char(n) values without their blank padding, which is how
  PostgreSQL reads them in comparisons, functions and concatenation. What a char(n) value is
  compared with - a literal, a parameter, a ``varchar`` - is compared without trailing blanks
  too (``rtrim``). A pattern (LIKE, SIMILAR TO, a regular expression) and the functions that
  print a value (``concat``, ``format``, ``octet_length``) see the padding: the value is padded
  again for them (``rpad``). An output column PostgreSQL types as char without n is padded by
  the cache to the n its values come from (``output_widths``).
* numbers: a cast to ``numeric`` without a scale keeps the value's own scale in PostgreSQL and
  gets scale 3 in DuckDB (``decimal_scales``); a literal in exponent form is a numeric in
  PostgreSQL and a double in DuckDB (``exact_numbers``).
* what cannot be matched exactly keeps the statement remote (``blocker``): sums and averages
  of floating-point values (the order of additions changes the last bits), rounding doubles,
  fields of ``extract`` with fractions DuckDB drops, casts that truncate or pad strings, a
  char(n) value given to a function the cache does not know, text ordered under a collation
  that is not byte order, columns with nondeterministic collations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from sqlglot import exp

from optimizer.expression_types import (
    PADDED_READER_NAMES,
    PADDED_READERS,
    TEXT_FUNCTIONS,
    TEXT_PREDICATES,
    VALUE_PRESERVING,
    ExpressionTypes,
    PgType,
    arguments,
    literal_scale,
)
from sql_ext import Query
from sql_ext.params import NODE_ID

_COMPARED = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ,
             exp.NullSafeNEQ)  # fmt: skip
_RANGES = (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Between)
_PATTERNS = (exp.Like, exp.ILike, exp.SimilarTo, exp.RegexpLike, exp.RegexpILike)
_SUMS = (exp.Sum, exp.Avg, exp.Stddev, exp.StddevPop, exp.StddevSamp, exp.Variance,
         exp.VariancePop, exp.Corr, exp.CovarPop, exp.CovarSamp)  # fmt: skip
# extract() fields whose value has a fraction in PostgreSQL (a numeric) and none in DuckDB
_FRACTIONAL_FIELDS = frozenset({"second", "seconds", "millisecond", "milliseconds", "ms",
                                "msec", "epoch", "julian"})  # fmt: skip
# Functions that take a char(n) value in a known way (besides comparisons and patterns)
_CHAR_SAFE = (*VALUE_PRESERVING, *TEXT_FUNCTIONS, *TEXT_PREDICATES, *PADDED_READERS,
              exp.Length, exp.StrPosition, exp.Ascii, exp.Count, exp.Cast, exp.Collate,
              exp.Distinct, exp.Window, exp.Paren, exp.Is)  # fmt: skip
_KNOWN_READERS = (*_CHAR_SAFE, *_COMPARED, *_RANGES, *_PATTERNS, exp.In, exp.Any, exp.All,
                  exp.Exists)
_DECIMAL_DIGITS = 38  # DuckDB's widest DECIMAL


@dataclass(frozen=True)
class Semantics:
    """The rewrites of the local statement, by node number (`sql_ext.params.number_nodes`)."""

    rtrim: frozenset[int] = frozenset()  # compared as char(n): without trailing blanks
    rpad: Mapping[int, int] = field(default_factory=dict)  # char(n) values read padded -> n
    decimal_scales: Mapping[int, int] = field(default_factory=dict)  # ::numeric -> its scale
    exact_numbers: Mapping[int, str] = field(default_factory=dict)  # 1e3 -> CAST('1000' ...)
    doubles: frozenset[int] = frozenset()  # date_part(): double precision in PostgreSQL
    # char output -> the n the cache pads its values to (0: they are padded in the statement)
    output_widths: Mapping[int, int] = field(default_factory=dict)
    blocker: str | None = None  # why DuckDB cannot answer as PostgreSQL, or None


def pg_semantics(query: Query, types: ExpressionTypes, database_byte_order: bool) -> Semantics:
    found = _Finder(types, database_byte_order)
    for node in query.tree.walk():
        found.visit(node)
        if found.blocker is not None:
            return Semantics(blocker=found.blocker)
    widths = {}
    for index in range(len(query.tree.selects) if isinstance(query.tree, exp.Query) else 0):
        typed = types.output(query.tree, index)
        if typed.kind == "char" and typed.width is not None:
            widths[index] = typed.width
        elif typed.kind == "char":
            found.pad_output(query.tree, index)
            if found.blocker is not None:
                return Semantics(blocker=found.blocker)
            widths[index] = 0
    return Semantics(
        rtrim=frozenset(found.rtrim),
        rpad=found.rpad,
        decimal_scales=found.decimal_scales,
        exact_numbers=found.exact_numbers,
        doubles=frozenset(found.doubles),
        output_widths=widths,
    )


class _Finder:
    def __init__(self, types: ExpressionTypes, database_byte_order: bool) -> None:
        self.types = types
        self.database_byte_order = database_byte_order
        self.rtrim: set[int] = set()
        self.rpad: dict[int, int] = {}
        self.decimal_scales: dict[int, int] = {}
        self.exact_numbers: dict[int, str] = {}
        self.doubles: set[int] = set()
        self.blocker: str | None = None

    def type(self, node: exp.Expr) -> PgType:
        return self.types.of(node)

    def visit(self, node: exp.Expr) -> None:
        if isinstance(node, exp.Column):
            if not self.type(node).deterministic:
                self.blocker = (f"it reads {node.sql(dialect='postgres')}, whose collation is "
                                "nondeterministic")  # fmt: skip
            return
        if isinstance(node, exp.Literal):
            self._number(node)
            return
        if isinstance(node, (*_COMPARED, exp.Between, exp.In, exp.Nullif, exp.Greatest,
                             exp.Least)):
            self._compared(node, _operands(node))
        if isinstance(node, exp.Case) and node.args.get("this") is not None:
            whens = [i.this for i in node.args.get("ifs") or []]
            self._compared(node, [node.this, *whens])
        if isinstance(node, (*_RANGES, exp.Ordered, exp.Min, exp.Max, exp.Greatest, exp.Least)):
            self._ordered(node)
        if isinstance(node, _PATTERNS):
            self._padded(node.this, f"it matches {_short(node.this)} with a pattern")
        if isinstance(node, PADDED_READERS) or (
            isinstance(node, exp.Anonymous) and node.name.lower() in PADDED_READER_NAMES
        ):
            for argument in arguments(node):
                self._padded(argument, f"it prints {_short(argument)} with {_name(node)}")
        if isinstance(node, exp.Cast):
            self._cast(node)
        if isinstance(node, exp.Extract):
            unit = node.this.name.lower() if isinstance(node.this, exp.Expr) else ""
            if unit in _FRACTIONAL_FIELDS:
                self.blocker = (f"it extracts {unit}, which PostgreSQL gives with a fraction "
                                "and DuckDB without")  # fmt: skip
        if isinstance(node, exp.Anonymous) and node.name.lower() == "date_part":
            self._date_part(node)
        if isinstance(node, _SUMS) and self.type(node.this).kind in ("float", "unknown"):
            self.blocker = (f"it computes {_name(node)} over floating-point values (the order "
                            "of additions changes the result's last bits)")  # fmt: skip
        if isinstance(node, exp.Round) and self.type(node.this).kind in ("float", "unknown"):
            self.blocker = "it rounds a double (PostgreSQL rounds half to even, DuckDB not)"
        if isinstance(node, exp.Substring):
            start = node.args.get("start")
            if start is not None and not (isinstance(start, exp.Literal) and start.is_int
                                          and int(start.this) >= 1):  # fmt: skip
                self.blocker = ("it takes a substring from a position that may be below 1 "
                                "(PostgreSQL and DuckDB count those differently)")
        if isinstance(node, exp.Func) and not isinstance(node, _KNOWN_READERS):
            for argument in arguments(node):
                if self.type(argument).kind in ("char", "unknown"):
                    self.blocker = (f"it passes {_short(argument)} to {_name(node)}, whose "
                                    "reading of char(n) padding the cache does not know")
                    return

    # -- char(n) -------------------------------------------------------------------------------

    def _compared(self, node: exp.Expr, operands: list[exp.Expr]) -> None:
        """Operands compared with each other: with a char(n) one, literals, parameters and
        varchar values are compared as char(n) (PostgreSQL's bpchar operators)."""
        typed = [(o, self.type(o)) for o in operands]
        kinds = {t_.kind for _, t_ in typed}
        if "char" not in kinds:
            if "unknown" in kinds and kinds & {"string", "varchar", "char", "text"}:
                self.blocker = (f"it compares {_short(node)}, whose operand types the cache "
                                "cannot tell")  # fmt: skip
            return
        for operand, found in typed:
            if found.kind == "unknown":
                self.blocker = (f"it compares a char(n) value with {_short(operand)}, whose "
                                "type the cache cannot tell")  # fmt: skip
                return
            if found.kind in ("string", "varchar"):
                if isinstance(operand, exp.Subquery | exp.Select | exp.Union):
                    self.blocker = (f"it compares a char(n) value with a subquery of "
                                    f"{found.kind} values")  # fmt: skip
                    return
                self.rtrim.add(operand.meta[NODE_ID])

    def _padded(self, value: exp.Expr, what: str) -> None:
        """A value read with its padding: a char(n) value padded again to n."""
        found = self.type(value)
        if found.kind == "char" and found.width is not None:
            self.rpad[value.meta[NODE_ID]] = found.width
        elif found.kind in ("char", "unknown"):
            self.blocker = f"{what}, a char value whose padding the cache cannot tell"

    def pad_output(self, query: exp.Expr, index: int) -> None:
        """An output PostgreSQL types as char without n (char(n) values of several n, or
        with strings: ``coalesce(code, 'none')``) prints each value as it is: the char(n)
        values it may come from are padded in the statement. Where the padded values would be
        compared (DISTINCT, GROUP BY, ordering by the output, a UNION) that cannot be done."""
        if not isinstance(query, exp.Select) or query.args.get("distinct") or query.args.get(
            "group"
        ):
            self.blocker = ("it outputs char values of several lengths, compared as PostgreSQL "
                            "compares char (trailing blanks ignored)")  # fmt: skip
            return
        output = query.expressions[index]
        output = output.this if isinstance(output, exp.Alias) else output
        order = query.args.get("order")
        for ordered in order.expressions if order is not None else []:
            if (_order_target(ordered) or ordered.this) == output:
                self.blocker = f"it orders by {_short(output)}, char values of several lengths"
                return
        self._pad_values(output)

    def _pad_values(self, node: exp.Expr) -> None:
        if isinstance(node, exp.Paren):
            self._pad_values(node.this)
        elif isinstance(node, exp.Case):
            for value in [i.args["true"] for i in node.args.get("ifs") or []] + [
                node.args.get("default")
            ]:
                if value is not None:
                    self._pad_values(value)
        elif isinstance(node, exp.Coalesce):
            for value in [node.this, *node.expressions]:
                self._pad_values(value)
        else:
            found = self.type(node)
            if found.kind == "char" and found.width is not None:
                self.rpad[node.meta[NODE_ID]] = found.width
            elif found.kind not in ("string", "null"):
                self.blocker = (f"it outputs {_short(node)} as char values whose padding the "
                                "cache cannot tell")  # fmt: skip

    # -- numbers and casts ---------------------------------------------------------------------

    def _number(self, node: exp.Literal) -> None:
        if node.is_string:
            return
        text = node.this
        digits = len(text.lower().partition("e")[0].replace(".", "").lstrip("-+0"))
        if digits > _DECIMAL_DIGITS:
            self.blocker = f"its number {text[:20]}... has more digits than DuckDB's decimals"
        elif "e" in text.lower():
            scale = literal_scale(text)
            if scale is None:
                return
            plain = format(Decimal(text), "f")
            if len(plain.replace(".", "").lstrip("-0")) > _DECIMAL_DIGITS:
                self.blocker = f"its number {text} has more digits than DuckDB's decimals"
                return
            self.exact_numbers[node.meta[NODE_ID]] = (
                f"CAST('{plain}' AS DECIMAL({_DECIMAL_DIGITS}, {scale}))")

    def _date_part(self, node: exp.Anonymous) -> None:
        """date_part() is double precision in PostgreSQL, an integer in DuckDB."""
        field = node.expressions[0] if node.expressions else None
        unit = field.name.lower() if isinstance(field, exp.Literal) and field.is_string else None
        if unit is None or unit in _FRACTIONAL_FIELDS:
            self.blocker = (f"it takes date_part({_short(field) if field else ''}), which "
                            "PostgreSQL may give with a fraction and DuckDB without")
        else:
            self.doubles.add(node.meta[NODE_ID])

    def _cast(self, node: exp.Cast) -> None:
        target = node.to
        name = target.sql(dialect="postgres").lower()
        inner = self.type(node.this)
        sized = bool(target.expressions)
        if target.this in (exp.DType.CHAR, exp.DType.NCHAR, exp.DType.BPCHAR) or (
            target.this in (exp.DType.VARCHAR, exp.DType.NVARCHAR) and sized
        ):
            self.blocker = (f"it casts to {name} (PostgreSQL pads or cuts values to the "
                            "length)")  # fmt: skip
        elif target.this == exp.DType.DECIMAL and not sized:
            scale = inner.scale if inner.kind == "numeric" else 0 if inner.kind == "integer" \
                else None  # fmt: skip
            if scale is None and isinstance(node.this, exp.Literal) and node.this.is_string:
                scale = literal_scale(node.this.this)
            if scale is None:
                self.blocker = (f"it casts {_short(node.this)} to numeric, whose scale the "
                                "cache cannot tell")  # fmt: skip
            else:
                self.decimal_scales[node.meta[NODE_ID]] = scale
        elif target.this == exp.DType.DECIMAL and inner.kind in ("float", "unknown"):
            self.blocker = f"it casts {_short(node.this)} to {name} from a double"
        elif target.this in (exp.DType.BINARY, exp.DType.VARBINARY) and inner.kind in (
            "char", "unknown"
        ):
            self._padded(node.this, f"it casts {_short(node.this)} to {name}")

    # -- collation -----------------------------------------------------------------------------

    def _ordered(self, node: exp.Expr) -> None:
        """Values ordered (ORDER BY, a range, MIN/MAX): text only where it is byte order."""
        values = [node.this] if isinstance(node, exp.Ordered | exp.Min | exp.Max) \
            else _operands(node)  # fmt: skip
        if isinstance(node, exp.Ordered):
            values = [_order_target(node) or node.this]
        for value in values:
            found = self.type(value)
            if (found.is_string and not found.byte_order) or (
                found.kind == "unknown" and not self.database_byte_order
            ):
                self.blocker = (f"it orders {_short(value)} under a collation that is not "
                                "byte order (DuckDB's)")  # fmt: skip
                return


def _operands(node: exp.Expr) -> list[exp.Expr]:
    if isinstance(node, exp.Between):
        return [node.this, node.args["low"], node.args["high"]]
    if isinstance(node, exp.In):
        query = node.args.get("query")
        return [node.this, *(node.expressions if query is None else [query])]
    if isinstance(node, exp.Greatest | exp.Least):
        return [node.this, *node.expressions]
    operands = [node.this, node.args.get("expression")]
    return [o for o in operands if isinstance(o, exp.Expr)]


def _order_target(ordered: exp.Ordered) -> exp.Expr | None:
    """What ``ORDER BY 2`` or ``ORDER BY alias`` of a SELECT orders by: its output."""
    select = ordered.parent.parent if ordered.parent is not None else None
    if not isinstance(select, exp.Select) or ordered.parent is not select.args.get("order"):
        return None
    key = ordered.this
    outputs = select.expressions
    if isinstance(key, exp.Literal) and key.is_int and 1 <= int(key.this) <= len(outputs):
        output = outputs[int(key.this) - 1]
        return output.this if isinstance(output, exp.Alias) else output
    if isinstance(key, exp.Column) and not key.table:
        for output in outputs:
            if isinstance(output, exp.Alias) and output.alias.lower() == key.name.lower():
                return output.this
    return None


def _name(node: exp.Expr) -> str:
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    return node.sql_name().lower() if isinstance(node, exp.Func) else node.key


def _short(node: exp.Expr) -> str:
    text = node.sql(dialect="postgres")
    return text if len(text) <= 60 else text[:57] + "..."
