"""PostgreSQL's description of a query's result, worked out without the backend: what its
RowDescription gives each column (name, type OID, type modifier, size, and the table column
a plain column reference reads), for a local answer given while the backend cannot describe
the statement (it is down).

- **Names** are PostgreSQL's own rule (``FigureColname``, src/backend/parser/parse_target.c)
  applied to PostgreSQL's own parse tree of the text the backend would receive (pglast:
  libpg_query, PostgreSQL's parser). sqlglot's tree cannot serve: it reads ``char_length``
  and ``length`` as one function, ``now()`` as ``CURRENT_TIMESTAMP``, and PostgreSQL names
  a column after the function as written.
- **Types** are the inference's (`optimizer.postgres.expression_types`), the one every local
  answer is made exact by.
- **Type modifiers and source columns** follow what carries them in PostgreSQL (exprTypmod,
  markTargetListOrigin): a column reference (through derived tables and CTEs), a cast that
  names one, CASE / COALESCE / NULLIF / GREATEST / LEAST whose arms agree, a scalar
  subquery's column; anything else has none.

Whatever is not known for sure refuses the description, with why: the caller then does not
answer locally rather than describe it otherwise. tests/optimizer/test_describe_result.py holds the
rule to the backend's own descriptions.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass

import psycopg
from pglast import ast, parse_sql
from pglast.parser import ParseError
from sqlglot import exp

from optimizer.analysis.normalize_constraint import QueryResolver
from optimizer.postgres.expression_types import ExpressionTypes
from optimizer.postgres.types import PgType
from sql_ext import Query
from sql_ext.blocks import Block, Source
from sql_ext.catalog import Catalog
from sql_ext.quoting import output_name

UNNAMED = "?column?"


@dataclass(frozen=True)
class ResultColumn:
    """One column of a RowDescription."""

    name: str
    type_oid: int
    type_modifier: int = -1
    size: int = -1  # pg_type.typlen
    table_oid: int = 0  # the table of a plain column reference (0: none)
    column_number: int = 0


class Unknown(Exception):
    """What PostgreSQL would say of a column is not known for sure."""


def describe_result(query: Query, catalog: Catalog, text: str) -> tuple[ResultColumn, ...] | str:
    """The description of a SELECT's result as PostgreSQL gives it, or why it is not known;
    ``text``: what the backend would receive (`Query.backend_sql`), its placeholders written
    as PostgreSQL's ``$n``."""
    try:
        return _Describer(query, catalog).describe(figure_names(text))
    except Unknown as why:
        return str(why)


# -- names: FigureColname over PostgreSQL's parse tree --------------------------------------


class Star(t.NamedTuple):
    """A ``*`` or ``t.*`` target: its columns are named by what it expands to."""

    qualifier: str | None


def figure_names(sql: str) -> list[str | Star]:
    """Each target's output name in a SELECT statement's text, as PostgreSQL names it (the
    leftmost SELECT's of a UNION)."""
    try:
        statements = parse_sql(sql)
    except ParseError as exc:
        raise Unknown(f"PostgreSQL's parser reads it otherwise: {exc}") from None
    if len(statements) != 1 or not isinstance(statements[0].stmt, ast.SelectStmt):
        raise Unknown("not one SELECT statement")
    return _target_names(statements[0].stmt)


def _target_names(select: t.Any) -> list[str | Star]:
    """The output names of a SELECT's parse tree (a set operation's: its leftmost SELECT's)."""
    while select.op is not None and _enum(select.op) != "SETOP_NONE" and select.larg is not None:
        select = select.larg
    if not select.targetList:
        raise Unknown("a SELECT without a target list (VALUES)")
    names: list[str | Star] = []
    for target in select.targetList:
        value: t.Any = target.val
        fields: t.Any = value.fields if isinstance(value, ast.ColumnRef) else ()
        if fields and isinstance(fields[-1], ast.A_Star):
            names.append(Star(str(fields[-2].sval) if len(fields) > 1 else None))
        elif target.name is not None:
            names.append(str(target.name))
        else:
            names.append(figure_name(value))
    return names


