"""Where DuckDB would compute differently from PostgreSQL, and how the local statement is
rewritten to compute what PostgreSQL computes - or, where it cannot be made
exactly equal, why the statement stays remote.

* only what the allowlist lists runs in DuckDB (`optimizer.postgres.allowlist`): every node that
  computes a value must be one of its entries for the types of its arguments (its rewrite, if
  it has one, is recorded here), every other node one of the parts a query is made of;

* ``char(n)``: the cache stores char(n) values without their blank padding, which is how
  PostgreSQL reads them in comparisons, functions and concatenation. What a char(n) value is
  compared with - a literal, a parameter, a ``varchar`` - is compared without trailing blanks
  too (``rtrim``), as are strings a CASE, COALESCE, GREATEST or UNION resolves to char, except
  where they are printed. A pattern (LIKE, SIMILAR TO, a regular expression) and the functions that
  print a value (``concat``, ``format``, ``octet_length``) see the padding: the value is padded
  again for them (``rpad``). An output column PostgreSQL types as char without n is padded by
  the cache to the n its values come from (``output_widths``).
* numbers: a cast to ``numeric`` without a scale keeps the value's own scale in PostgreSQL and
  gets scale 3 in DuckDB (``decimal_scales``); a literal in exponent form is a numeric in
  PostgreSQL and a double in DuckDB (``exact_numbers``).
* numerics carry a display scale per value: an output's scale, when every value has the same
  (``output_scales``), is given to the values DuckDB computes; a numeric printed as text is
  printed at its scale (``text_scales``); outputs whose values' scales differ row by row
  (``varying_scales``) stay remote unless the cache divides them (`optimizer.postgres.divisions`);
* what cannot be matched exactly keeps the statement remote (``blocker``): text ordered under
  a collation that is not byte order, columns with nondeterministic collations, char values of
  several lengths compared.
"""

from __future__ import annotations

import typing as t
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from sqlglot import exp

from optimizer.postgres import allowlist
from optimizer.postgres.divisions import SPREADS
from optimizer.postgres.expression_types import (
    PADDED_READER_NAMES,
    PADDED_READERS,
    ExpressionTypes,
    PgType,
    arguments,
)
from optimizer.postgres.numeric_scales import scale_bound, scale_expression
from optimizer.postgres.types import DECIMAL_DIGITS, STRINGS, combine, literal_scale
from sql_ext import Query
from sql_ext.nodes import ConstantList, CurrencyClause
from sql_ext.params import NODE_ID
from sql_ext.quoting import folded, output_name

_COMPARED = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ)
_RANGES = (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Between)
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)
_PATTERNS = (exp.Like, exp.ILike, exp.SimilarTo, exp.RegexpLike, exp.RegexpILike)
_TEXT_TYPES = frozenset({exp.DType.TEXT, exp.DType.VARCHAR})
_INTEGER_DIGITS = {2: 5, 4: 10, 8: 19}  # the decimal digits of each integer type's values


@dataclass(frozen=True)
class Semantics:
    """The rewrites of the local statement, by node number (`sql_ext.params.number_nodes`)."""

    rtrim: frozenset[int] = frozenset()  # compared as char(n): without trailing blanks
    rpad: Mapping[int, int] = field(default_factory=dict)  # char(n) values read padded -> n
    decimal_scales: Mapping[int, int] = field(default_factory=dict)  # ::numeric -> its scale
    decimal_digits: Mapping[int, int] = field(default_factory=dict)  # ... and its precision
    exact_numbers: Mapping[int, str] = field(default_factory=dict)  # 1e3 -> CAST('1000' ...)
    doubles: frozenset[int] = frozenset()  # date_part(): double precision in PostgreSQL
    # char output -> the n the cache pads its values to (0: they are padded in the statement)
    output_widths: Mapping[int, int] = field(default_factory=dict)
    # allowlist entries whose rewrite the node needs (`optimizer.postgres.allowlist.BY_NAME`)
    rewrites: Mapping[int, str] = field(default_factory=dict)
    # numeric outputs: the display scale every value has; outputs whose values' scales vary
    output_scales: Mapping[int, int] = field(default_factory=dict)
    varying_scales: frozenset[int] = frozenset()
    # numeric outputs whose values' scales vary: the DuckDB expression computing each one's
    # (optimizer.postgres.numeric_scales), computed beside it
    scale_columns: Mapping[int, exp.Expr] = field(default_factory=dict)
    # interval outputs that may hold months: DuckDB prints them, the converter reads them as
    # psycopg reads PostgreSQL's (a month is 30 days, a year 365; DuckDB's Python gives 360)
    printed_intervals: frozenset[int] = frozenset()
    text_scales: Mapping[int, int] = field(default_factory=dict)  # numeric printed as text
    # ... whose values' scales vary: the DuckDB expression of each value's, and the largest
    # it may be (the value is printed at that one, then cut to its own)
    printed_scales: Mapping[int, tuple[exp.Expr, int]] = field(default_factory=dict)
    # reads of a constant a grouping set groups by, other than as the output column that is
    # it: a scalar subquery of it for DuckDB, which would read the grouped value
    constant_reads: frozenset[int] = frozenset()
    # divisions, averages and variances printed as text: given as the cache's own function's
    # text of PostgreSQL's value (optimizer.analysis.analyze), not cast to a decimal
    printed_divisions: frozenset[int] = frozenset()
    # parameters PostgreSQL reads as a type of this kind: a string value must read alike in
    # DuckDB (`optimizer.postgres.allowlist.reads_alike`), else the backend answers
    parameters: Mapping[int, str] = field(default_factory=dict)
    # numerics of different scales combined (CASE, COALESCE, GREATEST, UNION, ...): DuckDB
    # keeps at most 38 digits and would round the larger scales away; each is cast to
    # DECIMAL(38, the largest scale) first
    widen: Mapping[int, int] = field(default_factory=dict)
    # where PostgreSQL reads a time in the session's time zone: a date, timestamp or literal
    # meeting a timestamp with time zone (``zoned``: placed in the zone), a timestamp with
    # time zone cast to a date or timestamp (``localized``: its wall time in the zone)
    zoned: frozenset[int] = frozenset()
    localized: frozenset[int] = frozenset()
    entries: frozenset[str] = frozenset()  # the allowlist entries the statement uses
    blocker: str | None = None  # why DuckDB cannot answer as PostgreSQL, or None


