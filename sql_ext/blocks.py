"""Block structure of a query: which SELECT blocks, which inputs each sees, which predicates.

The one place that walks a query's scopes (STYLE 2): parse-time checks of the currency clause
and the normalizer both ask it. A *block* is one SELECT; its *sources* are its FROM items (a
table reference, a derived table, or a CTE reference). Names resolve as in SQL: the block's own
sources first, then those of enclosing blocks (§2.2.1: "the same scoping rules as WHERE").
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

from sqlglot import exp

from sql_ext.nodes import CurrencyClause
from sql_ext.quoting import folded


@dataclass(eq=False)
class Source:
    """A FROM item of a block."""

    name: str  # the name it is visible by: its alias, else its table name (lower case)
    node: exp.Expr  # exp.Table, or the exp.Subquery of a derived table
    table: str | None = None  # a table reference's name (lower case); None for derived/CTE
    schema: str | None = None  # the schema it was qualified with, if any
    body: list[Block] = field(default_factory=list)  # blocks of a derived table or CTE body
    cte: str | None = None  # the CTE it references, if any
    cte_columns: list[str] = field(default_factory=list)  # WITH c(x, y) AS ...: x, y

    @property
    def is_table(self) -> bool:
        return self.table is not None and self.cte is None

    @property
    def written(self) -> str:
        """A table reference's name as the statement gives it: ``schema.table`` or ``table``."""
        return f"{self.schema}.{self.table}" if self.schema else str(self.table)

    @property
    def sql_name(self) -> str:
        """A table reference's name as SQL writes it (quoted where the statement quoted it)."""
        node = self.node
        schema = node.args.get("db")
        return exp.Table(this=node.this.copy(), db=schema.copy() if schema else None).sql(
            "postgres"
        )

    @property
    def series(self) -> exp.GenerateSeries | None:
        """The set-returning function a FROM item calls (``generate_series(1, 3) AS g(y)``),
        or None."""
        inner = self.node.this if isinstance(self.node, exp.Table) else None
        return inner if isinstance(inner, exp.GenerateSeries) else None

    @property
    def function_columns(self) -> list[str]:
        """The columns of a set-returning function's FROM item, named as PostgreSQL names
        them: its column alias, else its table alias, else the function's name."""
        if self.series is None:
            return []
        return self.column_aliases[:1] or [self.name or "generate_series"]

    @property
    def column_aliases(self) -> list[str]:
        alias = self.node.args.get("alias")
        if isinstance(alias, exp.TableAlias) and alias.columns:
            return [folded(c) for c in alias.columns]
        return self.cte_columns


@dataclass(eq=False)
class Block:
    """One SELECT block."""

    index: int
    select: exp.Select
    parent: Block | None = None
    sources: list[Source] = field(default_factory=list)
    # False when the block sits under NOT or OR relative to its parent (NOT EXISTS, x OR y IN
    # (...)): its predicates say nothing about the rows that reach the result.
    positive: bool = True

    @property
    def clause(self) -> CurrencyClause | None:
        clause = self.select.args.get("currency")
        return clause if isinstance(clause, CurrencyClause) else None

    def visible(self) -> Iterator[Source]:
        """Sources in scope, innermost first."""
        block: Block | None = self
        while block is not None:
            yield from block.sources
            block = block.parent

    def resolve(self, name: str) -> Source | None:
        """The source an input name (folded: `sql_ext.quoting.folded`) refers to from this
        block, or None."""
        for source in self.visible():
            if source.name == name:
                return source
        return None

    def conjuncts(self) -> list[exp.Expr]:
        """Top-level AND-ed predicates of WHERE and of inner JOIN ... ON (not outer joins)."""
        predicates: list[exp.Expr] = []
        where = self.select.args.get("where")
        if where is not None:
            predicates.extend(split_and(where.this))
        for join in self.select.args.get("joins") or []:
            side = (join.side or "").upper()
            if side in ("LEFT", "RIGHT", "FULL"):
                continue
            on = join.args.get("on")
            if on is not None:
                predicates.extend(split_and(on))
        return predicates

    def join_conditions(self, source: Source) -> list[exp.Expr]:
        """Top-level AND-ed predicates of the ON clause of the LEFT JOIN that makes a source
        null-supplying (none for any other source). A row of the source reaches the result
        only joined by them, so they restrict which of its rows matter; they restrict no other
        source (the preserved side keeps every row)."""
        for join in self.select.args.get("joins") or []:
            if join.this is source.node and (join.side or "").upper() == "LEFT":
                on = join.args.get("on")
                return split_and(on) if on is not None else []
        return []