def figure_name(node: t.Any) -> str:
    """PostgreSQL's FigureColname of an expression's raw parse tree."""
    name, strength = _figure(node)
    return name if strength else UNNAMED


_SQL_VALUE_NAMES = {
    "SVFOP_CURRENT_DATE": "current_date",
    "SVFOP_CURRENT_TIME": "current_time",
    "SVFOP_CURRENT_TIME_N": "current_time",
    "SVFOP_CURRENT_TIMESTAMP": "current_timestamp",
    "SVFOP_CURRENT_TIMESTAMP_N": "current_timestamp",
    "SVFOP_LOCALTIME": "localtime",
    "SVFOP_LOCALTIME_N": "localtime",
    "SVFOP_LOCALTIMESTAMP": "localtimestamp",
    "SVFOP_LOCALTIMESTAMP_N": "localtimestamp",
    "SVFOP_CURRENT_ROLE": "current_role",
    "SVFOP_CURRENT_USER": "current_user",
    "SVFOP_USER": "user",
    "SVFOP_SESSION_USER": "session_user",
    "SVFOP_CURRENT_CATALOG": "current_catalog",
    "SVFOP_CURRENT_SCHEMA": "current_schema",
}


def _figure(node: t.Any) -> tuple[str, int]:
    """FigureColnameInternal: a name and its strength (0: none, 1: a type's name, 2: sure)."""
    if isinstance(node, ast.ColumnRef | ast.A_Indirection):
        parts: t.Any = node.fields if isinstance(node, ast.ColumnRef) else node.indirection
        last = parts[-1]
        if isinstance(last, ast.String):
            return str(last.sval), 2
        return _figure(node.arg) if isinstance(node, ast.A_Indirection) else (UNNAMED, 0)
    if isinstance(node, ast.FuncCall):
        names: t.Any = node.funcname
        return str(names[-1].sval), 2
    if isinstance(node, ast.A_Expr):
        return ("nullif", 2) if _enum(node.kind) == "AEXPR_NULLIF" else (UNNAMED, 0)
    if isinstance(node, ast.TypeCast):
        name, strength = _figure(node.arg)
        type_name: t.Any = node.typeName
        if strength <= 1 and type_name is not None:
            return str(type_name.names[-1].sval), 1
        return name, strength
    if isinstance(node, ast.CollateClause):
        return _figure(node.arg)
    if isinstance(node, ast.GroupingFunc):
        return "grouping", 2
    if isinstance(node, ast.SubLink):
        kind = _enum(node.subLinkType)
        if kind == "EXISTS_SUBLINK":
            return "exists", 2
        if kind == "ARRAY_SUBLINK":
            return "array", 2
        if kind == "EXPR_SUBLINK":  # (its subquery's one column's name: transformed first)
            first = _target_names(node.subselect)[0]
            if isinstance(first, Star):
                raise Unknown("a scalar subquery of *")
            return first, 2
        return UNNAMED, 0
    if isinstance(node, ast.CaseExpr):
        name, strength = _figure(node.defresult) if node.defresult is not None else ("", 0)
        return (name, strength) if strength > 1 else ("case", 1)
    if isinstance(node, ast.A_ArrayExpr):
        return "array", 2
    if isinstance(node, ast.RowExpr):
        return "row", 2
    if isinstance(node, ast.CoalesceExpr):
        return "coalesce", 2
    if isinstance(node, ast.MinMaxExpr):
        return ("greatest" if _enum(node.op) == "IS_GREATEST" else "least"), 2
    if isinstance(node, ast.SQLValueFunction):
        return _SQL_VALUE_NAMES.get(_enum(node.op), UNNAMED), 2
    return UNNAMED, 0


