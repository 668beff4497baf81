"""§3 the cache DDL in the grammar (`CacheDDLParser`): CREATE CONTROL TABLE, CREATE CACHED
VIEW with its PRESENCE, CONSISTENCY, COMPLETENESS, REFRESH and WITH [NO] DATA clauses, DROP
CACHED VIEW / CONTROL TABLE, and the checks of a cached view's SELECT (of one table, or derived:
`is_derived`).
"""

from __future__ import annotations

import typing as t

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from sql_ext.aggregates import NODES as AGGREGATE_NODES
from sql_ext.aggregates import aggregate_of, listed
from sql_ext.grammar.base import token_of
from sql_ext.grammar.currency import CurrencyParser
from sql_ext.nodes import (
    CachedViewDef,
    CompletenessClause,
    ConsistencyClause,
    ControlTableDef,
    DropCacheObject,
    PresenceClause,
)
from sql_ext.quoting import folded

RESERVED_CONTROL_COLUMNS = ("refreshed_at", "snapshot_id")


class CacheDDLParser(CurrencyParser):
    """`CurrencyParser` reading the cache DDL (§3)."""

    def _parse_create(self) -> exp.Create | exp.Command:
        if self._match_text_seq("CONTROL", "TABLE"):
            return self._parse_control_table()  # type: ignore[return-value]
        if self._match_text_seq("CACHED", "VIEW"):
            return self._parse_cached_view()  # type: ignore[return-value]
        return super()._parse_create()

    def _parse_drop(self, exists: bool = False, kind: str | None = None) -> exp.Drop | exp.Command:
        for words in (("CACHED", "VIEW"), ("CONTROL", "TABLE")):
            if self._match_text_seq(*words):
                if_exists = self._match_text_seq("IF", "EXISTS")
                token = self._curr
                name = self._parse_id_var(any_token=False)
                if not isinstance(name, exp.Identifier):
                    self._fail(f"expected the name of the {' '.join(words).lower()}", token)
                return self.expression(  # type: ignore[return-value]
                    DropCacheObject(this=name, kind=" ".join(words), exists=if_exists or None)
                )
        return super()._parse_drop(exists, kind)

    def _parse_control_table(self) -> ControlTableDef:
        token = self._curr
        name = self._parse_id_var(any_token=False)
        if not isinstance(name, exp.Identifier):
            self._fail("expected the control table's name", token)
        if not self._curr or self._curr.token_type != TokenType.L_PAREN:
            self._fail("expected ( and the control-key columns, e.g. (authorid INT)")
        schema = self._parse_schema(this=exp.to_table(name.name))
        columns = schema.expressions if isinstance(schema, exp.Schema) else []
        if not columns:
            self._fail("a control table needs at least one control-key column")
        seen: set[str] = set()
        for column in columns:
            if not isinstance(column, exp.ColumnDef) or column.args.get("kind") is None:
                self._fail(
                    f"expected `column type` in CREATE CONTROL TABLE {name.name}, got "
                    f"{column.sql(dialect='postgres')!r}",
                    token_of(column, self._prev),
                )
            cname = folded(column.this)
            if cname in RESERVED_CONTROL_COLUMNS:
                self._fail(
                    f"column {cname!r} is reserved: mtcache adds refreshed_at and snapshot_id "
                    "to every control table itself",
                    token_of(column.this, self._prev),
                )
            if cname in seen:
                self._fail(f"column {cname!r} appears twice", token_of(column.this, self._prev))
            seen.add(cname)
        return self.expression(ControlTableDef(this=name, expressions=columns), token=token)

    def _parse_cached_view(self) -> CachedViewDef:
        token = self._curr
        name = self._parse_id_var(any_token=False)
        if not isinstance(name, exp.Identifier):
            self._fail("expected the cached view's name", token)
        if not self._match(TokenType.ALIAS):
            self._fail(f"expected AS SELECT ... after CREATE CACHED VIEW {name.name}")
        select_token = self._curr
        if not select_token or select_token.token_type != TokenType.SELECT:
            self._fail("a cached view is defined by SELECT cols FROM table [WHERE pred]")
        self._in_cached_view = True
        try:
            select = self._parse_select()
        finally:
            self._in_cached_view = False
        self._check_view_select(select, select_token)

        args: dict[str, t.Any] = {"this": name, "expression": select, "presence": []}
        while self._curr and self._curr.token_type != TokenType.SEMICOLON:
            option = self._curr
            word = option.text.upper()
            if word == "PRESENCE" and self._next and self._next.text.upper() == "ON":
                self._advance(2)
                args["presence"].append(self._parse_presence())
            elif word == "CONSISTENCY":
                self._advance()
                consistency = self._parse_consistency()
                previous = args.get("consistency")
                if previous is not None:
                    kinds = {previous.text("kind"), consistency.text("kind")}
                    self._fail(
                        "CONSISTENCY ROOT cannot be combined with another CONSISTENCY clause: a "
                        "gray view takes its consistency from its parent (Rule 2)"
                        if "ROOT" in kinds
                        else "a cached view has at most one CONSISTENCY clause",
                        option,
                    )
                args["consistency"] = consistency
            elif word == "COMPLETENESS":
                if args.get("completeness") is not None:
                    self._fail("a cached view has at most one COMPLETENESS clause", option)
                self._advance()
                if not self._match(TokenType.ON):
                    self._fail("expected ON (cols) after COMPLETENESS")
                columns = self._parse_name_list("COMPLETENESS ON")
                control = self._parse_in_control()
                args["completeness"] = self.expression(
                    CompletenessClause(expressions=columns, this=control), token=option
                )
            elif word == "REFRESH":
                if args.get("refresh") is not None:
                    self._fail("a cached view has at most one REFRESH clause", option)
                self._advance()
                if self._match_text_seq("CONTINUOUSLY"):
                    args["refresh"] = exp.var("CONTINUOUSLY")
                elif self._match_text_seq("AUTO"):
                    args["refresh"] = exp.var("AUTO")
                    if self._match_text_seq("WITHIN"):
                        args["within"] = self._parse_duration("REFRESH AUTO WITHIN")
                elif not self._match_text_seq("EVERY"):
                    self._fail(
                        "expected EVERY, CONTINUOUSLY or AUTO after REFRESH "
                        "(REFRESH EVERY 5 MIN, REFRESH CONTINUOUSLY, REFRESH AUTO [WITHIN 30 SEC])"
                    )
                else:
                    args["refresh"] = self._parse_duration("REFRESH EVERY")
            elif option.token_type == TokenType.WITH:
                if args.get("data") is not None:
                    self._fail("a cached view has at most one WITH [NO] DATA clause", option)
                self._advance()
                empty = self._match_text_seq("NO")
                if not self._match_text_seq("DATA"):
                    self._fail(
                        "expected DATA or NO DATA after WITH (WITH NO DATA: created empty, "
                        "filled by its first refresh)"
                    )
                args["data"] = exp.false() if empty else exp.true()
            else:
                self._fail(
                    f"unknown cached view option {option.text!r}: expected PRESENCE ON, "
                    "CONSISTENCY, COMPLETENESS ON, REFRESH EVERY, REFRESH CONTINUOUSLY, REFRESH "
                    "AUTO or WITH [NO] DATA",
                    option,
                )

        root = args.get("consistency")
        if root is not None and root.text("kind") == "ROOT":
            if args.get("completeness") is not None:
                self._fail(
                    "CONSISTENCY ROOT makes the view gray: a gray view has no completeness "
                    "control of its own (Rule 2); drop COMPLETENESS or CONSISTENCY ROOT",
                    token_of(args["completeness"], token),
                )
            if not args["presence"]:
                self._fail(
                    "CONSISTENCY ROOT makes the view consistent with its presence parent, but "
                    "the view has no PRESENCE ON ... IN <cached view> clause",
                    token_of(root, token),
                )
        if not args["presence"]:
            args["presence"] = None
        return self.expression(CachedViewDef(**args), token=token)

    def _parse_in_control(self, required: bool = False, what: str = "") -> exp.Identifier | None:
        if not self._match(TokenType.IN):
            if required:
                self._fail(f"{what} needs IN <control table or cached view>")
            return None
        token = self._curr
        control = self._parse_id_var(any_token=False)
        if not isinstance(control, exp.Identifier):
            self._fail("expected a control table or cached view after IN", token)
        return control

    def _parse_presence(self) -> PresenceClause:
        start = self._prev
        columns = self._parse_name_list("PRESENCE ON")
        control = self._parse_in_control(required=True, what="PRESENCE ON (...)")
        control_columns = None
        if self._curr and self._curr.token_type == TokenType.L_PAREN:
            control_columns = self._parse_name_list(f"IN {control.name}" if control else "IN")
            if len(control_columns) != len(columns):
                self._fail(
                    f"PRESENCE ON lists {len(columns)} column(s) but IN "
                    f"{control.name if control else ''} (...) lists {len(control_columns)}: "
                    "they pair up one to one",
                    self._prev,
                )
        return self.expression(
            PresenceClause(expressions=columns, this=control, control_columns=control_columns),
            token=start,
        )

    def _parse_consistency(self) -> ConsistencyClause:
        start = self._prev
        if self._match_text_seq("ROOT"):
            return self.expression(ConsistencyClause(kind="ROOT"), token=start)
        if not self._match(TokenType.ON):
            self._fail("expected ON ALL, ON (cols) [IN control] or ROOT after CONSISTENCY")
        if self._match(TokenType.ALL):
            return self.expression(ConsistencyClause(kind="ALL"), token=start)
        columns = self._parse_name_list("CONSISTENCY ON")
        control = self._parse_in_control()
        return self.expression(
            ConsistencyClause(kind="ON", expressions=columns, this=control), token=start
        )

    def _check_view_select(self, select: exp.Expr | None, token: Token) -> None:
        """§3.2: a cached view is a selection and projection of one backend table; a derived
        one (`is_derived`) joins tables along keys, groups and aggregates
        (`_check_derived_select`)."""
        if not isinstance(select, exp.Select):
            self._fail(
                "a cached view is defined by one SELECT cols FROM table [WHERE pred] block",
                token,
            )
            return
        source = select.args.get("from_")
        if source is None or not isinstance(source.this, exp.Table):
            self._fail("a cached view selects FROM one backend table", token)
        if select.args.get("currency") is not None:
            self._fail(
                "a cached view's SELECT takes no CURRENCY clause: bounds belong to queries",
                token_of(select.args["currency"], token),
            )
        if is_derived(select):
            self._check_derived_select(select, token)
            return
        alias = source.this.args.get("alias")
        if alias is not None:
            self._fail(
                f"unexpected {alias.name!r} after the view's table: expected WHERE, PRESENCE "
                "ON, CONSISTENCY, COMPLETENESS ON or REFRESH EVERY (the table takes no alias)",
                token_of(alias, token),
            )
        for arg in ("joins", "group", "having", "order", "limit", "offset", "distinct", "with_"):
            if select.args.get(arg):
                self._fail(
                    f"a cached view is a selection and projection of one table: "
                    f"{arg.rstrip('_').upper()} is not allowed in its SELECT",
                    token,
                )
        for projection in select.expressions:
            target = projection.this if isinstance(projection, exp.Alias) else projection
            if not isinstance(target, exp.Column | exp.Star) or (
                isinstance(projection, exp.Alias) and projection.alias != target.name
            ):
                self._fail(
                    "a cached view projects plain columns of its table (no expressions or "
                    f"renames): {projection.sql(dialect='postgres')!r}",
                    token_of(projection, token),
                )
        where = select.args.get("where")
        if where is not None and where.find(exp.Select) is not None:
            self._fail("a cached view's WHERE takes no subqueries", token)

    def _check_derived_select(self, select: exp.Select, token: Token) -> None:
        """A derived cached view: FROM a table [JOIN a table ON col = col [AND ...]]...
        [WHERE pred] [GROUP BY cols], projecting columns (the grouping ones, when it groups)
        and aggregates named by AS (count(*), count, sum, avg, min, max of an expression of
        the rows). Names and keys are checked against the catalog with the schema
        (`control_tables.derived`)."""
        for arg in (
            "having",
            "order",
            "limit",
            "offset",
            "distinct",
            "with_",
            "qualify",
            "windows",
        ):
            if select.args.get(arg):
                self._fail(
                    f"a derived cached view takes no {arg.rstrip('_').upper()}: it keeps "
                    "joined rows or groups, which queries then order and limit",
                    token,
                )
        for join in select.args.get("joins") or []:
            if (
                join.args.get("side")
                or join.args.get("kind") not in (None, "INNER")
                or join.args.get("method")
                or join.args.get("using")
                or not isinstance(join.this, exp.Table)
            ):
                self._fail(
                    "a derived cached view joins tables by inner JOIN ... ON col = col "
                    f"only: {join.sql(dialect='postgres')!r}",
                    token_of(join, token),
                )
            on = join.args.get("on")
            pairs = list(on.flatten()) if isinstance(on, exp.And) else [on]
            if on is None or not all(
                isinstance(p, exp.EQ)
                and isinstance(p.this, exp.Column)
                and isinstance(p.expression, exp.Column)
                for p in pairs
            ):
                self._fail(
                    "a derived cached view's JOIN ... ON is equalities of columns joined "
                    f"by AND: {join.sql(dialect='postgres')!r}",
                    token_of(join, token),
                )
        group = select.args.get("group")
        if group is not None:
            extra = [k for k in group.args if k != "expressions" and group.args.get(k)]
            if extra or not all(isinstance(c, exp.Column) for c in group.expressions):
                self._fail(
                    "a derived cached view groups by plain columns only: "
                    f"{group.sql(dialect='postgres')!r}",
                    token_of(group, token),
                )
        for node in (select.args.get("where"), *select.expressions):
            if node is not None and node.find(exp.Select, exp.Window) is not None:
                self._fail(
                    "a derived cached view takes no subqueries or window functions: "
                    f"{node.sql(dialect='postgres')!r}",
                    token_of(node, token),
                )
        for projection in select.expressions:
            target = projection.this if isinstance(projection, exp.Alias) else projection
            if isinstance(target, exp.Star):
                self._fail(
                    "a derived cached view lists its columns (SELECT * is for views of one table)",
                    token_of(projection, token),
                )
            if isinstance(target, exp.Column):
                continue
            if not isinstance(target, AGGREGATE_NODES):
                self._fail(
                    f"a derived cached view projects columns and the aggregates {listed()}: "
                    f"{projection.sql(dialect='postgres')!r}",
                    token_of(projection, token),
                )
            if not isinstance(projection, exp.Alias):
                self._fail(
                    "name each aggregate of a derived cached view with AS: "
                    f"{projection.sql(dialect='postgres')!r}",
                    token_of(projection, token),
                )
            value = target.this
            kept = aggregate_of(target)
            if isinstance(value, exp.Star) and kept is not None and not kept.star:
                self._fail(
                    f"only count takes *: {kept.name}(*) has no rows' values to aggregate; "
                    f"give it a column or an expression of the rows: "
                    f"{projection.sql(dialect='postgres')!r}",
                    token_of(projection, token),
                )
            if isinstance(value, exp.Distinct) or target.find(exp.Filter) is not None:
                self._fail(
                    "a derived cached view's aggregates take no DISTINCT or FILTER: "
                    f"{projection.sql(dialect='postgres')!r}",
                    token_of(projection, token),
                )
            if value is not None and value.find(*AGGREGATE_NODES) is not None:
                self._fail(
                    "an aggregate of a derived cached view takes an expression of the "
                    f"rows: {projection.sql(dialect='postgres')!r}",
                    token_of(projection, token),
                )


def is_derived(select: exp.Select) -> bool:
    """Whether a cached view's SELECT makes a derived view: it joins, groups or
    aggregates."""
    return bool(
        select.args.get("joins")
        or select.args.get("group")
        or any(p.find(*AGGREGATE_NODES) is not None for p in select.expressions)
    )