def pg_semantics(
    query: Query,
    types: ExpressionTypes,
    database_byte_order: bool,
    scale_of: t.Callable[[exp.Expr], t.Any] | None = None,
) -> Semantics:
    """The rewrites and blockers of a statement (``scale_of``: each value's display scale of a
    numeric, `optimizer.postgres.numeric_scales.DerivedScales.scale`; a derived table's column's
    unknown without it)."""
    found = _Finder(
        types,
        database_byte_order,
        query.tree,
        scale_of or (lambda n: scale_expression(n, types.of)),
    )
    for node in query.tree.walk(prune=lambda n: isinstance(n, CurrencyClause)):
        if isinstance(node, CurrencyClause):
            continue  # the cache's own clause: not sent anywhere
        found.visit(node)
        if found.blocker is not None:
            return Semantics(blocker=found.blocker)
    widths: dict[int, int] = {}
    scales: dict[int, int] = {}
    varying: set[int] = set()
    columns: dict[int, exp.Expr] = {}
    intervals: set[int] = set()
    for index in range(len(query.tree.selects) if isinstance(query.tree, exp.Query) else 0):
        typed = types.output(query.tree, index)
        if typed.kind == "array" and typed.element is not None:
            # (the converter gives its elements the n or the display scale of the element type)
            typed = typed.element
            if typed.kind == "char" and typed.width is not None:
                widths[index] = typed.width
            elif typed.kind == "numeric" and typed.scale is not None:
                scales[index] = typed.scale
            continue
        if typed.kind == "char" and typed.width is not None:
            widths[index] = typed.width
        elif typed.kind == "char":
            found.pad_output(query.tree, index)
            if found.blocker is not None:
                return Semantics(blocker=found.blocker)
            widths[index] = 0
        elif typed.kind == "numeric" and typed.scale is not None:
            scales[index] = typed.scale
        elif typed.kind == "numeric" and isinstance(
            fixed := _except_scale(
                query.tree, index, scale_of or (lambda n: scale_expression(n, types.of))
            ),
            int,
        ):
            scales[index] = fixed
        elif typed.kind == "numeric":
            scale = _per_row_scale(
                query.tree, index, scale_of or (lambda n: scale_expression(n, types.of))
            )
            if scale is None:
                varying.add(index)
            elif isinstance(scale, int):
                scales[index] = scale  # (one scale after all: min(coalesce(0.0, x)), say)
            else:
                columns[index] = scale
        elif typed.kind == "interval" and typed.months:
            if _deduplicated(query.tree):
                # (PostgreSQL's equal intervals - 1 mon 5 days and 35 days - are one row;
                # DuckDB's DISTINCT keeps both: found by the oracle)
                return Semantics(
                    blocker=f"it removes duplicates of intervals holding months (output "
                    f"column {index + 1}), which PostgreSQL compares by their length"
                )
            intervals.add(index)
    return Semantics(
        rtrim=frozenset(found.rtrim),
        rpad=found.rpad,
        decimal_scales=found.decimal_scales,
        decimal_digits=found.decimal_digits,
        exact_numbers=found.exact_numbers,
        doubles=frozenset(found.doubles),
        output_widths=widths,
        rewrites=found.rewrites,
        output_scales=scales,
        varying_scales=frozenset(varying),
        scale_columns=columns,
        printed_intervals=frozenset(intervals),
        text_scales=found.text_scales,
        printed_scales=found.printed_scales,
        constant_reads=frozenset(found.constant_reads),
        printed_divisions=frozenset(found.printed_divisions),
        parameters=found.parameters,
        widen=found.widen,
        zoned=frozenset(found.zoned),
        localized=frozenset(found.localized),
        entries=frozenset(found.entries),
    )