def _enum(value: t.Any) -> str:
    return str(getattr(value, "name", value))


# -- types, modifiers and sources --------------------------------------------------------


# what RowDescription gives a type: (OID, pg_type.typlen) by the inference's kind (and width)
_TYPES: dict[tuple[str, int | None], tuple[int, int]] = {
    ("bool", None): (16, 1),
    ("integer", 2): (21, 2),
    ("integer", 4): (23, 4),
    ("integer", 8): (20, 8),
    ("numeric", None): (1700, -1),
    ("float", 4): (700, 4),
    ("float", 8): (701, 8),
    ("char", None): (1042, -1),
    ("varchar", None): (1043, -1),
    ("text", None): (25, -1),
    ("string", None): (25, -1),  # an untyped literal: PostgreSQL outputs it as text
    ("null", None): (25, -1),  # SELECT NULL: text too
    ("date", None): (1082, 4),
    ("time", None): (1083, 8),
    ("timestamp", None): (1114, 8),
    ("timestamptz", None): (1184, 8),
    ("interval", None): (1186, 16),
    ("bytea", None): (17, -1),
    ("uuid", None): (2950, 16),
}
_SIZES = {oid: size for oid, size in _TYPES.values()} | {19: 64}  # (name: a catalog's type)
# types whose values carry a modifier that must be known (char(n), numeric(p,s), ...)
_MODIFIED = frozenset({1042, 1043, 1700, 1083, 1114, 1184, 1186})


def _oid_of(kind: PgType) -> tuple[int, int]:
    if kind.kind == "array" and kind.element is not None:  # its element type's array type
        info = psycopg.postgres.types.get(_oid_of(kind.element)[0])
        if info is None or not info.array_oid:
            raise Unknown(f"the array type of {kind.element.kind} values")
        return info.array_oid, -1
    width = kind.width if kind.kind in ("integer", "float") else None
    found = _TYPES.get((kind.kind, width))
    if found is None:
        raise Unknown(f"the type PostgreSQL gives a {kind.kind} value")
    return found


