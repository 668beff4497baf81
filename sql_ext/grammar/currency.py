"""§2 the currency clause in the grammar (`CurrencyParser`): ``CURRENCY BOUND d [ON (inputs)]
[BY cols], ...`` after a SELECT block's modifiers, its durations, and the lists of names the
clause and the cache DDL share.
"""

from __future__ import annotations

import math
import sys

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from sql_ext.grammar.base import SPAN, BaseParser, token_of
from sql_ext.nodes import UNIT_SECONDS, CurrencyClause, CurrencySpec, Duration
from sql_ext.quoting import folded

UNIT_HELP = (
    "use MS, SEC, MIN, HOUR or DAY (singular or plural), or PostgreSQL's units "
    "(500ms, 2s, 10min, 1h, 1d)"
)


class CurrencyParser(BaseParser):
    """`BaseParser` reading the currency clause of a SELECT block (§2)."""

    def _parse_query_modifiers(self, this):  # type: ignore[no-untyped-def]
        this = super()._parse_query_modifiers(this)
        if isinstance(this, exp.Select) and self._at_currency_clause():
            start = self._curr
            clause = self._parse_currency_clause()
            if this.args.get("currency") is not None:
                self._fail("a SELECT block has at most one CURRENCY clause", start)
            # where the clause stands in the text: the backend is sent the text as written,
            # with only the clauses cut out (`sql_ext.statements.Query.backend_sql`)
            clause.meta[SPAN] = (start.start, self._prev.end + 1)
            this.set("currency", clause)
            # ORDER BY / LIMIT may follow the clause as well as precede it.
            this = super()._parse_query_modifiers(this)
        return this

    def _parse_currency_clause(self) -> CurrencyClause:
        start = self._curr
        self._advance()  # CURRENCY
        if not self._match_text_seq("BOUND"):
            self._fail("expected BOUND after CURRENCY (CURRENCY BOUND 10 MIN ...)")
        specs = [self._parse_currency_spec()]
        while self._curr and self._curr.token_type == TokenType.COMMA:
            self._advance()
            specs.append(self._parse_currency_spec())

        seen: dict[str, Token] = {}
        for spec in specs:
            for ident in spec.args.get("on") or []:
                name = folded(ident)
                if name in seen:
                    self._fail(
                        f"input {name!r} is named twice in one currency clause: an input belongs "
                        "to one consistency class (merge the specs instead)",
                        token_of(ident, self._curr),
                    )
                seen[name] = token_of(ident, self._curr)
        return self.expression(CurrencyClause(expressions=specs), token=start)

    def _parse_duration(self, after: str) -> Duration:
        curr = self._curr
        if curr and curr.token_type == TokenType.DASH:
            self._fail("negative duration: a currency bound or interval must be 0 or more")
        if (
            curr
            and curr.token_type == TokenType.DOT
            and self._next
            and self._next.token_type == TokenType.NUMBER
            and curr.end + 1 == self._next.start
        ):
            # ".5 MIN": PostgreSQL's tokenizer reads a leading decimal point as a number.
            self._advance()
            number = Token(
                TokenType.NUMBER,
                "0." + self._curr.text,
                curr.line,
                curr.col,
                curr.start,
                self._curr.end,
            )
        elif not curr or curr.token_type != TokenType.NUMBER:
            self._fail(f"expected a duration after {after}, e.g. 10 MIN")
        else:
            number = curr
        self._advance()
        unit = self._curr
        if (
            not unit
            or unit.token_type in (TokenType.COMMA, TokenType.SEMICOLON)
            or (unit.text.upper() in ("ON", "BY") and unit.token_type != TokenType.STRING)
        ):
            self._fail(f"missing unit after {number.text}: {UNIT_HELP}", number)
        if unit.text.upper() not in UNIT_SECONDS or unit.token_type == TokenType.STRING:
            self._fail(f"unknown unit {unit.text!r}: {UNIT_HELP}", unit)
        self._advance()
        duration = Duration(this=exp.Literal.number(number.text), unit=exp.var(unit.text.upper()))
        if not math.isfinite(duration.seconds):  # 1e400 SEC would be read as infinity
            self._fail(
                f"the bound {number.text} {unit.text} is too large to hold: give at most "
                f"{sys.float_info.max:.3g} seconds",
                number,
            )
        return self.expression(duration, token=number)

    def _parse_currency_spec(self) -> CurrencySpec:
        duration = self._parse_duration("CURRENCY BOUND")
        on: list[exp.Identifier] | None = None
        by: list[exp.Column] | None = None
        if self._match(TokenType.ON):
            on = self._parse_name_list("ON")
        if self._match_text_seq("BY"):
            by = [self._parse_by_column()]
            # A comma followed by a number starts the next spec, otherwise another column.
            while (
                self._curr is not None
                and self._curr.token_type == TokenType.COMMA
                and self._next
                and self._next.token_type not in (TokenType.NUMBER, TokenType.DASH)
            ):
                self._advance()
                by.append(self._parse_by_column())
        return self.expression(CurrencySpec(this=duration, on=on, by=by), token=None)

    def _parse_name_list(self, after: str) -> list[exp.Identifier]:
        if not self._match(TokenType.L_PAREN):
            self._fail(f"expected ( after {after}")
        if self._curr and self._curr.token_type == TokenType.R_PAREN:
            self._fail(f"empty {after} (): name at least one input")
        names = []
        while True:
            token = self._curr
            ident = self._parse_id_var(any_token=False)
            if not isinstance(ident, exp.Identifier):
                self._fail(f"expected a name in {after} (...)", token)
            names.append(ident)
            if not self._match(TokenType.COMMA):
                break
        if not self._match(TokenType.R_PAREN):
            self._fail(f"expected , or ) in {after} (...)")
        return names

    def _parse_by_column(self) -> exp.Column:
        token = self._curr
        first = self._parse_id_var(any_token=False)
        if not isinstance(first, exp.Identifier):
            self._fail("expected a column after BY", token)
        if self._match(TokenType.DOT):
            second = self._parse_id_var(any_token=False)
            if not isinstance(second, exp.Identifier):
                self._fail("expected a column name after '.'")
            return self.expression(exp.Column(this=second, table=first))
        return self.expression(exp.Column(this=first))
