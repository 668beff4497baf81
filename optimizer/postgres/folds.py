"""Forms PostgreSQL answers as another form DuckDB has, folded into it before a statement is
typed (`fold`), so the allowlist, the types and the scales see only that form. The statement
PostgreSQL runs is the text as written; these change only what DuckDB is given.

An aggregate's ``FILTER (WHERE c)`` becomes the aggregate of ``CASE WHEN c THEN value END``
(`fold_filters`). For an aggregate that skips NULL inputs the two are the same in PostgreSQL:
a row whose condition is false or NULL gives the aggregate a NULL, which it skips, as FILTER
skips the row (``count(*)`` counts ``CASE WHEN c THEN 1 END``). Every aggregate of the
allowlist skips NULLs (count, sum, avg, min, max, bool_and, bool_or, every, string_agg,
stddev, variance), so
the aggregate's types, numeric scales and the cache's divisions (an average is its sum over
its count) apply unchanged, and DuckDB never sees a FILTER. An aggregate that keeps NULLs
(array_agg, json_agg) keeps its FILTER and goes to
PostgreSQL with the allowlist's reason.

A set-returning function in FROM names its column by its alias (``generate_series(1, 3) AS g``
has a column ``g``; without an alias, ``generate_series``), which DuckDB does not: the name is
written out as a column alias (`name_series_columns`).

``x BETWEEN SYMMETRIC a AND b`` becomes ``(x BETWEEN a AND b OR x BETWEEN b AND a)``
(`fold_between_symmetric`): PostgreSQL's parser makes the very same OR of the two ranges
(transformAExprBetween), evaluating the operands twice, NULLs and all; ``NOT`` of it is the
negation of that OR. Operands holding a parameter (a repeated ``%s`` would ask for another
value) or a subquery (whose blocks the statement's analysis holds) stay as written: the
statement then goes to PostgreSQL.

``(a, b) IN ((1, 2), (3, 4))`` becomes ``((a = 1 AND b = 2) OR (a = 3 AND b = 4))``
(`fold_row_in`): PostgreSQL compares the row with each listed row (false if a pair differs, else
NULL if a pair is NULL, else true: the AND of the pairs' equalities) and ORs the outcomes, so
the two agree on NULLs as well (DuckDB's own row IN does not). ``NOT IN`` is its negation. Up
to ROW_IN_ROWS listed rows, and not over a parameter or a subquery (both copied per row).

``x IN (a.col, 'c')`` becomes ``(x = a.col OR x IN ('c'))`` (`fold_in_with_columns`), which is
how PostgreSQL's parser reads an IN list whose values read columns of its own query level: each
such value with its own ``=`` (a varchar compared with a char(n) column compares as char,
trailing blanks ignored), the constants together in the left operand's type. A value reading an
outer query's column is a constant to PostgreSQL: such a list is not folded (each column must
be qualified by a FROM item of the IN's own SELECT).
"""

from __future__ import annotations

from sqlglot import exp

from sql_ext.blocks import from_items

# the aggregates that skip NULL inputs
SKIPS_NULLS = (
    exp.Count,
    exp.Sum,
    exp.Avg,
    exp.Min,
    exp.Max,
    exp.LogicalAnd,
    exp.LogicalOr,
    exp.GroupConcat,
    exp.Stddev,
    exp.StddevSamp,
    exp.StddevPop,
    exp.Variance,
    exp.VariancePop,
)


ROW_IN_ROWS = 100  # listed rows a row IN is folded for (beyond: as written, to PostgreSQL)


def fold(tree: exp.Expr) -> None:
    """Every fold of the module, in place (again: nothing)."""
    fold_filters(tree)
    fold_between_symmetric(tree)
    fold_row_in(tree)
    fold_in_with_columns(tree)
    name_series_columns(tree)


def fold_in_with_columns(tree: exp.Expr) -> None:
    """``x IN (a.col, b.col, 'c', 'd')`` as PostgreSQL's parser makes it (transformAExprIn):
    each listed value that reads a column compared with its own ``=`` (whose operand types
    PostgreSQL resolves pair by pair: a varchar meeting a char(n) column compares as char), the
    rest in one ``IN`` of the left operand's type; ORed (NOT IN: its negation, the AND of
    ``<>``). Not over a parameter or a subquery (copied per value)."""
    for node in list(tree.find_all(exp.In)):
        left, listed = node.this, node.expressions
        if node.args.get("query") or not listed or isinstance(left, exp.Tuple):
            continue
        reading = [v for v in listed if v.find(exp.Column) is not None]
        if not reading or len(listed) > ROW_IN_ROWS:
            continue
        own = _from_names(node.find_ancestor(exp.Select))
        if not all(
            c.table and c.table.lower() in own for v in reading for c in v.find_all(exp.Column)
        ):
            continue  # (an outer reference is a constant to PostgreSQL: compared in the list)
        if any(p.find(exp.Placeholder, exp.Parameter, exp.Query) for p in (left, *listed)):
            continue
        constants = [v for v in listed if v.find(exp.Column) is None]
        terms: list[exp.Expr] = [exp.EQ(this=left.copy(), expression=v.copy()) for v in reading]
        if constants:
            terms.append(exp.In(this=left.copy(), expressions=[c.copy() for c in constants]))
        node.replace(exp.Paren(this=exp.or_(*terms, copy=False)))


