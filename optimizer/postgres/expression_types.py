"""What PostgreSQL would type each expression of a statement as: an inference over
the statement's tree, without the backend, in the types of `optimizer.postgres.types`.

Columns are typed from the catalog (through derived tables, CTEs and UNION branches),
placeholders as untyped strings (typed by their context), and every node that computes a value
by its entry in the allowlist (`optimizer.postgres.allowlist`): a node no entry takes is
``unknown``, with the reason kept (`problem`), and the statement stays at the backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sqlglot import exp

from optimizer.postgres import allowlist
from optimizer.postgres.allowlist import Entry, Settings
from optimizer.postgres.types import (
    NULL,
    OTHER,
    UNKNOWN,
    PgType,
    byte_order_name,
    combine,
    declared,
)
from sql_ext import Block, Query, Source
from sql_ext.catalog import Catalog, Column
from sql_ext.quoting import output_name

# Functions whose result keeps the type of their value arguments (PostgreSQL's "anyelement"
# family): CASE, COALESCE, NULLIF, GREATEST, LEAST, MIN, MAX, ...
VALUE_PRESERVING = (
    exp.Case,
    exp.If,
    exp.Coalesce,
    exp.Nullif,
    exp.Greatest,
    exp.Least,
    exp.Min,
    exp.Max,
    exp.AnyValue,
    exp.First,
    exp.Last,
    exp.FirstValue,
    exp.LastValue,
    exp.Lag,
    exp.Lead,
    exp.NthValue,
)
# Functions returning text from text arguments: a char(n) argument is read as text (its
# padding stripped), exactly as the cache stores it.
TEXT_FUNCTIONS = (
    exp.DPipe,
    exp.Upper,
    exp.Lower,
    exp.Substring,
    exp.Trim,
    exp.Replace,
    exp.Left,
    exp.Right,
    exp.Pad,
    exp.Reverse,
    exp.MD5,
    exp.SplitPart,
    exp.GroupConcat,
    exp.Translate,
    exp.Repeat,
    exp.RegexpReplace,
    exp.RegexpSubstr,
    exp.Initcap,
)
INTEGER_FUNCTIONS = (exp.Length, exp.StrPosition, exp.Ascii)
# Functions that read a char(n) value with its padding (they print it: its output function)
PADDED_READERS = (exp.Concat, exp.ConcatWs, exp.Format)
PADDED_READER_NAMES = frozenset({"octet_length"})
# ... and functions whose arguments are text, returning a boolean
TEXT_PREDICATES = (exp.StartsWith,)


def column_type(column: Column, database_byte_order: bool) -> PgType:
    """A catalog column's type (``format_type`` text) as a `PgType`."""
    found = declared(
        column.type,
        column.byte_order if column.byte_order is not None else database_byte_order,
        column.deterministic,
    )
    # a collation of its own (the database's default reads as None)
    return replace(found, collated=True) if column.byte_order is not None else found


