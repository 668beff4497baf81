"""Equivalence classes of columns and constants (as PostgreSQL's planner keeps them), per
SELECT block: ``a.x = b.y`` puts the two columns in one class, ``a.x = 4`` (or ``IN (4, 8)``)
gives the class constants. A table access can then be restricted by everything its columns are
known to equal: ``a JOIN b ON a.authorid = b.authorid WHERE a.authorid = 2`` probes and restricts
``b`` by ``authorid = 2`` too, so a gray child is found present through its parent's key and a
remote leaf fetches only the rows that matter.

What holds where: a block's top-level AND-ed conjuncts (WHERE and inner-join ON; not outer-join
ON, not under OR or NOT) restrict the rows of that block's own FROM items. A LEFT JOIN's ON
conjuncts hold, on top of those, for its null-supplying side alone: ``a LEFT JOIN b ON
a.authorid = b.authorid WHERE a.authorid = 2`` (an ORM joinedload) needs only b's rows of
authorid 2, while every a row of authorid 2 stays whatever b holds. A subquery in WHERE or
in the select list is evaluated only for rows of its enclosing block that pass those conjuncts,
so it inherits the enclosing block's classes (correlation); a derived table or CTE body is
computed on its own and inherits nothing, but the block reading it learns its constants: every
row it yields passed its body's conjuncts (``(SELECT ... WHERE authorid = 2 LIMIT 1) AS anon_1
LEFT JOIN books ON anon_1.authorid = books.authorid``, an ORM joinedload with LIMIT).
"""

from __future__ import annotations

import typing as t
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sqlglot import exp

from sql_ext import Block, Query
from sql_ext.fds import Attr
from sql_ext.nodes import ConstantList
from sql_ext.params import is_constant

Resolve = Callable[[Block, exp.Column], Attr | None]


@dataclass
class Classes:
    """The equivalence classes one block sees: union-find over attributes, constants per
    class (``=`` constants, and the IN lists the class is restricted to)."""

    parent: dict[Attr, Attr] = field(default_factory=dict)
    equal: dict[Attr, list[exp.Expr]] = field(default_factory=dict)  # root -> = constants
    within: dict[Attr, list[list[exp.Expr]]] = field(default_factory=dict)  # root -> IN lists

    def find(self, attr: Attr) -> Attr:
        parent = self.parent.get(attr, attr)
        if parent == attr:
            return attr
        root = self.find(parent)
        self.parent[attr] = root
        return root

    def union(self, a: Attr, b: Attr) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        self.parent[ra] = rb
        self.equal.setdefault(rb, []).extend(self.equal.pop(ra, []))
        self.within.setdefault(rb, []).extend(self.within.pop(ra, []))

    def constants(self, attr: Attr) -> tuple[exp.Expr, ...] | None:
        """The values the attribute is known to take: its class's ``=`` constants, else its
        shortest IN list (None: not restricted to constants)."""
        root = self.find(attr)
        if self.equal.get(root):
            return tuple(self.equal[root])
        shortest: list[exp.Expr] | None = None
        for values in self.within.get(root, ()):
            if shortest is None or len(values) < len(shortest):
                shortest = values
        return tuple(shortest) if shortest is not None else None

    def constant_attrs(self) -> Iterator[tuple[Attr, tuple[exp.Expr, ...]]]:
        """Every attribute known to take constants, with them."""
        for attr in {*self.parent, *self.equal, *self.within}:
            values = self.constants(attr)
            if values is not None:
                yield attr, values

    def copy(self) -> Classes:
        return Classes(
            dict(self.parent),
            {k: list(v) for k, v in self.equal.items()},
            {k: list(v) for k, v in self.within.items()},
        )


def block_classes(query: Query, resolve: Resolve) -> dict[int, Classes]:
    """The classes each block sees (by ``id(block.select)``)."""
    bodies = {
        id(body.select)
        for block in query.analysis.blocks
        for source in block.sources
        for body in source.body
    }
    found: dict[int, Classes] = {}

    def of(block: Block) -> Classes:
        key = id(block.select)
        if key in found:
            return found[key]
        inherited = block.parent is not None and key not in bodies
        classes = of(t.cast(Block, block.parent)).copy() if inherited else Classes()
        for source in block.sources:
            if len(source.body) == 1:  # every row of a derived table or CTE passed its body
                for attr, values in of(source.body[0]).constant_attrs():
                    classes.equal.setdefault(classes.find(attr), []).extend(values)
        for predicate in block.conjuncts():
            _add(classes, block, predicate, resolve)
        found[key] = classes
        return classes

    for block in query.analysis.blocks:
        of(block)
    return found


def joined(classes: Classes, block: Block, predicates: list[exp.Expr], resolve: Resolve) -> Classes:
    """A block's classes with the ON predicates of an outer join added: what holds for the
    rows of its null-supplying side that reach the result (`Block.join_conditions`)."""
    if not predicates:
        return classes
    extended = classes.copy()
    for predicate in predicates:
        _add(extended, block, predicate, resolve)
    return extended


def _add(classes: Classes, block: Block, predicate: exp.Expr, resolve: Resolve) -> None:
    if isinstance(predicate, exp.EQ):
        left, right = predicate.this, predicate.expression
        if isinstance(left, exp.Column) and isinstance(right, exp.Column):
            a, b = resolve(block, left), resolve(block, right)
            if a is not None and b is not None:
                classes.union(a, b)
            return
        column, constant = (left, right) if isinstance(left, exp.Column) else (right, left)
        if isinstance(column, exp.Column) and is_constant(constant):
            attr = resolve(block, column)
            if attr is not None:
                classes.equal.setdefault(classes.find(attr), []).append(constant)
        return
    if (
        isinstance(predicate, exp.In)
        and isinstance(predicate.this, exp.Column)
        and not predicate.args.get("query")
        and predicate.expressions
        and all(is_constant(v) or isinstance(v, ConstantList) for v in predicate.expressions)
    ):
        attr = resolve(block, predicate.this)
        if attr is not None:
            values = predicate.expressions
            if isinstance(values[0], ConstantList):  # a long list: its keys one by one
                values = values[0].literals()
            classes.within.setdefault(classes.find(attr), []).append(list(values))