def _grouping_set_constants(node: exp.Expr) -> tuple[list[int], str | None]:
    """A constant among the expressions of a ROLLUP, CUBE or GROUPING SETS (or an output alias
    of one) is NULL in the sets without it - but only where an output column is that very
    expression: PostgreSQL takes what is merely built on it (``'x' || 'a'``, ``IS NULL`` in
    HAVING) for a constant, computed once, where DuckDB reads the grouped value there too. So
    those reads are given to DuckDB as a scalar subquery of the constant, which it does not
    take for the grouped expression (the node numbers returned). Stays remote: an integer
    (PostgreSQL reads it as an output column's position), a constant output column that is
    not the grouped expression as written (PostgreSQL may still take it for it: ``5`` for
    ``5::int``), ordering by or removing duplicates of it, a window, a subquery reading it
    (PostgreSQL's planner takes it for a constant there, and sorts and deduplicates nothing
    by it) (found by the oracle and a review)."""
    select = node.find_ancestor(exp.Select)
    if select is None:
        return [], "it groups by a grouping set outside a SELECT"
    aliased = {output_name(p): p.this for p in select.expressions if isinstance(p, exp.Alias)}
    constants = []
    others = []
    for written in _grouping_items(node):
        item = written
        if isinstance(item, exp.Column) and not item.table and folded(item) in aliased:
            item = aliased[folded(item)]  # (an output alias: what it names)
        if item.find(exp.Column) is not None:
            others.append(item)
            continue
        item = item.unnest()
        if isinstance(item, exp.Literal) and item.is_int:
            return [], (
                f"it groups by {_short(item)} in a grouping set, which PostgreSQL reads as an "
                "output column's position"
            )
        if isinstance(item, exp.Literal | exp.Boolean | exp.Null):
            return [], f"it groups by {_short(item)}, which PostgreSQL refuses (42601)"
        constants.append(item)
    if not constants:
        return [], None
    why = (
        f"it groups by {_short(constants[0])}, a constant, in a grouping set and "
        "{} (PostgreSQL's planner takes it for a constant there)"
    )
    if select.args.get("distinct") or select.find(exp.Window):
        return [], why.format("removes duplicates or uses a window")
    group = select.args.get("group")
    if group is not None:  # (the plain GROUP BY items, and those of other grouping sets)
        others += [
            e
            for e in group.expressions
            if not isinstance(e, exp.Rollup | exp.Cube | exp.GroupingSets)
            and e.find(exp.Column) is not None
        ]
        for sets in group.find_all(exp.Rollup, exp.Cube, exp.GroupingSets):
            if sets is not node:
                others += [e for e in _grouping_items(sets) if e.find(exp.Column) is not None]
    if any(n.unnest() == c for other in others for n in other.walk() for c in constants):
        # (DuckDB would no longer match the item holding it with its reads)
        return [], why.format("groups by an expression holding it")
    outputs = [_unaliased(p).unnest() for p in select.expressions]
    copies: set[int] = set()
    for output in outputs:
        if output.find(exp.Column, exp.AggFunc, exp.Query) is not None:
            continue
        # a constant output: the grouped one's first copy, or PostgreSQL may take it for it
        # (``5`` for ``5::int``, ``'x'::text || 'y'::text`` for ``'x' || 'y'::text``: its
        # parser folds literals' casts before it compares), or keep a later copy constant
        copy = next((i for i, c in enumerate(constants) if output == c), None)
        if copy is None or copy in copies:
            return [], why.format(f"outputs the constant {_short(output)} besides it")
        copies.add(copy)
    order = select.args.get("order")
    for ordered in order.expressions if order is not None else []:
        key = _order_target(ordered) or ordered.this
        if any(n.unnest() == c for n in key.walk() for c in constants):
            return [], why.format("orders by it")
    reads: list[int] = []
    having = select.args.get("having")
    places = [o for o in outputs if not any(o == c for c in constants)]  # (not the column)
    for place in [*places, *([having] if having is not None else [])]:
        for found in place.walk(prune=lambda n: isinstance(n, exp.AggFunc | exp.Query)):
            if not isinstance(found, exp.Paren) and any(found == c for c in constants):
                reads.append(found.meta[NODE_ID])
        for query in place.find_all(exp.Query):
            if any(any(n == c for n in query.walk()) for c in constants):
                return [], why.format("reads it in a subquery")
    return reads, None


def _grouping_items(node: exp.Expr) -> list[exp.Expr]:
    """The expressions a ROLLUP, CUBE or GROUPING SETS groups by (inside their parentheses)."""
    found: list[exp.Expr] = []
    for item in node.expressions:
        if isinstance(item, exp.Tuple | exp.Paren):
            inner = item.expressions if isinstance(item, exp.Tuple) else [item.this]
            for part in inner:
                found.extend(_grouping_items(part) if isinstance(part, exp.Tuple) else [part])
        elif isinstance(item, exp.Rollup | exp.Cube):
            found.extend(_grouping_items(item))
        else:
            found.append(item)
    return found


def _per_row_scale(
    top: exp.Expr, index: int, scale_of: t.Callable[[exp.Expr], t.Any]
) -> exp.Expr | int | None:
    """The expression computing an output's display scale row by row (a number where it turns
    out one for every row), where the cache can:
    an output of a plain SELECT (no DISTINCT, no star), which a column beside it cannot
    change; of a UNION ALL, a tuple of each branch's (each branch gets its column: a UNION
    that removes duplicates, an INTERSECT or an EXCEPT would compare it too)."""
    if isinstance(top, exp.Union) and not top.args.get("distinct"):
        branches = _union_all_branches(top)
        if branches is None:
            return None
        scales: list[exp.Expr] = []
        for branch in branches:
            found: t.Any = (
                _per_row_scale(branch, index, scale_of) if not branch.args.get("distinct") else None
            )
            if isinstance(found, int):
                found = exp.Literal.number(found)
            if found is None:
                projection = branch.expressions[index] if index < len(branch.expressions) else None
                fixed = scale_of(_unaliased(projection)) if projection is not None else None
                if not isinstance(fixed, int):
                    return None
                found = exp.Literal.number(fixed)
            scales.append(found)
        return exp.Tuple(expressions=scales)
    if not isinstance(top, exp.Select) or top.args.get("distinct"):
        return None
    if any(
        isinstance(p, exp.Star) or (isinstance(p, exp.Column) and isinstance(p.this, exp.Star))
        for p in top.expressions
    ):
        return None
    projection = top.expressions[index]
    node = projection.this if isinstance(projection, exp.Alias) else projection
    found = scale_of(node)
    return found if isinstance(found, exp.Expr | int) else None