def _from_names(select: exp.Select | None) -> set[str]:
    """The names a SELECT's own FROM items are known by (their aliases, else their table
    names), lower case."""
    if select is None:
        return set()
    names = set()
    for item in from_items(select):
        alias = item.args.get("alias")
        if isinstance(alias, exp.TableAlias) and alias.this is not None:
            names.add(alias.name.lower())
        elif isinstance(item, exp.Table):
            names.add(item.name.lower())
    return names


def name_series_columns(tree: exp.Expr) -> None:
    """``generate_series(...) AS g`` as ``AS g(g)``, and without an alias as
    ``AS generate_series(generate_series)``: the column's name as PostgreSQL gives it, written
    out for DuckDB (which would name it otherwise)."""
    for node in list(tree.find_all(exp.GenerateSeries)):
        table = node.parent
        if not isinstance(table, exp.Table) or table.this is not node:
            continue
        alias = table.args.get("alias")
        if isinstance(alias, exp.TableAlias) and alias.columns:
            continue
        name = alias.this if isinstance(alias, exp.TableAlias) and alias.this else None
        name = name or exp.to_identifier("generate_series")
        table.set("alias", exp.TableAlias(this=name.copy(), columns=[name.copy()]))


def fold_row_in(tree: exp.Expr) -> None:
    """``(a, b) IN ((1, 2), ...)`` as PostgreSQL decides it (see the module)."""
    for node in list(tree.find_all(exp.In)):
        row, listed = node.this, node.expressions
        if not isinstance(row, exp.Tuple) or node.args.get("query") or not listed:
            continue
        width = len(row.expressions)
        if len(listed) > ROW_IN_ROWS or any(
            not isinstance(r, exp.Tuple) or len(r.expressions) != width for r in listed
        ):
            continue
        if any(p.find(exp.Placeholder, exp.Parameter, exp.Query) for p in (row, *listed)):
            continue
        matches = [
            exp.Paren(
                this=exp.and_(
                    *(
                        exp.EQ(this=a.copy(), expression=b.copy())
                        for a, b in zip(row.expressions, other.expressions, strict=True)
                    ),
                    copy=False,
                )
            )
            for other in listed
        ]
        node.replace(exp.Paren(this=exp.or_(*matches, copy=False)))


def fold_between_symmetric(tree: exp.Expr) -> None:
    """``x BETWEEN SYMMETRIC a AND b`` as PostgreSQL reads it (see the module)."""
    for node in list(tree.find_all(exp.Between)):
        if not node.args.get("symmetric"):
            continue
        value, low, high = node.this, node.args["low"], node.args["high"]
        if any(p.find(exp.Placeholder, exp.Parameter, exp.Query) for p in (value, low, high)):
            continue  # (a subquery's blocks are the statement's analysis: never copied)
        ranges = exp.Or(
            this=exp.Between(this=value.copy(), low=low.copy(), high=high.copy()),
            expression=exp.Between(this=value.copy(), low=high.copy(), high=low.copy()),
        )
        node.replace(exp.Paren(this=ranges))


def fold_filters(tree: exp.Expr) -> None:
    """Fold every foldable FILTER of ``tree`` into its aggregate, in place (again: nothing)."""
    for node in list(tree.find_all(exp.Filter)):
        aggregate, where = node.this, node.expression
        every = isinstance(aggregate, exp.Anonymous) and aggregate.name.lower() == "every"
        if not (isinstance(aggregate, SKIPS_NULLS) or every) or not isinstance(where, exp.Where):
            continue
        condition = where.this  # (moved, not copied: a subquery in it keeps its block)
        value = aggregate.this
        if every:  # (every(v): a call of its name, its value its first argument)
            if len(aggregate.expressions) != 1:
                continue
            aggregate.set("expressions", [_when(condition, aggregate.expressions[0])])
        elif isinstance(value, exp.Distinct):
            if len(value.expressions) != 1:
                continue
            value.set("expressions", [_when(condition, value.expressions[0])])
        elif isinstance(value, exp.Order):  # string_agg(v, ',' ORDER BY ...)
            value.set("this", _when(condition, value.this))
        elif isinstance(value, exp.Star) or value is None:  # count(*)
            aggregate.set("this", _when(condition, exp.Literal.number(1)))
        else:
            aggregate.set("this", _when(condition, value))
        node.replace(aggregate)


def _when(condition: exp.Expr, value: exp.Expr) -> exp.Expr:
    return exp.Case(ifs=[exp.If(this=condition, true=value)])


__all__ = [
    "ROW_IN_ROWS",
    "SKIPS_NULLS",
    "fold",
    "fold_between_symmetric",
    "fold_filters",
    "fold_row_in",
]