@dataclass(eq=False)
class BlockAnalysis:
    """All blocks of one statement, indexed by textual order (0 = outermost)."""

    tree: exp.Expr
    blocks: list[Block]
    by_select: dict[int, Block]

    def block_of(self, select: exp.Select) -> Block:
        return self.by_select[id(select)]

    def enclosing(self, node: exp.Expr) -> Block | None:
        """The block a node of the tree is evaluated in (a SELECT is its own block); None
        outside every block or for a node that is not the tree's."""
        if isinstance(node, exp.Select):
            return self.by_select.get(id(node))
        select = self._enclosing_selects.get(id(node))
        return self.by_select.get(id(select)) if select is not None else None

    @functools.cached_property
    def _enclosing_selects(self) -> dict[int, exp.Select | None]:
        """Each node's nearest enclosing SELECT, found in one walk (asking each node for its
        ancestor would be quadratic in a deep tree, such as a long OR chain)."""
        enclosing: dict[int, exp.Select | None] = {id(self.tree): None}
        for node in self.tree.walk():
            inner = node if isinstance(node, exp.Select) else enclosing.get(id(node))
            for child in node.iter_expressions():
                enclosing[id(child)] = inner
        return enclosing

    def body_blocks(self, query: exp.Expr) -> list[Block]:
        """The blocks whose rows a query expression returns (both sides of a UNION)."""
        return [self.block_of(s) for s in _branch_selects(query)]


def analyze(tree: exp.Expr) -> BlockAnalysis:
    selects = [node for node in tree.walk() if isinstance(node, exp.Select)]
    dfs_rank = {id(s): i for i, s in enumerate(selects)}
    selects.sort(key=lambda s: (_start_of(s), dfs_rank[id(s)]))
    # The outermost block is block 0 even where another SELECT begins earlier in the text.
    outermost = next((s for s in selects if _enclosing_select(s) is None), None)
    if outermost is not None:
        selects.remove(outermost)
        selects.insert(0, outermost)

    blocks = [Block(index=i, select=s) for i, s in enumerate(selects)]
    by_select = {id(b.select): b for b in blocks}
    for block in blocks:
        enclosing = _enclosing_select(block.select)
        block.parent = by_select[id(enclosing)] if enclosing is not None else None
        block.positive = _is_positive(block.select, enclosing)

    analysis = BlockAnalysis(tree=tree, blocks=blocks, by_select=by_select)
    for block in blocks:
        block.sources = [_make_source(item, block, analysis) for item in from_items(block.select)]
    return analysis


def _make_source(item: exp.Expr, block: Block, analysis: BlockAnalysis) -> Source:
    named = item.args.get("alias")
    alias = (
        folded(named.args.get("this"))
        if isinstance(named, exp.TableAlias) and named.args.get("this") is not None
        else ""
    )
    if isinstance(item, exp.Subquery):
        return Source(name=alias, node=item, body=analysis.body_blocks(item.this))
    if isinstance(item, exp.Lateral) and isinstance(item.this, exp.Subquery):
        # a LATERAL derived table: its body reads the FROM items before it, as a correlated
        # subquery reads its enclosing block's
        return Source(name=alias, node=item, body=analysis.body_blocks(item.this.this))
    if isinstance(item, exp.Table) and isinstance(item.this, exp.Identifier):
        table = folded(item.this)
        schema = folded(item.args["db"]) if item.args.get("db") else None
        if schema is None:
            cte = _find_cte(block, table)
            if cte is not None:
                return Source(
                    name=alias or table,
                    node=item,
                    table=table,
                    body=analysis.body_blocks(cte.this),
                    cte=table,
                    cte_columns=[folded(c) for c in cte.args["alias"].columns],
                )
        return Source(name=alias or table, node=item, table=table, schema=schema)
    # Table functions, VALUES, UNNEST ...: no base-table input.
    return Source(name=alias, node=item)


def _find_cte(block: Block, name: str) -> exp.CTE | None:
    scope: Block | None = block
    while scope is not None:
        with_ = scope.select.args.get("with_")
        if with_ is not None:
            for cte in with_.expressions:
                if folded(cte.args["alias"].this) == name:
                    return cte  # type: ignore[no-any-return]
        scope = scope.parent
    return None


def from_items(select: exp.Select) -> list[exp.Expr]:
    """A SELECT's own FROM items, in order (its FROM's and its joins')."""
    items: list[exp.Expr] = []
    from_ = select.args.get("from_")
    if from_ is not None:
        items.append(from_.this)
    for join in select.args.get("joins") or []:
        items.append(join.this)
    return items


def _branch_selects(query: exp.Expr) -> list[exp.Select]:
    if isinstance(query, exp.Subquery):
        return _branch_selects(query.this)
    if isinstance(query, exp.SetOperation):
        return _branch_selects(query.this) + _branch_selects(query.expression)
    return [query] if isinstance(query, exp.Select) else []


def _enclosing_select(select: exp.Select) -> exp.Select | None:
    node = select.parent
    while node is not None and not isinstance(node, exp.Select):
        node = node.parent
    return node


def _is_positive(select: exp.Select, enclosing: exp.Select | None) -> bool:
    node = select.parent
    while node is not None and node is not enclosing:
        if isinstance(node, exp.Not | exp.Or):
            return False
        node = node.parent
    return True


def _start_of(select: exp.Select) -> int:
    start = select.meta.get("block_start")
    if start is not None:
        return int(start)
    positions = [n.meta["start"] for n in select.walk() if n.meta.get("start") is not None]
    return min(positions) if positions else 1 << 62


def split_and(node: exp.Expr) -> list[exp.Expr]:
    """The AND-ed conjuncts of a predicate (parentheses looked through), in textual order;
    iterative, as a generated AND chain of thousands of terms is as deep as it is long."""
    conjuncts = []
    pending = [node]
    while pending:
        node = pending.pop()
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.And):
            pending += [node.expression, node.this]
        else:
            conjuncts.append(node)
    return conjuncts