class _Finder:
    def __init__(
        self,
        types: ExpressionTypes,
        database_byte_order: bool,
        top: exp.Expr,
        scale_of: t.Callable[[exp.Expr], t.Any],
    ) -> None:
        self.types = types
        self.scale_of = scale_of
        self.top = top  # the statement: its outputs are printed
        self.database_byte_order = database_byte_order
        self.rtrim: set[int] = set()
        self.rpad: dict[int, int] = {}
        self.decimal_scales: dict[int, int] = {}
        self.decimal_digits: dict[int, int] = {}
        self.exact_numbers: dict[int, str] = {}
        self.doubles: set[int] = set()
        self.rewrites: dict[int, str] = {}
        self.text_scales: dict[int, int] = {}
        self.printed_scales: dict[int, tuple[exp.Expr, int]] = {}
        self.constant_reads: set[int] = set()
        self.printed_divisions: set[int] = set()
        self.parameters: dict[int, str] = {}
        self.entries: set[str] = set()
        self.widen: dict[int, int] = {}
        self.zoned: set[int] = set()
        self.localized: set[int] = set()
        self.blocker: str | None = None

    def type(self, node: exp.Expr) -> PgType:
        return self.types.of(node)

    def visit(self, node: exp.Expr) -> None:
        if allowlist.computes(node):
            problem = self.types.problem(node)
            if problem is not None:
                self.blocker = problem
                return
            entry = self.types.entry(node)
            if self.type(node).kind == "array" and not self._output_itself(node):
                self.blocker = (
                    f"it uses the array {_short(node)} other than as an output column of the "
                    "statement (the cache compares, orders and combines no arrays)"
                )
                return
            if entry is not None:
                self.entries.add(entry.name)
                if entry.rewrite is not None:
                    self.rewrites[node.meta[NODE_ID]] = entry.name
        elif not isinstance(node, allowlist.QUERY_PARTS):
            why = allowlist.WHY_NOT_LISTED.get(node.key)
            self.blocker = (
                f"it uses {_short(node)} ({node.key}), which is not on the list of "
                "what DuckDB computes as PostgreSQL does" + (f" ({why})" if why else "")
            )
            return
        if isinstance(node, exp.Lateral) and (
            not isinstance(node.this, exp.Subquery) or node.args.get("view")
        ):
            self.blocker = f"it uses {_short(node)}, a LATERAL item that is not a subquery"
            return
        if isinstance(node, exp.Lateral):
            body = node.this.this
            limited = isinstance(body, exp.Select) and any(
                body.args.get(k) for k in ("limit", "offset")
            )
            if limited and any(self.type(_unaliased(p)).kind == "float" for p in body.expressions):
                # (DuckDB's decorrelation of a LIMIT loses a negative zero's sign: the oracle
                # found it, in plain DuckDB too)
                self.blocker = (
                    f"it limits a LATERAL subquery that outputs doubles ({_short(node)}): "
                    "DuckDB's plan for it loses the sign of a negative zero"
                )
                return
        if isinstance(node, exp.CTE):
            problem = _recursive_problem(node, self.types)
            if problem is not None:
                self.blocker = problem
                return
        if isinstance(node, exp.Rollup | exp.Cube | exp.GroupingSets):
            reads, problem = _grouping_set_constants(node)
            if problem is not None:
                self.blocker = problem
                return
            self.constant_reads.update(reads)
        if isinstance(node, exp.Column):
            if not self.type(node).deterministic:
                self.blocker = (
                    f"it reads {node.sql(dialect='postgres')}, whose collation is nondeterministic"
                )
            return
        if isinstance(node, exp.Literal):
            self._number(node)
            return
        if isinstance(node, (*_COMPARED, exp.Between, exp.Nullif)):
            self._compared(node, _operands(node))
            if isinstance(node, exp.Nullif) and node.this.meta.get(NODE_ID) in self.rtrim:
                # its value is that operand promoted to char, trailing blanks kept (printed,
                # counted by octet_length): the comparison's rtrim would drop them
                self.blocker = (
                    f"it takes NULLIF of a {self.type(node.this).kind} value "
                    "compared with a char(n) one (PostgreSQL keeps its trailing "
                    "blanks)"
                )
                return
        if isinstance(node, exp.Greatest | exp.Least):
            # compared in the type of the first operand (select_common_type): as char only
            # when that is char; a char value met as text is already without its padding
            operands = _operands(node)
            if self.type(operands[0]).kind in ("char", "unknown"):
                self._compared(node, operands)
        if isinstance(node, exp.In) and any(isinstance(o, ConstantList) for o in node.expressions):
            self._long_list(node)
            return
        if isinstance(node, exp.In):
            # the constants are compared in the left operand's type, each other value with
            # its own = operator (PostgreSQL's transformAExprIn)
            operands = _operands(node)
            if self.type(operands[0]).kind in ("char", "unknown"):
                self._compared(node, operands)
            elif any(self.type(o).kind == "char" for o in operands[1:]):
                self.blocker = (
                    f"it compares {_short(operands[0])} with char(n) values in IN "
                    "(each compared as char, the constants as text)"
                )
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
        if isinstance(node, (*_ARITHMETIC, *_COMPARED, exp.Between, exp.In)):
            self._widened(_operands(node))
        if isinstance(node, (*_COMPARED, exp.Between, exp.In, exp.Nullif, exp.Sub)):
            self._zoned(_operands(node))
        if (
            isinstance(node, exp.Cast)
            and self.type(node.this).kind == "timestamptz"
            and self.type(node).kind in ("date", "timestamp")
        ):
            self.localized.add(node.this.meta[NODE_ID])
        combined = _combined_values(node, self.types)
        for values in combined:
            self._combined(values)
        self._as_char(node, combined)
        if isinstance(node, exp.Cast):
            self._cast(node)
            if isinstance(node.this, exp.Placeholder):
                kind = self.type(node).kind
                if kind not in STRINGS:
                    self.parameters[node.this.meta[NODE_ID]] = kind
        if isinstance(node, exp.Anonymous) and node.name.lower() == "date_part":
            self.doubles.add(node.meta[NODE_ID])
        if isinstance(node, (*PADDED_READERS, exp.DPipe)) or (
            isinstance(node, exp.Cast) and node.to.this in _TEXT_TYPES
        ):
            for argument in arguments(node):
                self._printed(argument)

    def _output_itself(self, node: exp.Expr) -> bool:
        """Whether a node is an output column of the statement (a SELECT without DISTINCT),
        as it is or aliased."""
        parent = node.parent.parent if isinstance(node.parent, exp.Alias) else node.parent
        return (
            isinstance(self.top, exp.Select)
            and parent is self.top
            and not self.top.args.get("distinct")
            and any(_unaliased(p) is node for p in self.top.expressions)
        )

    def _long_list(self, node: exp.In) -> None:
        """``x IN (long list)``: DuckDB compares integers with integers and strings with text
        as PostgreSQL does, with no rewrite of either side; any other pair keeps the statement
        at the backend (a short list's constants are rewritten one by one where needed)."""
        listed = self.type(node.expressions[0])
        left = self.type(node.this)
        if (listed.kind, left.kind) in (
            ("integer", "integer"),
            ("string", "text"),
            ("string", "varchar"),
        ):
            return
        self.blocker = (
            f"it compares {_short(node.this)} ({left.kind}) with a list of "
            f"{len(node.expressions[0].constants)} constants in IN (long lists are "
            "compared with integer and text columns only)"
        )

    def _combined(self, values: list[exp.Expr]) -> None:
        """Values one column holds (CASE branches, COALESCE arguments, UNION branches, ...):
        numerics of different scales are all cast to DECIMAL(38, the largest scale), which
        DuckDB combines without rounding."""
        typed = [(v, self.type(v)) for v in values]
        kinds = {t_.kind for _, t_ in typed} - {"null"}
        if "numeric" not in kinds or not kinds <= {"numeric", "integer"}:
            return
        scales = {t_.as_numeric().scale for _, t_ in typed if t_.kind != "null"}
        if len(scales) == 1 and None not in scales:
            return  # one type of one scale: nothing to round
        bounds = [scale_bound(v, self.types.of) for v, t_ in typed if t_.kind != "null"]
        if any(b is None for b in bounds):
            self.blocker = (
                "it combines numerics whose scales the cache cannot bound (DuckDB could round them)"
            )
            return
        largest = max(t.cast(list[int], bounds))
        for value, found in typed:
            if found.kind != "null":
                self.widen[value.meta[NODE_ID]] = largest

    def _zoned(self, operands: list[exp.Expr]) -> None:
        """A date, timestamp or literal compared with a timestamp with time zone is read in
        the session's time zone by PostgreSQL (DuckDB would use its own)."""
        typed = [(o, self.type(o)) for o in operands]
        if not any(t_.kind == "timestamptz" for _, t_ in typed):
            return
        for operand, found in typed:
            if found.kind in ("date", "timestamp", "string"):
                self.zoned.add(operand.meta[NODE_ID])
            if isinstance(operand, exp.Placeholder):
                self.parameters[operand.meta[NODE_ID]] = "timestamptz"

    def _widened(self, operands: list[exp.Expr]) -> None:
        """A real meeting a number of another type is widened to double precision in
        PostgreSQL (DuckDB would compute in single precision): widen it in DuckDB too."""
        typed = [(o, self.type(o)) for o in operands]
        if not any(t_.kind == "float" and t_.width == 4 for _, t_ in typed):
            return
        if all(t_.kind == "float" and t_.width == 4 for _, t_ in typed):
            return
        for operand, found in typed:
            if found.kind == "float" and found.width == 4:
                self.doubles.add(operand.meta[NODE_ID])

    def _printed(self, value: exp.Expr) -> None:
        """A numeric printed as text shows its display scale: DuckDB prints it at the scale
        PostgreSQL's values have (one for all of them, or each value's, followed row by row),
        or the statement stays remote."""
        found = self.type(value)
        if found.kind != "numeric":
            return
        inner = value.unnest()
        if found.scale is None and isinstance(inner, (exp.Div, exp.Avg, *SPREADS)):
            # the cache's division gives PostgreSQL's text (optimizer.analysis.analyze)
            self.printed_divisions.add(inner.meta[NODE_ID])
            return
        if found.scale is not None:
            self.text_scales[value.meta[NODE_ID]] = found.scale
            return
        scale = self.scale_of(inner)
        bound = scale_bound(inner, self.types.of)
        if isinstance(scale, int):
            self.text_scales[value.meta[NODE_ID]] = scale
        elif isinstance(scale, exp.Expr) and bound is not None and bound <= DECIMAL_DIGITS:
            # each value printed at the largest scale, then cut to its own
            self.printed_scales[value.meta[NODE_ID]] = (scale, bound)
        else:
            self.blocker = (
                f"it prints {_short(value)} as text, numerics whose scales vary from value to "
                "value in a way the cache cannot follow"
            )

    # -- char(n) -------------------------------------------------------------------------------

    def _compared(self, node: exp.Expr, operands: list[exp.Expr]) -> None:
        """Operands compared with each other: with a char(n) one, literals, parameters and
        varchar values are compared as char(n) (PostgreSQL's bpchar operators)."""
        typed = [(o, self.type(o)) for o in operands]
        kinds = {t_.kind for _, t_ in typed}
        for operand, _ in typed:
            if isinstance(operand, exp.Placeholder):
                # a string parameter compared with a number, a date, ...: PostgreSQL reads it
                # as that type; the executor checks DuckDB reads it alike
                for other in kinds - {"string", "null", "unknown"} - STRINGS:
                    self.parameters[operand.meta[NODE_ID]] = other
        if "char" not in kinds:
            if "unknown" in kinds and kinds & {"string", "varchar", "char", "text"}:
                self.blocker = (
                    f"it compares {_short(node)}, whose operand types the cache cannot tell"
                )
            return
        for operand, found in typed:
            if found.kind == "unknown":
                self.blocker = (
                    f"it compares a char(n) value with {_short(operand)}, whose "
                    "type the cache cannot tell"
                )
                return
            if found.kind in ("string", "varchar"):
                if isinstance(operand, exp.Subquery | exp.Select | exp.Union):
                    self.blocker = (
                        f"it compares a char(n) value with a subquery of {found.kind} values"
                    )
                    return
                self.rtrim.add(operand.meta[NODE_ID])

    def _as_char(self, node: exp.Expr, groups: list[list[exp.Expr]]) -> None:
        """Strings a CASE, COALESCE, GREATEST, UNION, ... resolves to char (its ELSE or first
        value a char(n): ``CASE WHEN p THEN comment ELSE name END``) become char values, whose
        trailing blanks PostgreSQL ignores wherever they are read - compared, concatenated,
        measured - so they are read without them, as the cache stores char(n). Only an output
        prints them as they are."""
        if not groups or isinstance(node, exp.Nullif) or self._printed_as_is(node):
            return
        for values in groups:
            result = (
                combine([self.type(v) for v in values])
                if isinstance(node, exp.SetOperation)
                else self.type(node)
            )
            if result.kind != "char":
                continue
            for value in values:
                if self.type(value).kind in ("string", "varchar", "text"):
                    self.rtrim.add(value.meta[NODE_ID])

    def _printed_as_is(self, node: exp.Expr) -> bool:
        """Whether a value reaches one of the statement's outputs unchanged (through
        parentheses, an alias, and the values of CASE, COALESCE, GREATEST, LEAST, NULLIF)."""
        if node is self.top:
            return True
        child, parent = node, node.parent
        while parent is not None:
            if isinstance(parent, exp.If) and child is not parent.args.get("true"):
                return False  # a condition
            if isinstance(parent, exp.Case) and child is parent.args.get("this"):
                return False  # the value CASE compares
            if isinstance(parent, exp.Nullif) and child is not parent.this:
                return False
            if (
                isinstance(parent, exp.Case | exp.Coalesce | exp.Greatest | exp.Least)
                and self.type(parent).kind != "char"
            ):
                # resolved to text (GREATEST(text, char)): the char value is converted to
                # it, without its trailing blanks (found by the oracle)
                return False
            if not isinstance(
                parent,
                (
                    exp.Paren,
                    exp.Alias,
                    exp.If,
                    exp.Case,
                    exp.Coalesce,
                    exp.Greatest,
                    exp.Least,
                    exp.Nullif,
                ),
            ):
                break
            child, parent = parent, parent.parent
        return (
            parent is self.top
            and isinstance(parent, exp.Select)
            and any(child is p for p in parent.expressions)
        )

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
        if (
            not isinstance(query, exp.Select)
            or query.args.get("distinct")
            or query.args.get("group")
        ):
            self.blocker = (
                "it outputs char values of several lengths, compared as PostgreSQL "
                "compares char (trailing blanks ignored)"
            )
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
            elif found.kind not in ("string", "varchar", "text", "null"):  # printed as they are
                self.blocker = (
                    f"it outputs {_short(node)} as char values whose padding the cache cannot tell"
                )

    # -- numbers and casts ---------------------------------------------------------------------

    def _number(self, node: exp.Literal) -> None:
        if node.is_string:
            return
        text = node.this
        digits = len(text.lower().partition("e")[0].replace(".", "").lstrip("-+0"))
        if digits > DECIMAL_DIGITS:
            self.blocker = f"its number {text[:20]}... has more digits than DuckDB's decimals"
        elif "e" in text.lower():
            scale = literal_scale(text)
            if scale is None:
                return
            plain = format(Decimal(text), "f")
            if len(plain.replace(".", "").lstrip("-0")) > DECIMAL_DIGITS:
                self.blocker = f"its number {text} has more digits than DuckDB's decimals"
                return
            digits = max(len(plain.lstrip("-").replace(".", "")), scale + 1)
            self.exact_numbers[node.meta[NODE_ID]] = (
                f"CAST('{plain}' AS DECIMAL({digits}, {scale}))"
            )

    def _cast(self, node: exp.Cast) -> None:
        """A cast to numeric without a scale keeps the value's own scale in PostgreSQL (DuckDB
        would give DECIMAL(18,3)): DuckDB casts to the value's precision and scale."""
        target = node.to
        if target.this != exp.DType.DECIMAL or target.expressions:
            return
        inner = self.type(node.this)
        scale = inner.scale if inner.kind == "numeric" else 0 if inner.kind == "integer" else None
        digits = (
            inner.digits
            if inner.kind == "numeric"
            else _INTEGER_DIGITS.get(inner.width or 8)
            if inner.kind == "integer"
            else None
        )
        if scale is None and isinstance(node.this, exp.Literal) and node.this.is_string:
            scale = literal_scale(node.this.this)
            if scale is not None:  # DuckDB reads no exponent: the literal written out
                plain = format(Decimal(node.this.this.strip()), "f")
                digits = max(len(plain.lstrip("+-").replace(".", "")), scale + 1)
                self.exact_numbers[node.meta[NODE_ID]] = (
                    f"CAST('{plain}' AS DECIMAL({min(digits, DECIMAL_DIGITS)}, {scale}))"
                )
                self.decimal_scales[node.meta[NODE_ID]] = scale
                return
        if scale is None:
            self.blocker = (
                f"it casts {_short(node.this)} to numeric, whose scale the cache cannot tell"
            )
            return
        self.decimal_scales[node.meta[NODE_ID]] = scale
        self.decimal_digits[node.meta[NODE_ID]] = max(digits or DECIMAL_DIGITS, scale + 1)

    # -- collation -----------------------------------------------------------------------------

    def _ordered(self, node: exp.Expr) -> None:
        """Values ordered (ORDER BY, a range, MIN/MAX): text only where it is byte order."""
        values = (
            [node.this] if isinstance(node, exp.Ordered | exp.Min | exp.Max) else _operands(node)
        )
        if isinstance(node, exp.Ordered):
            values = [_order_target(node) or node.this]
        for value in values:
            found = self.type(value)
            if found.kind == "array":
                self.blocker = f"it orders by the array {_short(value)}"
                return
            if (found.is_string and not found.byte_order) or (
                found.kind == "unknown" and not self.database_byte_order
            ):
                self.blocker = (
                    f"it orders {_short(value)} under a collation that is not byte order (DuckDB's)"
                )
                return


