"""The statement DuckDB runs for a guarded plan once its guards have chosen (SPEC §5.4): the
query without extensions, in DuckDB's dialect, each table reference rebound to the cached view
its SwitchUnion chose or to its remote leaf's rows (registered under a name of their own), and
its placeholders as DuckDB named parameters. Pure: the executor compiles it once per choice.
"""

from __future__ import annotations

import typing as t
from collections.abc import Mapping
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from optimizer.leaves import RemoteLeaf, unescape_percent
from optimizer.pg_semantics import Semantics
from optimizer.plan import Plan
from sql_ext.nodes import strip_extensions
from sql_ext.params import NODE_ID, Key, duckdb_name

# How an output column of the statement is made from DuckDB's result columns: the column
# itself (its index), or ("avg" | "divide", numerator index, denominator index) for an
# average or division the cache does as PostgreSQL (optimizer.divisions).
Output = int | tuple[str, int, int]


@dataclass(frozen=True)
class LocalStatement:
    sql: str  # DuckDB
    keys: tuple[Key, ...]  # each placeholder key, in textual order ...
    names: tuple[str, ...]  # ... and its DuckDB parameter name
    leaves: tuple[tuple[str, RemoteLeaf], ...]  # (registered name, leaf), statement order
    outputs: tuple[Output, ...] | None = None  # None: DuckDB's columns as they are


def leaf_name(instance_id: int) -> str:
    return f"mtcache_leaf_{instance_id}"


def local_statement(plan: Plan, choice: Mapping[int, str | None]) -> LocalStatement:
    """The statement for a choice: instance id -> the cached view read (None: the leaf)."""
    analysis = plan.analysis
    copy = strip_extensions(analysis.query.tree)
    if plan.with_params:
        unescape_percent(copy)
    by_id = {n.meta[NODE_ID]: n for n in copy.walk() if NODE_ID in n.meta}
    leaves = []
    for access in plan.accesses:
        view = choice.get(access.instance.id)
        if view is None:
            target = leaf_name(access.instance.id)
            leaves.append((target, access.leaf))
        else:
            target = view
        by_id[access.access.node.meta[NODE_ID]].replace(
            exp.Table(this=exp.to_identifier(target),
                      alias=exp.TableAlias(this=exp.to_identifier(access.alias)))
        )  # fmt: skip
    _compute_as_postgres(by_id, analysis.semantics)
    for mark in list(copy.find_all(exp.Placeholder)):
        key = analysis.parameter_keys[mark.meta[NODE_ID]]
        mark.replace(exp.Placeholder(this=exp.to_identifier(duckdb_name(key))))
    outputs = _split_divisions(copy, analysis.divisions) if analysis.divisions else None
    keys = analysis.keys
    sql = copy.sql(dialect="duckdb", copy=False)  # our own copy
    return LocalStatement(sql, keys, tuple(map(duckdb_name, keys)), tuple(leaves), outputs)


def _split_divisions(select: exp.Expr, divisions: Mapping[int, str]) -> tuple[Output, ...]:
    """Each output average or division becomes its numerator and denominator (sum and count
    for an average), which DuckDB computes exactly; the cache divides (SPEC §5.11)."""
    assert isinstance(select, exp.Select)
    projections: list[exp.Expr] = []
    outputs: list[Output] = []
    for index, projection in enumerate(select.expressions):
        kind = divisions.get(index)
        if kind is None:
            outputs.append(len(projections))
            projections.append(projection)
            continue
        node = projection.this if isinstance(projection, exp.Alias) else projection
        if kind == "avg":
            numerator: exp.Expr = exp.Sum(this=node.this.copy())
            denominator: exp.Expr = exp.Count(this=node.this.copy())
        else:
            numerator, denominator = node.this.copy(), node.expression.copy()
        outputs.append((kind, len(projections), len(projections) + 1))
        projections += [exp.alias_(numerator, f"mtcache_numerator_{index}"),
                        exp.alias_(denominator, f"mtcache_denominator_{index}")]  # fmt: skip
    select.set("expressions", projections)
    return tuple(outputs)


def _compute_as_postgres(by_id: Mapping[int, exp.Expr], semantics: Semantics) -> None:
    """The rewrites that make DuckDB compute what PostgreSQL computes (optimizer.pg_semantics).
    A wrapped node stays itself (not a copy), so rewrites of nodes inside it still apply."""
    for number in semantics.rtrim:
        # char(n) is stored without its trailing blanks: so are what it is compared with
        _wrap(by_id[number], lambda n: exp.func("RTRIM", n, exp.Literal.string(" ")))
    for number, width in semantics.rpad.items():
        # ... but patterns and printing see them: pad the value again for those
        _wrap(by_id[number], lambda n, w=width: exp.func(  # type: ignore[misc]
            "RPAD", n, exp.Literal.number(w), exp.Literal.string(" ")))
    for number, scale in semantics.decimal_scales.items():
        by_id[number].set("to", exp.DataType.build(f"DECIMAL(38, {scale})"))
    for number in semantics.doubles:
        _wrap(by_id[number], lambda n: exp.cast(n, "DOUBLE"))
    for number, text in semantics.exact_numbers.items():
        by_id[number].replace(sqlglot.parse_one(text, read="duckdb"))


def _wrap(node: exp.Expr, make: t.Callable[[exp.Expr], exp.Expr]) -> None:
    hole = exp.Null()
    node.replace(hole)
    hole.replace(make(node))