class _Describer:
    def __init__(self, query: Query, catalog: Catalog) -> None:
        self.query = query
        self.catalog = catalog
        resolver = QueryResolver(query, catalog)
        self.resolve = resolver.column_source
        self.types = ExpressionTypes(query, catalog, resolver.column_source)

    def describe(self, names: list[str | Star]) -> tuple[ResultColumn, ...]:
        tree = self.query.tree
        self._check_nullifs(tree)
        if not isinstance(tree, exp.Select):
            if not isinstance(tree, exp.Union):
                raise Unknown("not a SELECT")
            return self._set_operation(tree, names)
        projections = tree.expressions
        if len(projections) != len(names):
            raise Unknown("the parsers read its target list differently")
        block = self.types.block_of(projections[0]) if projections else None
        columns: list[ResultColumn] = []
        for projection, name in zip(projections, names, strict=True):
            if isinstance(name, Star):
                columns += self._star(block, name)
                continue
            node = projection.this if isinstance(projection, exp.Alias) else projection
            if node.find(exp.Placeholder, exp.Parameter) is not None:
                raise Unknown("a parameter in its output (its value's type decides)")
            kind = self.types.of(node, block)
            oid, size = _oid_of(kind)
            modifier, origin = self._modifier(node, block, oid)
            columns.append(ResultColumn(name, oid, modifier, size, *origin))
        return tuple(columns)

    def _check_nullifs(self, tree: exp.Expr) -> None:
        """NULLIF's type is the first argument of the = operator PostgreSQL resolves for its
        two, promoted to that operator's type in some cases (varchar to text; real against
        double precision is not): worked out only for two arguments of one type that has an
        = operator of its own, anywhere in the statement (its type flows into others)."""
        for nullif in tree.find_all(exp.Nullif):
            scope = self.types.block_of(nullif)
            a, b = (self.types.of(arg, scope) for arg in (nullif.this, nullif.expression))
            if (a.kind, a.width) != (b.kind, b.width) or a.kind in ("varchar", "string"):
                raise Unknown("NULLIF of these types (the = operator PostgreSQL resolves decides)")

    def _set_operation(self, tree: exp.Union, names: list[str | Star]) -> tuple[ResultColumn, ...]:
        """UNION / INTERSECT / EXCEPT: the leftmost branch's names, the branches' common
        types; a type whose modifier matters is not worked out (select_common_typmod)."""
        if any(isinstance(name, Star) for name in names):
            raise Unknown("a set operation of *")
        columns = []
        for index, name in enumerate(names):
            oid, size = _oid_of(self.types.output(tree, index))
            if oid in _MODIFIED:
                raise Unknown("the type modifier of a set operation's column")
            columns.append(ResultColumn(str(name), oid, -1, size))
        return tuple(columns)

    def _star(self, block: Block | None, star: Star) -> list[ResultColumn]:
        """The columns ``*`` or ``t.*`` expands to: each source's, in FROM order."""
        joins = block.select.args.get("joins") or () if block is not None else ()
        if block is None or any(j.args.get("using") or j.args.get("method") for j in joins):
            raise Unknown("* over a join that merges columns (USING, NATURAL)")
        sources = [s for s in block.sources if star.qualifier is None or s.name == star.qualifier]
        if not sources:
            raise Unknown(f"the relation {star.qualifier} of {star.qualifier}.*")
        columns = []
        for source in sources:
            table = self.catalog.table(source.table or "") if source.is_table else None
            if table is None:
                raise Unknown("* over a derived table, a CTE or a relation the cache lacks")
            for column in table.columns:
                columns.append(self._table_column(table, column.name))
        return columns

    def _table_column(self, table: t.Any, name: str) -> ResultColumn:
        column = next((c for c in table.columns if c.name == name), None)
        if column is None or not column.type_oid or not column.number or not table.oid:
            raise Unknown("the catalog on file does not give its columns' types and numbers")
        return ResultColumn(
            name,
            column.type_oid,
            column.type_modifier,
            _SIZES.get(column.type_oid, -1),
            table.oid,
            column.number,
        )

    def _modifier(
        self, node: exp.Expr, block: Block | None, oid: int
    ) -> tuple[int, tuple[int, int]]:
        """The type modifier of an output (exprTypmod) and the table column it reads as it
        is (markTargetListOrigin: a plain column reference only, through derived tables)."""
        while isinstance(node, exp.Paren | exp.Collate):  # (a COLLATE keeps both)
            node = node.this
        if isinstance(node, exp.Column):
            found = self._column(node, block)
            if found is not None:
                return found.type_modifier, (found.table_oid, found.column_number)
        if oid not in _MODIFIED:
            return -1, (0, 0)
        return self._typmod(node, block), (0, 0)

    def _column(self, column: exp.Column, block: Block | None) -> ResultColumn | None:
        """What a column reference reads: a table's column (through derived tables and CTEs
        whose column is itself a plain reference), or None for a computed one."""
        if block is None:
            raise Unknown("a column outside any block")
        found = self.resolve(block, column)
        if found is None:
            raise Unknown(f"which relation {column.sql()} reads")
        source, name = found
        if source.is_table and not source.body:
            table = self.catalog.table(source.table or "")
            if table is None:
                raise Unknown(f"the columns of {source.table}")
            return self._table_column(table, name)
        projection = self._derived_projection(source, name)
        inner = projection.this if isinstance(projection, exp.Alias) else projection
        while isinstance(inner, exp.Paren):
            inner = inner.this
        if isinstance(inner, exp.Column):
            return self._column(inner, source.body[0])
        return None

    def _derived_projection(self, source: Source, name: str) -> exp.Expr:
        if len(source.body) != 1:
            raise Unknown("a column of a set operation in FROM")
        body = source.body[0]
        aliases = source.column_aliases
        for position, projection in enumerate(body.select.expressions):
            if isinstance(projection, exp.Star):
                raise Unknown("a derived table of *")
            label = aliases[position] if position < len(aliases) else output_name(projection)
            if label == name:
                return projection
        raise Unknown(f"the column {name} of {source.name}")

    def _typmod(self, node: exp.Expr, block: Block | None) -> int:
        """exprTypmod of a computed value whose type carries one."""
        if isinstance(node, exp.Cast):
            return _cast_modifier(node.to)
        if isinstance(node, exp.Column):
            found = self._column(node, block)
            if found is None:  # a derived table's computed column: its own expression's
                raise Unknown("the type modifier of a derived table's computed column")
            return found.type_modifier
        if isinstance(node, exp.Coalesce | exp.Greatest | exp.Least):
            arms = [node.this, *node.expressions]
            return self._agreeing(arms, block)
        if isinstance(node, exp.Case):
            default = node.args.get("default")
            if default is None:
                return -1
            return self._agreeing([*(i.args["true"] for i in node.args["ifs"]), default], block)
        if isinstance(node, exp.Nullif):
            return self._modifier(node.this, block, _oid_of(self.types.of(node.this, block))[0])[0]
        if isinstance(node, exp.Subquery) and isinstance(node.this, exp.Select):
            inner = node.this.expressions[0]
            inner = inner.this if isinstance(inner, exp.Alias) else inner
            inner_block = self.types.block_of(inner)
            return self._modifier(inner, inner_block, _oid_of(self.types.of(inner))[0])[0]
        if isinstance(node, exp.Interval):
            if node.args.get("unit") is not None:  # INTERVAL '1' DAY: a field restriction
                raise Unknown("the type modifier of an interval with fields")
            return -1
        if isinstance(
            node, exp.AggFunc | exp.Window | exp.Binary | exp.Unary | exp.Func | exp.Literal
        ):
            return -1  # (operators, functions and aggregates give none)
        raise Unknown(f"the type modifier of {type(node).__name__}")

    def _agreeing(self, arms: list[exp.Expr], block: Block | None) -> int:
        """CASE and COALESCE keep a modifier every arm of the same type has (else -1)."""
        kinds = {_oid_of(self.types.of(arm, block))[0] for arm in arms}
        if len(kinds) != 1:
            return -1
        (oid,) = kinds
        modifiers = {self._modifier(arm, block, oid)[0] for arm in arms}
        return modifiers.pop() if len(modifiers) == 1 else -1