def _combined_values(node: exp.Expr, types: ExpressionTypes) -> list[list[exp.Expr]]:
    """The groups of values a node combines into one column."""
    if isinstance(node, exp.Case):
        values = [i.args["true"] for i in node.args.get("ifs") or []]
        if node.args.get("default") is not None:
            values.append(node.args["default"])
        return [values]
    if isinstance(node, exp.Coalesce | exp.Greatest | exp.Least):
        return [[node.this, *node.expressions]]
    if isinstance(node, exp.Nullif):
        return [[node.this, node.expression]]
    if isinstance(node, exp.Lag | exp.Lead) and node.args.get("default") is not None:
        return [[node.this, node.args["default"]]]
    if isinstance(node, exp.SetOperation) and not isinstance(node.parent, exp.SetOperation):
        branches = types.query.analysis.body_blocks(node)
        columns = [b.select.expressions for b in branches]
        if len({len(c) for c in columns}) != 1 or any(
            isinstance(p, exp.Star) for c in columns for p in c
        ):
            return []
        return [[_unaliased(c[i]) for c in columns] for i in range(len(columns[0]))]
    if isinstance(node, exp.Values):
        rows = [r.expressions for r in node.expressions if isinstance(r, exp.Tuple)]
        if not rows or len({len(r) for r in rows}) != 1:
            return []
        return [[r[i] for r in rows] for i in range(len(rows[0]))]
    return []


