"""Seeded random PostgreSQL SELECTs over the TPC-H schema, as an application would write them:
expressions of every type family (integers, numerics, floating point, strings of each kind,
dates, timestamps, intervals, booleans), joins along keys (inner and outer, so NULLs abound),
grouping and aggregates, DISTINCT, IN / EXISTS / scalar subqueries, derived tables and CTEs,
set operations, window functions, ORDER BY with LIMIT / OFFSET, NULL-heavy predicates, and
expressions that must raise.

Every query is deterministic on PostgreSQL - whatever plan either side picks, its answer is one
set of rows (one sequence when ordered): LIMIT / OFFSET come with an ORDER BY of every output
column, a window orders its rows by a key, an ordered aggregate (``string_agg``, ``array_agg``)
says its order (``array_agg`` to the key of every table it reads), a scalar subquery returns at
most one row, and nothing volatile is called.

`Generator(seed).query()` gives a `Select` or `Compound`: SQL text with its parts kept apart, so
that a failing query can be made smaller (`shrink`) while it still fails.
"""

from __future__ import annotations

import dataclasses
import random
import re
import typing as t
from collections.abc import Iterator

from experiments.differential.shapes import Compound, Query, Select, Source
from experiments.differential.vocabulary import (
    DATES,
    FOREIGN_KEYS,
    INTEGERS,
    INTERVALS,
    KEYS,
    MATCH_REGEXES,
    NARROW,
    NUMERICS,
    PATTERNS,
    REGEXES,
    REPLACEMENTS,
    SCHEMA,
    SERIES_JOINS,
    SIMILAR,
    TEXT_FUNCTIONS,
    TEXT_LITERALS,
    TO_CHAR_DATE,
    TO_CHAR_NUMBER,
    Column,
    Family,
)

GLOBAL = ", 'g'"  # regexp_replace's flag for every match