def _cast_modifier(to: exp.DataType) -> int:
    """The type modifier a cast's target names (typmodin): numeric(p,s), varchar(n), ..."""
    params = [p.this for p in to.expressions if isinstance(p, exp.DataTypeParam)]
    values = [int(p.name) for p in params if isinstance(p, exp.Literal) and p.is_int]
    if len(values) != len(params):
        raise Unknown("a cast's type modifier")
    if not values:
        return -1
    kind = to.this
    if kind in (exp.DataType.Type.DECIMAL,):
        precision, scale = [*values, 0][:2]
        return ((precision << 16) | scale) + 4
    if kind in (exp.DataType.Type.VARCHAR, exp.DataType.Type.CHAR, exp.DataType.Type.NCHAR):
        return values[0] + 4
    if kind in (
        exp.DataType.Type.TIMESTAMP,
        exp.DataType.Type.TIMESTAMPTZ,
        exp.DataType.Type.TIME,
    ):
        return values[0]
    raise Unknown(f"the type modifier of a cast to {to.sql(dialect='postgres')}")


def typlen(type_oid: int) -> int:
    """pg_type.typlen of a type the description gives (-1: variable)."""
    return _SIZES.get(type_oid, -1)


__all__ = ["ResultColumn", "describe_result", "figure_name", "figure_names", "typlen"]