def _unaliased(node: exp.Expr) -> exp.Expr:
    return node.this if isinstance(node, exp.Alias) else node


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
            if isinstance(output, exp.Alias) and output_name(output) == folded(key):
                return output.this
    return None


# the column types a recursive CTE may carry locally: those whose type modifier PostgreSQL
# cannot lose between its terms (a numeric(12,2) or varchar(10) term meeting an unmodified one
# makes PostgreSQL raise, a difference the inferred types do not follow)
_RECURSIVE_KINDS = frozenset({"integer", "float", "text", "bool", "date", "timestamp"})


def _recursive_problem(cte: exp.CTE, types: ExpressionTypes) -> str | None:
    """Why a recursive CTE is not answered locally, or None (not recursive, or of the shape
    PostgreSQL accepts and DuckDB evaluates alike: ``non-recursive SELECT UNION [ALL]
    recursive SELECT``, the recursive term reading the CTE once, in its FROM or an inner
    join, without aggregates, windows, grouping, DISTINCT, ORDER BY or LIMIT - which PostgreSQL
    refuses and DuckDB might not - and its columns typed as the non-recursive term's)."""
    with_ = cte.parent
    name = folded(cte.args["alias"].this)
    if not isinstance(with_, exp.With) or not with_.args.get("recursive"):
        return None
    reads = [
        t_
        for t_ in cte.this.find_all(exp.Table)
        if isinstance(t_.this, exp.Identifier) and not t_.args.get("db") and folded(t_.this) == name
    ]
    if not reads:
        return None
    body = cte.this
    shape = f"its recursive CTE {name}"
    if not (
        isinstance(body, exp.Union)
        and isinstance(body.this, exp.Select)
        and isinstance(body.expression, exp.Select)
        and not any(body.args.get(k) for k in ("order", "limit", "offset"))
    ):
        return f"{shape} is not one SELECT UNION [ALL] one SELECT"
    anchor, term = body.this, body.expression
    if any(r.find_ancestor(exp.Union) is not body or r.parent_select is not term for r in reads):
        return f"{shape} reads itself outside its recursive term's FROM"
    if len(reads) > 1:
        return f"{shape} reads itself more than once (PostgreSQL raises)"
    if any(
        term.args.get(k) for k in ("group", "having", "order", "limit", "offset", "distinct")
    ) or (term.find(exp.AggFunc, exp.Window) is not None):
        return (
            f"{shape} aggregates, groups, orders, limits, windows or removes duplicates in its "
            "recursive term (PostgreSQL raises for aggregates, ORDER BY and LIMIT; the rest is "
            "not proven alike yet)"
        )
    for join in term.args.get("joins") or []:
        if (join.side or "").upper() in ("RIGHT", "FULL") or (
            (join.side or "").upper() == "LEFT" and join.this is reads[0]
        ):
            return f"{shape} reads itself on the NULL side of an outer join (PostgreSQL raises)"
    if len(anchor.expressions) != len(term.expressions):
        return f"{shape} has terms of different widths"
    for position, (a, b) in enumerate(zip(anchor.expressions, term.expressions, strict=True)):
        # (an untyped literal is text in a recursive CTE's column, as in a UNION's)
        first, second = (
            PgType("text") if found.kind == "string" else found
            for found in (types.of(_unaliased(a)), types.of(_unaliased(b)))
        )
        if first.kind not in _RECURSIVE_KINDS or (first.kind, first.width) != (
            second.kind,
            second.width,
        ):
            return (
                f"{shape}'s column {position + 1} is {_typed(first)} in its non-recursive term "
                f"and {_typed(second)} in its recursive term (integer, float, text, boolean, "
                "date and timestamp columns of one type are answered locally)"
            )
    return None