class Generator:
    """Random queries from a seed: the same seed, the same queries."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self._aliases = 0
        self.last_scope: list[Source] = []  # the sources of the last FROM clause made
        self.families: dict[str, Family] = {}  # the family of each select item made

    # -- helpers -------------------------------------------------------------------------------

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    def pick(self, options: t.Sequence[t.Any]) -> t.Any:
        return options[self.r.randrange(len(options))]

    def alias(self, table: str) -> str:
        self._aliases += 1
        return f"{table[0]}{self._aliases}"

    def source(self, table: str, nullable: bool = False) -> Source:
        return Source(self.alias(table), tuple(SCHEMA[table]), table, nullable)

    def column(self, scope: list[Source], family: Family) -> str | None:
        found = [(s, c) for s in scope for c in s.columns if c.family == family]
        if not found:
            return None
        source, column = self.pick(found)
        return f"{source.alias}.{column.name}"

    # -- expressions by family -----------------------------------------------------------------

    def expr(self, family: Family, scope: list[Source], depth: int = 2) -> str:
        make = getattr(self, f"_{family}")
        return t.cast(str, make(scope, depth))

    def _leaf(self, family: Family, scope: list[Source], literals: t.Sequence[str]) -> str:
        column = self.column(scope, family) if self.chance(0.75) else None
        if column:
            return column
        literal = t.cast(str, self.pick(literals))
        # a negative number in parentheses: -3::text is -(3::text) to PostgreSQL
        return f"({literal})" if literal.startswith("-") else literal

    def _common(self, family: Family, scope: list[Source], depth: int) -> str | None:
        """What every family has: CASE, COALESCE, NULLIF, GREATEST/LEAST, NULL."""
        roll = self.r.random()
        if roll < 0.05:
            a = self.expr(family, scope, depth - 1)
            return f"CASE WHEN {self._bool(scope, depth - 1)} THEN {a} END"
        if roll < 0.10:
            a, b = self.expr(family, scope, depth - 1), self.expr(family, scope, depth - 1)
            return f"CASE WHEN {self._bool(scope, depth - 1)} THEN {a} ELSE {b} END"
        if roll < 0.15:
            a, b = self.expr(family, scope, depth - 1), self.expr(family, scope, depth - 1)
            return f"coalesce({a}, {b})"
        if roll < 0.18 and family != "bool":
            a, b = self.expr(family, scope, depth - 1), self.expr(family, scope, depth - 1)
            return f"nullif({a}, {b})"
        if roll < 0.22 and family not in ("bool", "interval"):
            a, b = self.expr(family, scope, depth - 1), self.expr(family, scope, depth - 1)
            return f"{self.pick(('greatest', 'least'))}({a}, {b})"
        return None

    def _int(self, scope: list[Source], depth: int) -> str:
        if depth <= 0:
            return self._leaf("int", scope, INTEGERS)
        common = self._common("int", scope, depth)
        if common is not None:
            return common
        d = depth - 1
        options: list[t.Callable[[], str]] = [
            lambda: self._leaf("int", scope, INTEGERS),
            lambda: self._leaf("int", scope, INTEGERS),
            lambda: f"({self._int(scope, d)} {self.pick('+-')} {self._int(scope, d)})",
            lambda: f"({self._int(scope, d)} * {self.pick(INTEGERS[1:6])})",
            lambda: f"({self._int(scope, d)} / {self.pick(('2', '3', '7', '-4'))})",
            lambda: f"({self._int(scope, d)} % {self.pick(('2', '3', '10', '-7'))})",
            lambda: f"mod({self._int(scope, d)}, {self.pick(('3', '5', '-2'))})",
            lambda: f"abs({self._int(scope, d)})",
            lambda: f"-({self._int(scope, d)})",
            lambda: f"length({self._text(scope, d)})",
            lambda: f"char_length({self._text(scope, d)})",
            lambda: f"octet_length({self._text(scope, d)})",
            lambda: f"strpos({self._text(scope, d)}, {self.pick(('a', 'e', ' ', 'A'))!r})",
            lambda: f"position({self.pick(('a', 'ly', ' '))!r} in {self._text(scope, d)})",
            lambda: f"ascii({self._text(scope, d)})",
            lambda: f"({self._date(scope, d)} - {self._date(scope, d)})",
            lambda: f"{self._numeric(scope, d)}::int",
            lambda: f"CAST({self._numeric(scope, d)} AS bigint)",
            lambda: f"{self._int(scope, d)}::smallint",
            lambda: f"width_bucket({self._numeric(scope, d)}, 0, 1000, 5)",
            lambda: f"extract(year from {self._date(scope, d)})::int",
        ]
        return self.pick(options)()

    def _numeric(self, scope: list[Source], depth: int) -> str:
        if depth <= 0:
            return self._leaf("numeric", scope, NUMERICS)
        common = self._common("numeric", scope, depth)
        if common is not None:
            return common
        d = depth - 1
        options: list[t.Callable[[], str]] = [
            lambda: self._leaf("numeric", scope, NUMERICS),
            lambda: self._leaf("numeric", scope, NUMERICS),
            lambda: f"({self._numeric(scope, d)} {self.pick('+-')} {self._numeric(scope, d)})",
            lambda: f"({self._numeric(scope, d)} + {self._int(scope, d)})",
            lambda: f"({self._numeric(scope, d)} * {self.pick(NUMERICS[:8])})",
            lambda: f"({self._numeric(scope, d)} / {self.pick(('2', '3', '7', '0.3', '4.00'))})",
            lambda: f"round({self._numeric(scope, d)}, {self.pick(('0', '1', '2', '3', '-1'))})",
            lambda: f"round({self._numeric(scope, d)})",
            lambda: f"round({self._int(scope, d)} / {self.pick(('3', '7'))}, 1)",
            lambda: f"trunc({self._numeric(scope, d)}, {self.pick(('0', '1', '-1'))})",
            lambda: f"{self.pick(('ceil', 'ceiling', 'floor', 'abs'))}({self._numeric(scope, d)})",
            lambda: f"-({self._numeric(scope, d)})",
            lambda: f"{self._int(scope, d)}::numeric",
            lambda: f"{self._numeric(scope, d)}::numeric(12,{self.pick('0124')})",
            lambda: (
                f"extract({self.pick(('year', 'month', 'day', 'dow', 'quarter'))} "
                f"from {self._date(scope, d)})"
            ),
            lambda: f"mod({self._numeric(scope, d)}, {self.pick(('3', '0.7', '10'))})",
            lambda: f"sign({self._numeric(scope, d)})",
            lambda: f"div({self._int(scope, d)}, {self.pick(('2', '-3', '7'))})",
        ]
        return self.pick(options)()

    def _float(self, scope: list[Source], depth: int) -> str:
        d = max(depth - 1, 0)
        if depth > 0:
            common = self._common("float", scope, depth)
            if common is not None:
                return common
        options: list[t.Callable[[], str]] = [
            lambda: f"{self._numeric(scope, d)}::float8",
            lambda: f"{self._int(scope, d)}::double precision",
            lambda: f"{self._numeric(scope, d)}::real",
            lambda: (
                f"date_part({self.pick(('year', 'month', 'dow', 'doy'))!r}, {self._date(scope, d)})"
            ),
            lambda: f"{self.pick(('1.5', '-0.0', 'NaN', 'Infinity', '1e-3', '3.25'))!r}::float8",
            lambda: f"({self._float(scope, 0)} * {self.pick(('2', '1.5', '0.1'))})",
            lambda: f"({self._float(scope, 0)} + {self._float(scope, 0)})",
            lambda: f"sqrt(abs({self._numeric(scope, d)})::float8)",
            lambda: f"power({self._numeric(scope, d)}::float8, 2)",
            lambda: f"round({self._numeric(scope, d)}::float8)",
        ]
        return self.pick(options)()

    def _text(self, scope: list[Source], depth: int) -> str:
        if depth <= 0:
            return self._leaf("text", scope, TEXT_LITERALS)
        common = self._common("text", scope, depth)
        if common is not None:
            return common
        d = depth - 1
        options: list[t.Callable[[], str]] = [
            lambda: self._leaf("text", scope, TEXT_LITERALS),
            lambda: self._leaf("text", scope, TEXT_LITERALS),
            lambda: self._leaf("text", scope, TEXT_LITERALS),
            lambda: f"({self._text(scope, d)} || {self._text(scope, d)})",
            lambda: f"({self._text(scope, d)} || {self._int(scope, d)})",
            lambda: f"{self.pick(TEXT_FUNCTIONS)}({self._text(scope, d)})",
            lambda: (
                f"substr({self._text(scope, d)}, {self.pick(('1', '2', '5'))}, "
                f"{self.pick(('1', '3', '10'))})"
            ),
            lambda: (
                f"substring({self._text(scope, d)} from {self.pick(('1', '3', '0'))} for "
                f"{self.pick(('2', '4'))})"
            ),
            lambda: f"substring({self._text(scope, d)} from {self.pick(('2', '4'))})",
            lambda: (
                f"{self.pick(('left', 'right'))}({self._text(scope, d)}, "
                f"{self.pick(('1', '3', '-2'))})"
            ),
            lambda: (
                f"replace({self._text(scope, d)}, {self.pick(('a', ' ', 'e'))!r}, "
                f"{self.pick(('', 'X', '--'))!r})"
            ),
            lambda: (
                f"{self.pick(('lpad', 'rpad'))}({self._text(scope, d)}, "
                f"{self.pick(('5', '12', '0'))}, {self.pick(('*', ' ', 'ab'))!r})"
            ),
            lambda: f"repeat({self._text(scope, d)}, {self.pick(('2', '0'))})",
            lambda: (
                f"concat({self._text(scope, d)}, {self._int(scope, d)}, {self._text(scope, d)})"
            ),
            lambda: f"concat_ws('-', {self._text(scope, d)}, {self._text(scope, d)})",
            lambda: f"split_part({self._text(scope, d)}, ' ', {self.pick(('1', '2'))})",
            lambda: f"translate({self._text(scope, d)}, 'aeiou', 'AEIOU')",
            lambda: f"to_hex({self._int(scope, d)})",
            lambda: f"chr(65 + abs({self._int(scope, d)}) % 26)",
            lambda: f"{self._int(scope, d)}::text",
            lambda: f"{self._numeric(scope, d)}::text",
            lambda: f"{self._date(scope, d)}::text",
            lambda: f"{self._text(scope, d)}::varchar",
            lambda: f"to_char({self._date(scope, d)}, {self.pick(TO_CHAR_DATE)})",
            lambda: f"to_char({self._numeric(scope, d)}, {self.pick(TO_CHAR_NUMBER)})",
            lambda: f"{self.pick(DATES)}::varchar",
            lambda: (
                f"regexp_replace({self._text(scope, d)}, {self.pick(MATCH_REGEXES)}, "
                f"{self.pick(REPLACEMENTS)}{self.pick(('', GLOBAL))})"
            ),
            lambda: f"substring({self._text(scope, d)} from {self.pick(MATCH_REGEXES)})",
        ]
        return self.pick(options)()

    def _date(self, scope: list[Source], depth: int) -> str:
        if depth <= 0:
            return self._leaf("date", scope, DATES)
        common = self._common("date", scope, depth)
        if common is not None:
            return common
        d = depth - 1
        options: list[t.Callable[[], str]] = [
            lambda: self._leaf("date", scope, DATES),
            lambda: self._leaf("date", scope, DATES),
            lambda: f"({self._date(scope, d)} {self.pick('+-')} {self.pick(INTEGERS[:8])})",
            lambda: (
                f"make_date({self.pick(('1995', '2000', '1992'))}, "
                f"{self.pick(('1', '2', '12'))}, {self.pick(('1', '28', '15'))})"
            ),
            lambda: f"{self._timestamp(scope, d)}::date",
            lambda: f"({self._date(scope, d)} + {self.pick(INTERVALS)})::date",
        ]
        return self.pick(options)()

    def _timestamp(self, scope: list[Source], depth: int) -> str:
        d = max(depth - 1, 0)
        options: list[t.Callable[[], str]] = [
            lambda: f"{self._date(scope, d)}::timestamp",
            lambda: f"{self.pick(DATES)}::timestamp",
            lambda: f"timestamp {self.pick(('1995-01-01 10:30:00', '1998-12-31 23:59:59.5'))!r}",
            lambda: f"({self._date(scope, d)} + {self.pick(INTERVALS)})",
            lambda: f"({self._date(scope, d)} + time '10:15')",
            lambda: (
                f"date_trunc({self.pick(('month', 'year', 'week'))!r}, "
                f"{self._date(scope, d)}::timestamp)"
            ),
            lambda: f"date_trunc('month', {self._date(scope, d)})",
        ]
        return self.pick(options)()

    def _interval(self, scope: list[Source], depth: int) -> str:
        d = max(depth - 1, 0)
        options: list[t.Callable[[], str]] = [
            lambda: self.pick(INTERVALS),
            lambda: f"({self._timestamp(scope, d)} - {self._timestamp(scope, d)})",
            lambda: f"age({self._timestamp(scope, d)}, {self._timestamp(scope, d)})",
            lambda: f"({self.pick(INTERVALS)} * {self.pick(('2', '0.5'))})",
            lambda: f"({self._date(scope, d)} - {self.pick(DATES)}) * interval '1 day'",
        ]
        return self.pick(options)()

    def _bool(self, scope: list[Source], depth: int) -> str:
        d = max(depth - 1, 0)
        if depth > 0 and self.chance(0.2):
            a, b = self._bool(scope, d), self._bool(scope, d)
            return self.pick((f"({a} AND {b})", f"({a} OR {b})", f"NOT ({a})"))
        family = self.pick(
            ("int", "int", "numeric", "numeric", "text", "text", "date", "float", "timestamp")
        )
        a = self.expr(family, scope, d)
        roll = self.r.random()
        if roll < 0.35:
            op = self.pick(("=", "<>", "<", "<=", ">", ">="))
            return f"{a} {op} {self.expr(family, scope, d)}"
        if roll < 0.45:
            return f"{a} IS {self.pick(('', 'NOT '))}NULL"
        if roll < 0.52:
            low, high = self.expr(family, scope, 0), self.expr(family, scope, 0)
            symmetric = self.pick(("", "", "SYMMETRIC "))
            return f"{a} {self.pick(('', 'NOT '))}BETWEEN {symmetric}{low} AND {high}"
        if roll < 0.60:
            values = ", ".join(self.expr(family, scope, 0) for _ in range(self.r.randint(1, 4)))
            if self.chance(0.25):
                values += ", NULL"
            if self.chance(0.2):  # a row of two values IN a list of rows (NULLs among them)
                other = self.expr("int", scope, 0)
                rows = ", ".join(
                    f"({self.expr(family, scope, 0)}, {self.pick(('1', '7', 'NULL', '-2'))})"
                    for _ in range(self.r.randint(1, 3))
                )
                return f"({a}, {other}) {self.pick(('', 'NOT '))}IN ({rows})"
            return f"{a} {self.pick(('', 'NOT '))}IN ({values})"
        if roll < 0.64:
            return f"{a} IS {self.pick(('', 'NOT '))}DISTINCT FROM {self.expr(family, scope, d)}"
        text = self._text(scope, d)
        if roll < 0.75:
            word = self.pick(("LIKE", "NOT LIKE", "ILIKE", "NOT ILIKE"))
            return f"{text} {word} {self.pick(PATTERNS)}"
        if roll < 0.80:
            return f"{text} {self.pick(('', 'NOT '))}SIMILAR TO {self.pick(SIMILAR)}"
        if roll < 0.85:
            return f"{text} {self.pick(('~', '~*', '!~'))} {self.pick(REGEXES)}"
        if roll < 0.88:
            return f"starts_with({text}, {self.pick(('A', 'Cu', '1', ''))!r})"
        if roll < 0.91:
            return f"({self._bool(scope, d)}) IS {self.pick(('TRUE', 'NOT FALSE', 'UNKNOWN'))}"
        if roll < 0.96 and scope and any(s.table for s in scope):
            return self._exists(scope)
        return self._in_subquery(scope)

    # -- subqueries ----------------------------------------------------------------------------

    def _exists(self, scope: list[Source]) -> str:
        """EXISTS / NOT EXISTS correlated along a key."""
        links = [
            (fk, outer)
            for outer in scope
            if outer.table
            for fk in FOREIGN_KEYS
            if outer.table in (fk[0], fk[2])
        ]
        if not links:
            return "TRUE"
        (child, ccols, parent, pcols), outer = self.pick(links)
        inner_table, inner_cols, outer_cols = (
            (child, ccols, pcols) if outer.table == parent else (parent, pcols, ccols)
        )
        inner = self.source(inner_table)
        on = " AND ".join(
            f"{inner.alias}.{i} = {outer.alias}.{o}"
            for i, o in zip(inner_cols, outer_cols, strict=True)
        )
        extra = f" AND {self._bool([inner], 1)}" if self.chance(0.6) else ""
        word = self.pick(("EXISTS", "NOT EXISTS"))
        return f"{word} (SELECT 1 FROM {inner_table} {inner.alias} WHERE {on}{extra})"

    def _in_subquery(self, scope: list[Source]) -> str:
        table = self.pick(("nation", "region", "supplier", "part", "customer"))
        inner = self.source(table)
        key = KEYS[table][0]
        column = self.column(scope, "int") or "1"
        negated = self.pick(("", "NOT "))
        where = f" WHERE {self._bool([inner], 1)}" if self.chance(0.7) else ""
        if self.chance(0.2):  # a row-valued IN with a column that may be NULL
            second = self.column(scope, "int") or "2"
            return (
                f"({column}, {second}) {negated}IN (SELECT {inner.alias}.{key}, "
                f"nullif({inner.alias}.{key} % 3, 0) FROM {table} {inner.alias}{where})"
            )
        return (
            f"{column} {negated}IN (SELECT {inner.alias}.{key} FROM {table} {inner.alias}{where})"
        )

    def _scalar_subquery(self, scope: list[Source]) -> str:
        """A correlated aggregate (one row per outer row)."""
        links = [
            (fk, outer)
            for outer in scope
            if outer.table
            for fk in FOREIGN_KEYS
            if outer.table == fk[2]
        ]
        if not links:
            return "(SELECT count(*) FROM region)"
        (child, ccols, _, pcols), outer = self.pick(links)
        inner = self.source(child)
        on = " AND ".join(
            f"{inner.alias}.{i} = {outer.alias}.{o}" for i, o in zip(ccols, pcols, strict=True)
        )
        aggregate = self._aggregate([inner], self.pick(("int", "numeric", "date")))
        return f"(SELECT {aggregate} FROM {child} {inner.alias} WHERE {on})"

    # -- aggregates and windows ----------------------------------------------------------------

    def _aggregate(self, scope: list[Source], family: Family) -> str:
        found = self._plain_aggregate(scope, family)
        if self.chance(0.15):  # only the rows a condition keeps (FILTER (WHERE ...))
            return f"{found} FILTER (WHERE {self._bool(scope, 1)})"
        return found

    def _plain_aggregate(self, scope: list[Source], family: Family) -> str:
        if family == "int":
            return self.pick(
                (
                    "count(*)",
                    f"count({self.expr('text', scope, 1)})",
                    f"count(DISTINCT {self._int(scope, 1)})",
                    f"sum({self._int(scope, 1)})",
                    f"max({self._int(scope, 1)})",
                    f"min({self._int(scope, 1)})",
                )
            )
        if family == "numeric":
            value = self._numeric(scope, 1)
            return self.pick(
                (
                    f"sum({value})",
                    f"avg({value})",
                    f"min({value})",
                    f"max({value})",
                    f"avg({self._int(scope, 1)})",
                    f"sum(CASE WHEN {self._bool(scope, 1)} THEN {value} ELSE 0 END)",
                    f"sum({self._int(scope, 1)}::bigint)",
                )
            )
        if family == "float":
            value = self._float(scope, 1)
            return self.pick(
                (
                    f"sum({value})",
                    f"avg({value})",
                    f"max({value})",
                    f"stddev({self._numeric(scope, 1)})",
                    f"variance({self._numeric(scope, 1)})",
                )
            )
        if family == "text":
            value = self._text(scope, 1)
            return self.pick(
                (f"min({value})", f"max({value})", f"string_agg({value}, ',' ORDER BY {value})")
            )
        if family == "bool":
            value = self._bool(scope, 1)
            return self.pick((f"bool_and({value})", f"bool_or({value})", f"every({value})"))
        if family == "date":
            return f"{self.pick(('min', 'max'))}({self._date(scope, 1)})"
        return f"max({self.expr(family, scope, 1)})"

    def _window(self, scope: list[Source]) -> str:
        """A window function whose rows are in a total order: by the key of every table in
        scope (an outer join's NULL rows tie on one key, not on all together)."""
        keyed = [s for s in scope if s.table]
        if not keyed:
            return "row_number() OVER ()"
        key = ", ".join(f"{s.alias}.{k}" for s in keyed for k in KEYS[s.table or ""])
        partition = self.column(scope, self.pick(("int", "text")))
        over = (
            f"PARTITION BY {partition} ORDER BY {key}"
            if partition and self.chance(0.7)
            else f"ORDER BY {key}"
        )
        return self.pick(
            (
                f"row_number() OVER ({over})",
                f"rank() OVER ({over})",
                f"dense_rank() OVER ({over})",
                f"sum({self._numeric(scope, 1)}) OVER ({over})",
                f"lag({self._int(scope, 1)}) OVER ({over})",
                f"lead({self._text(scope, 1)}, 1, 'none') OVER ({over})",
                f"count(*) OVER (PARTITION BY {partition or '1'})",
                f"avg({self._numeric(scope, 1)}) OVER (PARTITION BY {partition or '1'})",
            )
        )

    # -- FROM ----------------------------------------------------------------------------------

    def from_clause(self, joins: int) -> tuple[str, list[Source], list[str]]:
        """A FROM clause joining up to ``joins`` more tables along keys; its sources; the
        conjuncts that keep big tables small."""
        weights = {
            "region": 3,
            "nation": 5,
            "supplier": 4,
            "customer": 4,
            "part": 4,
            "partsupp": 3,
            "orders": 4,
            "lineitem": 3,
        }
        first = self.r.choices(list(weights), list(weights.values()))[0]
        root = self.source(first)
        scope = [root]
        text = f"{first} {root.alias}"
        for _ in range(joins):
            links = [
                (fk, s)
                for s in scope
                if s.table
                for fk in FOREIGN_KEYS
                if s.table in (fk[0], fk[2])
            ]
            if not links:
                break
            (child, ccols, parent, pcols), there = self.pick(links)
            new_table, new_cols, old_cols = (
                (parent, pcols, ccols) if there.table == child else (child, ccols, pcols)
            )
            kind = self.r.choices(["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"], [6, 3, 1, 1])[0]
            new = self.source(new_table, nullable=kind in ("LEFT JOIN", "FULL JOIN"))
            if kind in ("RIGHT JOIN", "FULL JOIN"):
                scope = [dataclasses.replace(s, nullable=True) for s in scope]
            on = " AND ".join(
                f"{new.alias}.{n} = {there.alias}.{o}"
                for n, o in zip(new_cols, old_cols, strict=True)
            )
            if kind != "JOIN" and self.chance(0.5):
                on += f" AND {self._bool([new], 1)}"  # an outer join's ON filters one side
            text += f" {kind} {new_table} {new.alias} ON {on}"
            scope.append(new)
        self.last_scope = scope
        narrow = []
        for source in scope:
            bound = NARROW.get(source.table or "")
            if bound is not None:
                narrow.append(f"{source.alias}.{bound[0]} < {bound[1]}")
        return text, scope, narrow

    # -- query shapes --------------------------------------------------------------------------

    def query(self) -> Query:
        shape = self.r.choices(
            [
                "plain",
                "join",
                "aggregate",
                "distinct",
                "subquery",
                "derived",
                "cte",
                "set operation",
                "window",
                "limit",
                "raise",
                "lateral",
                "series",
                "recursive",
                "values",
            ],
            [14, 14, 16, 5, 10, 7, 5, 7, 8, 10, 4, 5, 4, 3, 4],
        )[0]
        made = getattr(self, "shape_" + shape.replace(" ", "_"))()
        made.kind = shape
        return t.cast(Query, made)

    def _items(self, scope: list[Source], count: int) -> list[str]:
        families = [
            "int",
            "numeric",
            "text",
            "date",
            "int",
            "numeric",
            "text",
            "float",
            "timestamp",
            "interval",
            "bool",
        ]
        items = []
        for _ in range(count):
            family = self.pick(families)
            items.append(self.expr(family, scope, self.r.randint(0, 2)))
            self.families[items[-1]] = family
        return items

    def _tie_breakers(self, items: list[str]) -> list[str]:
        """ORDER BY terms that make a LIMIT's rows one set: values PostgreSQL orders as equal
        may print differently (1.5 and 1.50, an interval of 1 year and one of 12 months 5
        days), and their texts tell them apart."""
        return [
            f"({item})::text" for item in items if self.families.get(item, "numeric") == "numeric"
        ]

    def _exactly_ordered(self, items: list[str]) -> bool:
        """Whether ORDER BY over ``items`` (and their texts for numerics) orders rows one way:
        intervals and doubles have equal values printed differently (an interval of 1 year and
        one of 11 months 35 days; 0 and -0), whose texts the cache would not print."""
        return all(
            self.families.get(item, "numeric") not in ("interval", "float") for item in items
        )

    def _where(self, scope: list[Source], narrow: list[str]) -> list[str]:
        where = list(narrow)
        for _ in range(self.r.randint(0, 2)):
            where.append(self._bool(scope, 2))
        return where

    def shape_plain(self, joins: int = 0) -> Select:
        text, scope, narrow = self.from_clause(joins)
        return Select(self._items(scope, self.r.randint(1, 4)), text, self._where(scope, narrow))

    def shape_join(self) -> Select:
        return self.shape_plain(self.r.randint(1, 3))

    def _aggregate_select(self, scope: list[Source], text: str, narrow: list[str]) -> Select:
        keys = [
            self.expr(self.pick(("int", "text", "date")), scope, self.r.randint(0, 1))
            for _ in range(self.r.randint(0, 2))
        ]
        aggregates = []
        for _ in range(self.r.randint(1, 3)):
            family = self.pick(("int", "numeric", "numeric", "text", "date", "float", "bool"))
            aggregates.append(self._aggregate(scope, family))
            self.families[aggregates[-1]] = family
        having = []
        if keys and self.chance(0.3):
            having.append(f"count(*) > {self.pick(('1', '2', '0'))}")
        where = narrow if self.chance(0.5) else []
        where += [self._bool(scope, 1)] if self.chance(0.5) else []
        group = list(keys)
        if keys and self.chance(0.2):  # grouping sets: ROLLUP, CUBE, GROUPING SETS
            listed = ", ".join(keys)
            group = [
                self.pick(
                    (
                        f"ROLLUP ({listed})",
                        f"CUBE ({listed})",
                        f"GROUPING SETS (({listed}), ({keys[0]}), ())",
                    )
                )
            ]
            columns = [k for k in keys if re.fullmatch(r"\w+\.\w+", k)]
            if columns:
                aggregates.append(f"grouping({', '.join(columns)})")
                self.families[aggregates[-1]] = "int"
        select = Select(keys + aggregates, text, where, group=group, having=having)
        if self.chance(0.4) and self._exactly_ordered(select.items):
            select.order = [str(i) for i in range(1, len(select.items) + 1)]
            if self.chance(0.5):
                select.order += self._tie_breakers(select.items)
                select.limit = self.r.randint(1, 10)
        return select

    def shape_aggregate(self, arrays: bool = True) -> Select:
        """A grouped SELECT; with ``arrays``, sometimes with an array_agg output (an array is
        answered locally only as an output column of the statement)."""
        text, scope, narrow = self.from_clause(self.r.randint(0, 2))
        select = self._aggregate_select(scope, text, narrow)
        if arrays and not select.order and self.chance(0.25):
            array = self._array_agg(scope)
            if array is not None:
                select.items.append(array)
        return select

    def _array_agg(self, scope: list[Source]) -> str | None:
        """array_agg of a value in the order of the value, then of every table's key (None
        when a source in scope has none)."""
        if not all(s.table for s in scope):
            return None
        value = self.expr(self.pick(("int", "numeric", "text", "date")), scope, 1)
        keys = ", ".join(f"{s.alias}.{k}" for s in scope for k in KEYS[s.table or ""])
        return f"array_agg({value} ORDER BY {value}, {keys})"

    def shape_distinct(self) -> Select:
        select = self.shape_plain(self.r.randint(0, 1))
        select.distinct = True
        select.items = select.items[:2]
        return select

    def shape_subquery(self) -> Select:
        text, scope, narrow = self.from_clause(self.r.randint(0, 1))
        items = self._items(scope, self.r.randint(1, 2))
        if self.chance(0.5):
            items.append(self._scalar_subquery(scope))
        where = [*narrow, self.pick((self._exists, self._in_subquery))(scope)]
        return Select(items, text, where)

    def shape_derived(self) -> Select:
        inner = (
            self.shape_plain(self.r.randint(0, 1))
            if self.chance(0.5)
            else self.shape_aggregate(arrays=False)
        )
        columns = [f"c{i}" for i in range(len(inner.items))]
        inner.items = [f"{item} AS {name}" for item, name in zip(inner.items, columns, strict=True)]
        alias = self.alias("derived")
        derived = Source(alias, tuple(Column(c, "int", "") for c in columns))
        outer = [f"{alias}.{c}" for c in columns]
        where = [f"{alias}.c0 IS NOT NULL"] if self.chance(0.4) else []
        return Select(outer, f"({inner.sql()}) AS {derived.alias}", where)

    def shape_cte(self) -> Select:
        inner = self.shape_aggregate(arrays=False) if self.chance(0.5) else self.shape_plain()
        columns = [f"c{i}" for i in range(len(inner.items))]
        name = self.alias("cte")
        body = ", ".join(f"{item} AS {c}" for item, c in zip(inner.items, columns, strict=True))
        inner.items = [body]
        outer = [f"t.{c}" for c in columns]
        return Select(outer, f"{name} t", with_=f"{name} AS ({inner.sql()})")

    def shape_set_operation(self) -> Compound:
        family = self.pick(("int", "numeric", "text", "date"))
        sides = []
        for _ in range(2):
            text, scope, narrow = self.from_clause(0)
            sides.append(
                Select(
                    [self.expr(family, scope, self.r.randint(0, 2))],
                    text,
                    self._where(scope, narrow),
                )
            )
        op = self.pick(("UNION", "UNION ALL", "INTERSECT", "EXCEPT", "EXCEPT ALL"))
        compound = Compound(sides[0], op, sides[1])
        if self.chance(0.4):
            compound.order = ["1"]
            # values equal to PostgreSQL but printed differently (1.5, 1.50) tie: no LIMIT
            exact = family in ("int", "date")
            compound.limit = self.r.randint(1, 20) if exact and self.chance(0.5) else None
        return compound

    def shape_window(self) -> Select:
        text, scope, narrow = self.from_clause(self.r.randint(0, 1))
        items = self._items(scope, self.r.randint(0, 2))
        items.append(self._window(scope))
        return Select(items, text, narrow)

    def shape_limit(self) -> Select:
        select = self.shape_plain(self.r.randint(0, 2))
        if not self._exactly_ordered(select.items):
            return select  # their order among equals is PostgreSQL's choice: not compared
        select.order = [str(i) for i in range(1, len(select.items) + 1)]
        select.order += self._tie_breakers(select.items)
        select.limit = self.r.randint(0, 15)
        if self.chance(0.3):
            select.offset = self.r.randint(1, 10)
        return select

    def shape_raise(self) -> Select:
        """An expression that raises on every row of a one-row query (PostgreSQL's error,
        with its SQLSTATE, must reach the application)."""
        table = self.pick(("nation", "region", "supplier"))
        source = self.source(table)
        key = KEYS[table][0]
        number = f"{source.alias}.{key}"
        name = self.column([source], "text") or "'x'"
        failing = self.pick(
            (
                f"1 / ({number} - {number})",
                f"{number} % 0",
                f"1.5 / ({number} - {number})",
                f"substring({name} from 1 for -1)",
                "chr(0)",
                "'abc'::int",
                f"sqrt(-1 - {number})",
                f"ln(0 * {number})",
                f"2147483647 + {number} + 1",
                f"({number} + 1000)::numeric(3,2)",
                f"make_date(1995, 13, {number} + 1)",
                "'1995-02-30'::date",
                f"repeat({name}, -1) || chr({number} - {number})",
                f"power(10::numeric, 400 + {number}) * 0 + 1 / ({number} - {number})",
            )
        )
        return Select([failing], f"{table} {source.alias}", [f"{number} = 1"])

    def shape_lateral(self) -> Select:
        """A LATERAL derived table per row of a parent: the child rows of its key (an
        aggregate of them, or the first few by the child's key)."""
        child, ccols, parent, pcols = self.pick(
            [fk for fk in FOREIGN_KEYS if "lineitem" not in (fk[0], fk[2])]
        )
        outer = self.source(parent)
        inner = self.source(child)
        on = " AND ".join(
            f"{inner.alias}.{c} = {outer.alias}.{p}" for c, p in zip(ccols, pcols, strict=True)
        )
        where = [on] + ([self._bool([inner], 1)] if self.chance(0.3) else [])
        if self.chance(0.5):
            family = self.pick(("int", "numeric", "text", "date"))
            aggregate = self._aggregate([inner], family)
            body = Select(["count(*) AS c0", f"{aggregate} AS c1"], f"{child} {inner.alias}", where)
            columns: tuple[Column, ...] = (Column("c0", "int", ""), Column("c1", family, ""))
        else:
            items = self._items([inner], self.r.randint(1, 2))
            keys = ", ".join(f"{inner.alias}.{k}" for k in KEYS[child])
            body = Select(
                [f"{item} AS c{i}" for i, item in enumerate(items)],
                f"{child} {inner.alias}",
                where,
                order=[keys],
                limit=self.r.randint(1, 3),
            )
            columns = tuple(
                Column(f"c{i}", self.families.get(item, "int"), "") for i, item in enumerate(items)
            )
        lateral = Source(self.alias("lateral"), columns, nullable=True)
        join = self.pick((", LATERAL", " CROSS JOIN LATERAL", " LEFT JOIN LATERAL"))
        on_true = " ON true" if "LEFT" in join else ""
        text = f"{parent} {outer.alias}{join} ({body.sql()}) AS {lateral.alias}{on_true}"
        scope = [outer, lateral]
        items = [f"{outer.alias}.{KEYS[parent][0]}"] + [
            f"{lateral.alias}.{c.name}" for c in columns
        ]
        items += self._items(scope, self.r.randint(0, 1))
        bound = NARROW.get(parent)
        narrow = [f"{outer.alias}.{bound[0]} < {bound[1]}"] if bound else []
        return Select(items, text, narrow)

    def shape_series(self) -> Select:
        """generate_series in FROM: a number series joined to a table's integer column (the
        counts of each number), or one series per row of a table (LATERAL, as PostgreSQL
        joins a function reading an earlier FROM item)."""
        table, column = self.pick(SERIES_JOINS)
        other = self.source(table)
        low = self.r.randint(-2, 3)
        high = low + self.r.randint(0, 12)
        step = self.pick(("", "", ", 2", ", 3"))
        series = Source(self.alias("series"), (Column("y", "int", ""),), nullable=True)
        bound = NARROW.get(table)
        narrow = f" AND {other.alias}.{bound[0]} < {bound[1]}" if bound else ""
        if self.chance(0.6):
            family = self.pick(("int", "numeric", "text"))
            aggregate = self._aggregate([other], family)
            self.families[aggregate] = family
            return Select(
                [f"{series.alias}.y", f"count({other.alias}.{column})", aggregate],
                f"generate_series({low}, {high}{step}) AS {series.alias}(y) LEFT JOIN {table} "
                f"{other.alias} ON {other.alias}.{column} = {series.alias}.y{narrow}",
                group=[f"{series.alias}.y"],
            )
        items = [f"{other.alias}.{KEYS[table][0]}", f"{series.alias}.y"]
        items += self._items([other, series], self.r.randint(0, 1))
        where = [f"{other.alias}.{bound[0]} < {bound[1]}"] if bound else []
        return Select(
            items,
            f"{table} {other.alias}, generate_series({low}, {other.alias}.{column} % 5"
            f"{step}) AS {series.alias}(y)",
            where,
        )

    def shape_recursive(self) -> Select:
        """WITH RECURSIVE: a counter joined to a table, or a walk down the nations of the
        regions reached, with its depth and path."""
        name = self.alias("walk")
        if self.chance(0.5):
            table, column = self.pick(SERIES_JOINS)
            other = self.source(table)
            start, stop = self.r.randint(-1, 2), self.r.randint(3, 9)
            union = self.pick(("UNION ALL", "UNION"))
            grow = self.pick(("'y'", "'é'", "''"))
            with_ = (
                f"RECURSIVE {name}(n, s) AS (SELECT {start}, 'x' {union} SELECT n + 1, s || "
                f"{grow} FROM {name} WHERE n < {stop})"
            )
            family = self.pick(("int", "numeric", "text"))
            aggregate = self._aggregate([other], family)
            self.families[aggregate] = family
            bound = NARROW.get(table)
            narrow = f" AND {other.alias}.{bound[0]} < {bound[1]}" if bound else ""
            return Select(
                [f"{name}.n", f"max({name}.s)", f"count({other.alias}.{column})", aggregate],
                f"{name} LEFT JOIN {table} {other.alias} ON {other.alias}.{column} = "
                f"{name}.n{narrow}",
                group=[f"{name}.n"],
                with_=with_,
            )
        union = self.pick(("UNION ALL", "UNION"))
        first = self.r.randint(0, 24)
        with_ = (
            f"RECURSIVE {name}(k, depth, path) AS (SELECT n_nationkey, 0, n_name::text FROM "
            f"nation WHERE n_nationkey <= {first} {union} SELECT n.n_nationkey, w.depth + 1, "
            f"w.path || '>' || n.n_name FROM {name} w JOIN nation n ON n.n_regionkey = "
            f"w.k WHERE w.depth < {self.r.randint(1, 3)})"
        )
        items = self.pick(
            (
                ["k", "depth", "count(*)", "max(length(path))"],
                ["depth", "count(DISTINCT k)", "min(path)"],
            )
        )
        group = [i for i in items if "(" not in i]
        return Select(items, name, group=group, with_=with_)

    def shape_values(self) -> Select:
        """A VALUES list of untyped literals (integers, numerics, strings, NULLs) joined to a
        table, typed as PostgreSQL types them."""
        rows = self.r.randint(1, 5)
        numbers = self.pick((INTEGERS, ("1", "2.5", "-0.5", "10", "3.25")))
        keys = [self.pick((*numbers, "NULL")) for _ in range(rows)]
        keys[0] = self.pick(numbers)  # (a column of NULLs alone is text)
        texts = [self.pick((*TEXT_LITERALS[:8], "NULL")) for _ in range(rows)]
        values = ", ".join(f"({k}, {s})" for k, s in zip(keys, texts, strict=True))
        family: Family = "int" if numbers is INTEGERS else "numeric"
        listed = Source(
            self.alias("values"), (Column("k", family, ""), Column("s", "text", "")), nullable=True
        )
        table, column = self.pick(SERIES_JOINS)
        other = self.source(table, nullable=True)
        bound = NARROW.get(table)
        narrow = f" AND {other.alias}.{bound[0]} < {bound[1]}" if bound else ""
        join = self.pick(("JOIN", "LEFT JOIN"))
        text = (
            f"(VALUES {values}) AS {listed.alias}(k, s) {join} {table} {other.alias} ON "
            f"{other.alias}.{column} = {listed.alias}.k{narrow}"
        )
        scope = [listed, other]
        if self.chance(0.4):
            select = self._aggregate_select(scope, text, [])
            return select
        items = [
            f"{listed.alias}.k",
            f"{listed.alias}.s",
            *self._items(scope, self.r.randint(0, 2)),
        ]
        return Select(items, text, [self._bool(scope, 1)] if self.chance(0.4) else [])


def queries(seed: int, count: int) -> Iterator[Query]:
    generator = Generator(seed)
    for _ in range(count):
        yield generator.query()


def partition_cases(seed: int, count: int) -> Iterator[tuple[Select, str]]:
    """(base query, predicate) pairs for ternary-logic partitioning: plain and join shapes,
    without DISTINCT, LIMIT or aggregates, and a NULL-heavy predicate."""
    generator = Generator(seed)
    for _ in range(count):
        base = generator.shape_plain(generator.r.randint(0, 2))
        scope = generator.last_scope
        yield base, generator._bool(scope, 2)