class ExpressionTypes:
    """Types of a statement's expressions; ``resolve``: a column's source in a block."""

    def __init__(
        self,
        query: Query,
        catalog: Catalog,
        resolve: Callable[[Block, exp.Column], tuple[Source, str] | None],
        settings: Settings | None = None,
    ) -> None:
        self.query = query
        self.catalog = catalog
        self._resolve = resolve
        self.settings = settings or Settings(
            ascii_case=catalog.ascii_case, utf8=catalog.utf8, unicode_case=catalog.unicode_case
        )
        self._memo: dict[int, PgType] = {}
        self._entries: dict[int, Entry] = {}
        self._problems: dict[int, str] = {}
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
        if isinstance(node, exp.Connector) and isinstance(node.this, exp.Connector):
            # a long AND / OR chain nests as deep as it is long: type its spine bottom up, so
            # each connective finds its left operand typed (no recursion down the chain)
            spine = [node]
            while (
                isinstance(spine[-1].this, exp.Connector) and id(spine[-1].this) not in self._memo
            ):
                spine.append(spine[-1].this)
            for inner in reversed(spine[1:]):
                self.of(inner, block)
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

    def entry(self, node: exp.Expr) -> Entry | None:
        """The allowlist entry that computes a node (after `of`)."""
        self.of(node)
        return self._entries.get(id(node))

    def problem(self, node: exp.Expr) -> str | None:
        """Why no allowlist entry computes a node (None: one does, or it computes nothing)."""
        self.of(node)
        return self._problems.get(id(node))

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
        if isinstance(node, exp.Placeholder | exp.Parameter):
            return self._string  # typed by its context (psycopg sends strings untyped)
        if isinstance(node, exp.Query):
            return self.output(node, 0)
        if isinstance(node, exp.Subquery):
            return self.output(node.this, 0)
        if isinstance(node, exp.Any | exp.All):
            return self.of(node.this, block)
        if isinstance(
            node, exp.Paren | exp.Alias | exp.Window | exp.Ordered | exp.Order | exp.Filter
        ):
            return self.of(node.this, block)
        if isinstance(node, exp.Collate):
            inner = self.of(node.this, block)
            collation = node.expression.name if isinstance(node.expression, exp.Expr) else ""
            return replace(
                inner, byte_order=byte_order_name(collation), deterministic=True, collated=True
            )
        if isinstance(node, exp.Distinct):
            return self.of(node.expressions[0], block) if node.expressions else OTHER
        if allowlist.computes(node):
            for argument in arguments(node):
                if self.of(argument, block).kind == "unknown" and id(argument) in self._problems:
                    # an argument the list does not take: the first cause is the reason
                    self._problems[id(node)] = self._problems[id(argument)]
                    return UNKNOWN
            found, result = allowlist.resolve(node, self.of, self.settings, self.identifies_rows)
            if found is None or not isinstance(result, PgType):
                self._problems[id(node)] = self._first_problem(node) or str(result)
                return UNKNOWN
            self._entries[id(node)] = found
            return self._string if result.kind == "string" else result
        if isinstance(node, exp.Null):
            return NULL
        return OTHER

    def identifies_rows(self, node: exp.Expr, keys: list[exp.Expr]) -> bool:
        """Whether rows equal in ``keys`` are one row of the input of the aggregate ``node``:
        its block reads tables only (no derived table, function or LATERAL item), and for
        each, the keys hold the columns of one of its candidate keys (the primary key, or a
        unique key over NOT NULL columns). A join's rows then differ in some table's key
        (an outer join's NULL-extended rows too: in the key of the table they do match)."""
        block = self.query.analysis.enclosing(node)
        if block is None or not block.sources:
            return False
        held: dict[int, set[str]] = {}
        for key in keys:
            if isinstance(key, exp.Column):
                found = self._resolve(block, key)
                if found is not None:
                    held.setdefault(id(found[0]), set()).add(found[1])
        for source in block.sources:
            table = self.catalog.table(source.table or "") if source.is_table else None
            if table is None or source.body or not isinstance(source.node, exp.Table):
                return False
            names = held.get(id(source), set())
            if not any(set(k) <= names for k in table.candidate_keys()):
                return False
        return True

    def _first_problem(self, node: exp.Expr) -> str | None:
        """The problem of a value inside ``node`` (under a CASE's branch, say), if one of them
        has one: the first cause is the reason a statement stays at the backend."""
        for inner in node.walk(prune=lambda n: isinstance(n, exp.Query)):
            if inner is not node and id(inner) in self._problems:
                return self._problems[id(inner)]
        return None

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
            declared_column = next((c for c in table.columns if c.name == name), None)
            return (
                column_type(declared_column, self.catalog.text_byte_order)
                if declared_column
                else UNKNOWN
            )
        return self._derived(source, name)

    def _derived(self, source: Source, name: str) -> PgType:
        """A column of a derived table or CTE: its body's projection (every UNION branch); of
        a VALUES list, its rows' values."""
        if isinstance(source.node, exp.Values):
            return self._values_column(source, name)
        if source.series is not None:
            # generate_series(...) AS g(y): its one column, of the function's type
            return self.of(source.series) if name in source.function_columns else UNKNOWN
        if not source.body:
            return UNKNOWN
        first = source.body[0]
        aliases = source.column_aliases
        # a recursive CTE's columns are typed by its non-recursive term (PostgreSQL raises
        # where the recursive term's types differ: optimizer.postgres.semantics refuses those)
        branches = [b for b in source.body if not _reads_itself(b, source)] or source.body
        for position, projection in enumerate(first.select.expressions):
            if isinstance(projection, exp.Star):
                return UNKNOWN if len(source.body) > 1 else self._star(first, name)
            label = aliases[position] if position < len(aliases) else output_name(projection)
            if label == name:
                types = []
                for branch in branches:
                    projections = branch.select.expressions
                    if position >= len(projections) or isinstance(projections[position], exp.Star):
                        return UNKNOWN
                    types.append(self.of(_unaliased(projections[position]), branch))
                return combine(types)
        return UNKNOWN

    def _values_column(self, source: Source, name: str) -> PgType:
        """A column of ``(VALUES ...) AS v(a, b)``, as PostgreSQL types it: the common type of
        its rows' values (select_common_type, as a UNION's; untyped strings and NULLs alone
        are text)."""
        aliases = source.column_aliases
        if name not in aliases:
            return UNKNOWN
        position = aliases.index(name)
        rows = source.node.expressions
        values = [
            row.expressions[position]
            for row in rows
            if isinstance(row, exp.Tuple) and position < len(row.expressions)
        ]
        if len(values) != len(rows):
            return UNKNOWN
        block = self.block_of(source.node)
        found = combine([self.of(value, block) for value in values])
        if found.kind in ("null", "string"):
            return PgType("text", byte_order=self.catalog.text_byte_order)
        return found

    def _star(self, body: Block, name: str) -> PgType:
        """A column a derived table's ``SELECT *`` passes through."""
        return self._column(exp.column(name), body)


def _reads_itself(branch: Block, source: Source) -> bool:
    """Whether a branch of a CTE's body is its recursive term (it reads the CTE itself)."""
    return source.cte is not None and any(
        inner.cte == source.cte and inner.body[:1] == source.body[:1] for inner in branch.sources
    )


def _unaliased(node: exp.Expr) -> exp.Expr:
    return node.this if isinstance(node, exp.Alias) else node


def arguments(node: exp.Expr) -> list[exp.Expr]:
    """A function's value arguments (not its names, type arguments or window clauses)."""
    found: list[exp.Expr] = []
    for key, value in node.args.items():
        if key in ("over", "partition_by", "order", "spec"):
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, exp.Expr) and not isinstance(
                item, exp.Identifier | exp.Var | exp.DataType
            ):
                found.append(item)
    return found


__all__ = [
    "INTEGER_FUNCTIONS",
    "PADDED_READERS",
    "PADDED_READER_NAMES",
    "TEXT_FUNCTIONS",
    "TEXT_PREDICATES",
    "VALUE_PRESERVING",
    "ExpressionTypes",
    "PgType",
    "arguments",
    "column_type",
    "combine",
]