def _except_scale(top: exp.Expr, index: int, scale_of: t.Callable[[exp.Expr], t.Any]) -> t.Any:
    """An EXCEPT's output's scale: its rows are its left side's, so where every value of the
    left side has one scale, so does the output (None otherwise)."""
    if not isinstance(top, exp.Except):
        return None
    left = top.this
    while isinstance(left, exp.Subquery):
        left = left.this
    if isinstance(left, exp.Except):
        return _except_scale(left, index, scale_of)
    if not isinstance(left, exp.Select) or index >= len(left.expressions):
        return None
    projection = left.expressions[index]
    if isinstance(projection, exp.Star):
        return None
    return scale_of(_unaliased(projection))


def _deduplicated(top: exp.Expr) -> bool:
    """Whether a statement's rows are made distinct (DISTINCT, or a set operation that is
    not UNION ALL)."""
    if isinstance(top, exp.Select):
        return bool(top.args.get("distinct"))
    return not (isinstance(top, exp.Union) and not top.args.get("distinct")) or any(
        _deduplicated(side) for side in (top.this, top.expression)
    )


def _union_all_branches(top: exp.Expr) -> list[exp.Select] | None:
    """The SELECTs a tree of UNION ALLs is made of, or None where another set operation (or a
    parenthesized query with its own ORDER BY or LIMIT) is among them."""
    if isinstance(top, exp.Select):
        return [top]
    if isinstance(top, exp.Union) and not top.args.get("distinct"):
        if any(top.args.get(k) for k in ("order", "limit", "offset")) and top.parent is not None:
            return None
        left, right = _union_all_branches(top.this), _union_all_branches(top.expression)
        return left + right if left is not None and right is not None else None
    return None


def _typed(found: PgType) -> str:
    """A type as a reason names it: its kind, with its width in bytes where it has one."""
    return f"{found.kind}({found.width})" if found.width else found.kind


def _name(node: exp.Expr) -> str:
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    return node.sql_name().lower() if isinstance(node, exp.Func) else node.key


def _short(node: exp.Expr) -> str:
    text = node.sql(dialect="postgres")
    return text if len(text) <= 60 else text[:57] + "..."
