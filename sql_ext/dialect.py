"""The ``mtcache`` sqlglot dialect: PostgreSQL plus the currency clause, TIMEORDERED brackets and
the cache DDL.

Extensions hook into sqlglot by subclassing (STYLE 3): the parser recognises the clause keywords
by their text, because they are ordinary identifiers to PostgreSQL, and stops implicit aliases
from swallowing them (``FROM books CURRENCY BOUND ...`` must not alias books as "currency").
"""

from __future__ import annotations

import math
import sys
import typing as t

from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.dialects.postgres import Postgres
from sqlglot.errors import ParseError
from sqlglot.generator import Generator
from sqlglot.generators.duckdb import DuckDBGenerator
from sqlglot.generators.postgres import PostgresGenerator
from sqlglot.parsers.postgres import PostgresParser
from sqlglot.tokens import Token, TokenType

from sql_ext import long_lists
from sql_ext.errors import offset_position
from sql_ext.long_lists import ListToken, constant_list
from sql_ext.nodes import (
    UNIT_SECONDS,
    CachedViewDef,
    CacheSetting,
    CompletenessClause,
    ConsistencyClause,
    ConstantList,
    ControlTableDef,
    CurrencyClause,
    CurrencySpec,
    DropCacheObject,
    Duration,
    ExplainStatement,
    Inspect,
    PresenceClause,
    RefreshCached,
    SessionBound,
    Timeline,
)
from sql_ext.quoting import folded

# the prefix of the cache's own session settings (SET mtcache.provenance = on)
CACHE_SETTINGS = "mtcache."

# meta key of a node's (start, end) character offsets in the parsed text (end exclusive)
SPAN = "mt_span"
BODY_START = "mt_body_start"  # EXPLAIN's meta: the character offset of the explained statement

UNIT_HELP = "use MS, SEC, MIN, HOUR or DAY (singular or plural)"
RESERVED_CONTROL_COLUMNS = ("refreshed_at", "snapshot_id")

# A keyword opens an extension clause only when the next token fits; otherwise it stays an
# ordinary identifier (a column or alias may be called "presence").
_CLAUSE_STARTS: dict[str, tuple[str, ...]] = {
    "CURRENCY": ("BOUND",),
    "PRESENCE": ("ON",),
    "CONSISTENCY": ("ON", "ROOT"),
    "COMPLETENESS": ("ON",),
    "REFRESH": ("EVERY", "CONTINUOUSLY"),
}


class MTCacheParser(PostgresParser):
    _in_cached_view = False

    # date_part() stays a call: sqlglot would read it as EXTRACT, which PostgreSQL types numeric
    # where date_part gives double precision (the backend must receive what the user wrote).
    FUNCTION_PARSERS = {
        k: v for k, v in PostgresParser.FUNCTION_PARSERS.items() if k != "DATE_PART"
    }
    # to_char() stays a call with its template as written: sqlglot would translate the template
    # into its own time format, losing what PostgreSQL reads in it ('Month' is blank-padded)
    FUNCTIONS = {k: v for k, v in PostgresParser.FUNCTIONS.items() if k != "TO_CHAR"}

    def _fail(self, message: str, token: Token | None = None) -> t.NoReturn:
        """Raise a positioned ParseError (sqlglot's raise_error may only record it)."""
        self.raise_error(message, token or self._curr or self._prev)
        raise ParseError(message)

    # -- where extension clauses begin --------------------------------------------------------

    def _at_extension_clause(self) -> bool:
        curr, nxt = self._curr, self._next
        if not curr or curr.token_type == TokenType.STRING:
            return False
        followers = _CLAUSE_STARTS.get(curr.text.upper())
        if followers is None:
            return False
        if self._in_cached_view and curr.text.upper() != "CURRENCY":
            return True  # PRESENCE/CONSISTENCY/COMPLETENESS/REFRESH end a cached view's SELECT
        if not nxt:
            return False
        if nxt.text.upper() in followers:
            return True
        # "CURRENCY 10 MIN" is a currency clause missing its BOUND, not an alias.
        return curr.text.upper() == "CURRENCY" and nxt.token_type in (
            TokenType.NUMBER,
            TokenType.DASH,
        )

    def _at_currency_clause(self) -> bool:
        return self._at_extension_clause() and self._curr.text.upper() == "CURRENCY"

    def _parse_table_alias(
        self, alias_tokens: t.Collection[TokenType] | None = None
    ) -> exp.TableAlias | None:
        if self._at_extension_clause():
            return None
        return super()._parse_table_alias(alias_tokens)

    def _parse_alias(self, this: exp.Expr | None, explicit: bool = False) -> exp.Expr | None:
        if self._at_extension_clause():
            return this
        return super()._parse_alias(this, explicit)

    # -- long lists of constants -----------------------------------------------------------------

    # An IN list of at least this many plain constants is read straight from its tokens: the
    # generic rules take some twenty calls per item (a 150,000-key list took seconds).
    FAST_LIST = 32

    def _parse_in(self, this: exp.Expr | None, alias: bool = False) -> exp.In:
        constants = self._constant_list()
        if constants is not None:
            return self.expression(exp.In(this=this, expressions=constants))
        return super()._parse_in(this, alias)

    def _constant_list(self) -> list[exp.Expr] | None:
        """``(c, c, ...)`` of plain numbers and strings without comments, as the generic rules
        read it (the same `exp.Literal` nodes, positions included; a long list as one
        `ConstantList`, `sql_ext.long_lists`), the parser moved past its closing parenthesis;
        None (nothing moved) for anything else."""
        tokens, start = self._tokens, self._index
        if (
            start >= len(tokens)
            or tokens[start].token_type != TokenType.L_PAREN
            or tokens[start].comments
        ):
            return None
        if (
            start + 2 < len(tokens)
            and isinstance(tokens[start + 1], ListToken)
            and tokens[start + 2].token_type == TokenType.R_PAREN
        ):
            self._advance(3)
            node = t.cast(ListToken, tokens[start + 1]).node
            fresh = ConstantList(constants=node.constants, is_string=node.is_string)
            return [self.expression(fresh, tokens[start + 1])]
        constant = (TokenType.NUMBER, TokenType.STRING)
        ends = (TokenType.COMMA, TokenType.R_PAREN)
        found: list[Token] = []
        index, last = start + 1, len(tokens) - 1
        while index < last:
            token, after = tokens[index], tokens[index + 1]
            if (
                token.token_type not in constant
                or after.token_type not in ends
                or token.comments
                or after.comments
            ):
                return None
            found.append(token)
            index += 2
            if after.token_type == TokenType.R_PAREN:
                break
        else:
            return None
        if len(found) < self.FAST_LIST:
            return None
        self._advance(index - start)
        listed = constant_list(found)
        if listed is not None:
            return [self.expression(listed, found[0])]
        return [
            self.expression(
                exp.Literal(this=token.text, is_string=token.token_type == TokenType.STRING), token
            )
            for token in found
        ]

    # -- statements ------------------------------------------------------------------------------

    def _parse_select(self, *args: t.Any, **kwargs: t.Any) -> exp.Expr | None:
        # Blocks are numbered in textual order, so remember where each one starts.
        start = self._curr
        result = super()._parse_select(*args, **kwargs)
        if start:
            for select in _leading_selects(result):
                select.meta.setdefault("block_start", start.start)
        return result

    def _parse_placeholder(self) -> exp.Expr | None:
        # Parameters bind by position (%s): remember where each one stands in the text.
        start = self._curr
        placeholder = super()._parse_placeholder()
        if isinstance(placeholder, exp.Placeholder) and start:
            placeholder.meta["offset"] = start.start
        return placeholder

    # -- typed literals ----------------------------------------------------------------------

    _literal_bare = False  # the next column operators stop at a typed literal's string

    def _parse_type(
        self, parse_interval: bool = True, fallback_to_identifier: bool = False
    ) -> exp.Expr | None:
        """PostgreSQL reads ``DATE '1995-01-22'::varchar`` as ``(DATE '1995-01-22')::varchar``:
        the typed literal is made first, the cast applies to it. sqlglot casts the string
        first (a date again); here the operators after the string wait for the literal."""
        curr, nxt = self._curr, self._next
        if (
            fallback_to_identifier
            or curr is None
            or nxt is None
            or curr.token_type not in self.TYPE_TOKENS
            or nxt.token_type != TokenType.STRING
        ):
            return super()._parse_type(parse_interval, fallback_to_identifier)
        self._literal_bare = True
        try:
            typed = super()._parse_type(parse_interval, fallback_to_identifier)
        finally:
            self._literal_bare = False
        return self._parse_column_ops(typed)

    def _parse_column_ops(self, this: exp.Expr | None) -> exp.Expr | None:
        if self._literal_bare and isinstance(this, exp.Literal):
            self._literal_bare = False
            return this
        return super()._parse_column_ops(this)

    def _warn_unsupported(self) -> None:
        # Statements sqlglot does not model (VACUUM, REFRESH MATERIALIZED VIEW, ...) go to the
        # backend verbatim by design: nothing to warn about.
        return

    def _parse_statement(self) -> exp.Expr | None:
        if self._curr.token_type == TokenType.VAR and self._curr.text.upper() == "EXPLAIN":
            return self._parse_explain()
        curr, nxt = self._curr, self._next
        if (
            curr
            and nxt
            and curr.text.upper() in ("BEGIN", "END")
            and nxt.text.upper() == "TIMEORDERED"
        ):
            self._advance(2)
            return self.expression(Timeline(this=curr.text.upper()), token=curr)
        if (
            curr
            and nxt
            and curr.text.upper() in ("SET", "RESET", "SHOW")
            and nxt.text.upper() == "CURRENCY"
        ):
            return self._parse_session_bound()
        if (
            curr
            and nxt
            and curr.text.upper() in ("RESET", "SHOW", "REFRESH")
            and nxt.token_type == TokenType.STRING
        ):
            # PostgreSQL's tokenizer reads the rest of a RESET/SHOW/REFRESH command as one
            # string: the cache's own commands are read from its words
            ours = self._cache_command(curr, nxt)
            if ours is not None:
                return ours
        if curr and nxt and curr.token_type == TokenType.SET:
            setting = self._parse_cache_setting()
            if setting is not None:
                return setting
        return super()._parse_statement()

    def _cache_command(self, curr: Token, nxt: Token) -> exp.Expr | None:
        """SHOW/RESET CURRENCY BOUND, SHOW CACHED VIEWS, SHOW CACHE STATUS / STATS, SHOW/RESET
        mtcache.name, REFRESH CACHED VIEW(S) ...; None for the backend's commands."""
        action, words = curr.text.upper(), nxt.text.split()
        upper = [w.upper() for w in words]
        node: exp.Expr
        if action == "REFRESH":
            if upper[:2] not in (["CACHED", "VIEW"], ["CACHED", "VIEWS"]):
                return None
            return self._parse_refresh_cached(curr, nxt)
        if upper == ["CURRENCY", "BOUND"]:
            node = SessionBound(this=action)
        elif action == "SHOW" and upper in (
            ["CACHED", "VIEWS"],
            ["CACHE", "STATUS"],
            ["CACHE", "STATS"],
        ):
            node = Inspect(this=" ".join(words).lower())
        elif len(words) == 1 and words[0].lower().startswith(CACHE_SETTINGS):
            node = CacheSetting(this=action, name=words[0].lower())
        else:
            return None
        self._advance(2)
        return self.expression(node, token=curr)

    def _parse_cache_setting(self) -> CacheSetting | None:
        """SET [SESSION] mtcache.name {= | TO} value (SET LOCAL of one is refused); None for
        any other SET."""
        start, at = self._curr, self._index + 1
        tokens = self._tokens
        scope = tokens[at].text.upper() if at < len(tokens) else ""
        if scope in ("SESSION", "LOCAL"):
            at += 1
        if not (
            at + 2 < len(tokens)
            and tokens[at].text.lower() == CACHE_SETTINGS[:-1]
            and tokens[at + 1].token_type == TokenType.DOT
        ):
            return None
        name = f"{CACHE_SETTINGS}{tokens[at + 2].text.lower()}"
        if scope == "LOCAL":
            self._fail(
                f"SET LOCAL {name}: the cache's settings hold for the session (use SET)", start
            )
        self._advance(at + 3 - self._index)
        if not (
            self._curr
            and (self._curr.token_type == TokenType.EQ or self._curr.text.upper() == "TO")
        ):
            self._fail(f"expected = or TO after SET {name}")
        self._advance()
        value = self._curr
        if not value or value.token_type == TokenType.SEMICOLON:
            self._fail(f"expected a value after SET {name}", start)
        self._advance()
        if self._curr and self._curr.token_type != TokenType.SEMICOLON:
            self._fail(f"SET {name} takes one value (quote it: SET {name} = '10 min')")
        text = (
            None
            if value.text.upper() == "DEFAULT" and value.token_type != TokenType.STRING
            else value.text
        )
        return self.expression(CacheSetting(this="SET", name=name, value=text), token=start)

    def _parse_refresh_cached(self, start: Token, words: Token) -> RefreshCached:
        """REFRESH CACHED VIEW name [KEY (v, ...), ...] | REFRESH CACHED VIEWS. The command's
        tokenizer read the words after REFRESH as one string: they are tokenized again, put in
        its place, and parsed as any statement's tokens."""
        base = words.end - len(words.text) + 1  # a command's string token ends where it does
        self._tokens[self._index + 1 : self._index + 2] = [
            # sqlglot's tokens hold the line and column of their last character
            Token(
                tok.token_type,
                tok.text,
                *offset_position(self.sql, base + tok.end),
                base + tok.start,
                base + tok.end,
            )
            for tok in MTCacheTokenizer().tokenize(words.text)
        ]
        self._tokens_size = len(self._tokens)  # sqlglot's parser keeps the count
        self._advance(2)  # REFRESH CACHED
        if self._match_text_seq("VIEWS"):
            node = RefreshCached()
            rest = "REFRESH CACHED VIEWS takes nothing more (it refreshes every white view)"
        else:
            self._match_text_seq("VIEW")
            name = self._parse_id_var(any_token=False)
            if name is None:
                self._fail("expected a cached view's name after REFRESH CACHED VIEW")
            keys = None
            if self._match_text_seq("KEY"):
                keys = [self._parse_refresh_key()]
                while self._match(TokenType.COMMA):
                    keys.append(self._parse_refresh_key())
                rest = "expected , and another key, or the end of the statement"
            else:
                rest = f"expected KEY (value, ...) after REFRESH CACHED VIEW {folded(name)}"
            node = RefreshCached(this=folded(name), keys=keys)
        if self._curr and self._curr.token_type != TokenType.SEMICOLON:
            self._fail(rest)
        return self.expression(node, token=start)

    def _parse_refresh_key(self) -> tuple[str, ...]:
        """(value, ...): a presence key's values, as their texts."""
        if not self._match(TokenType.L_PAREN):
            self._fail("expected (value, ...): a presence key's values")
        values = [self._parse_key_value()]
        while self._match(TokenType.COMMA):
            values.append(self._parse_key_value())
        if not self._match(TokenType.R_PAREN):
            self._fail("expected , or ) in a key's values")
        return tuple(values)

    def _parse_key_value(self) -> str:
        value = self._parse_unary()
        if (
            isinstance(value, exp.Neg)
            and isinstance(value.this, exp.Literal)
            and value.this.is_number
        ):
            return f"-{value.this.name}"
        if not isinstance(value, exp.Literal):
            self._fail("a key value is a string or a number", self._prev)
        return value.name

    def _parse_session_bound(self) -> SessionBound:
        """SET CURRENCY BOUND d | RESET CURRENCY BOUND | SHOW CURRENCY BOUND."""
        start = self._curr
        action = start.text.upper()
        self._advance(2)
        if not self._match_text_seq("BOUND"):
            self._fail(f"expected BOUND after {action} CURRENCY ({action} CURRENCY BOUND ...)")
        duration = None
        if action == "SET":
            if not self._curr or self._curr.token_type == TokenType.SEMICOLON:
                self._fail("expected a duration after SET CURRENCY BOUND, e.g. 10 MIN", start)
            duration = self._parse_duration("SET CURRENCY BOUND")
        if self._curr and self._curr.token_type != TokenType.SEMICOLON:
            self._fail(
                f"{action} CURRENCY BOUND takes "
                + ("a duration only" if action == "SET" else "nothing more")
            )
        return self.expression(SessionBound(this=action, expression=duration), token=start)

    def _parse_explain(self) -> ExplainStatement | Inspect:
        """EXPLAIN [ANALYZE] [VERBOSE] stmt | EXPLAIN (option, ...) stmt (PostgreSQL's forms)."""
        start = self._curr
        self._advance()
        if (
            self._curr
            and self._next
            and self._curr.text.upper() == "LAST"
            and self._next.text.upper() == "STATEMENT"
        ):
            self._advance(2)
            if self._curr and self._curr.token_type != TokenType.SEMICOLON:
                self._fail("EXPLAIN LAST STATEMENT takes nothing more")
            return self.expression(Inspect(this="last statement"), token=start)
        options = ""
        if self._curr and self._curr.token_type == TokenType.L_PAREN:
            first, depth = self._curr, 0
            while self._curr:
                depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(self._curr.token_type, 0)
                self._advance()
                if depth == 0:
                    break
            options = self._find_sql(first, self._prev)
        else:
            words = []
            while self._curr and self._curr.text.upper() in ("ANALYZE", "ANALYSE", "VERBOSE"):
                words.append(self._curr.text.upper())
                self._advance()
            options = " ".join(words)
        if not self._curr or self._curr.token_type == TokenType.SEMICOLON:
            self._fail("EXPLAIN needs a statement to explain, e.g. EXPLAIN SELECT ...", start)
        body_start = self._curr.start
        inner = self._parse_statement()
        if inner is None:
            self._fail("EXPLAIN needs a statement to explain, e.g. EXPLAIN SELECT ...", start)
        explain = self.expression(
            ExplainStatement(this=inner, options=exp.var(options) if options else None),
            token=start,
        )
        explain.meta[BODY_START] = body_start  # where the explained statement's text begins
        return explain

    # -- §2 the currency clause --------------------------------------------------------------

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
                        _token_of(ident, self._curr),
                    )
                seen[name] = _token_of(ident, self._curr)
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

    # -- §3 cache DDL ----------------------------------------------------------------------------

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
                    _token_of(column, self._prev),
                )
            cname = folded(column.this)
            if cname in RESERVED_CONTROL_COLUMNS:
                self._fail(
                    f"column {cname!r} is reserved: mtcache adds refreshed_at and snapshot_id "
                    "to every control table itself",
                    _token_of(column.this, self._prev),
                )
            if cname in seen:
                self._fail(f"column {cname!r} appears twice", _token_of(column.this, self._prev))
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
                elif not self._match_text_seq("EVERY"):
                    self._fail(
                        "expected EVERY or CONTINUOUSLY after REFRESH "
                        "(REFRESH EVERY 5 MIN, REFRESH CONTINUOUSLY)"
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
                    "CONSISTENCY, COMPLETENESS ON, REFRESH EVERY, REFRESH CONTINUOUSLY or "
                    "WITH [NO] DATA",
                    option,
                )

        root = args.get("consistency")
        if root is not None and root.text("kind") == "ROOT":
            if args.get("completeness") is not None:
                self._fail(
                    "CONSISTENCY ROOT makes the view gray: a gray view has no completeness "
                    "control of its own (Rule 2); drop COMPLETENESS or CONSISTENCY ROOT",
                    _token_of(args["completeness"], token),
                )
            if not args["presence"]:
                self._fail(
                    "CONSISTENCY ROOT makes the view consistent with its presence parent, but "
                    "the view has no PRESENCE ON ... IN <cached view> clause",
                    _token_of(root, token),
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
                _token_of(select.args["currency"], token),
            )
        if is_derived(select):
            self._check_derived_select(select, token)
            return
        alias = source.this.args.get("alias")
        if alias is not None:
            self._fail(
                f"unexpected {alias.name!r} after the view's table: expected WHERE, PRESENCE "
                "ON, CONSISTENCY, COMPLETENESS ON or REFRESH EVERY (the table takes no alias)",
                _token_of(alias, token),
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
                    _token_of(projection, token),
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
                    _token_of(join, token),
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
                    _token_of(join, token),
                )
        group = select.args.get("group")
        if group is not None:
            extra = [k for k in group.args if k != "expressions" and group.args.get(k)]
            if extra or not all(isinstance(c, exp.Column) for c in group.expressions):
                self._fail(
                    "a derived cached view groups by plain columns only: "
                    f"{group.sql(dialect='postgres')!r}",
                    _token_of(group, token),
                )
        for node in (select.args.get("where"), *select.expressions):
            if node is not None and node.find(exp.Select, exp.Window) is not None:
                self._fail(
                    "a derived cached view takes no subqueries or window functions: "
                    f"{node.sql(dialect='postgres')!r}",
                    _token_of(node, token),
                )
        for projection in select.expressions:
            target = projection.this if isinstance(projection, exp.Alias) else projection
            if isinstance(target, exp.Star):
                self._fail(
                    "a derived cached view lists its columns (SELECT * is for views of one table)",
                    _token_of(projection, token),
                )
            if isinstance(target, exp.Column):
                continue
            if not isinstance(target, DERIVED_AGGREGATES):
                self._fail(
                    "a derived cached view projects columns and the aggregates count, "
                    f"sum, avg, min and max: {projection.sql(dialect='postgres')!r}",
                    _token_of(projection, token),
                )
            if not isinstance(projection, exp.Alias):
                self._fail(
                    "name each aggregate of a derived cached view with AS: "
                    f"{projection.sql(dialect='postgres')!r}",
                    _token_of(projection, token),
                )
            value = target.this
            if isinstance(value, exp.Distinct) or target.find(exp.Filter) is not None:
                self._fail(
                    "a derived cached view's aggregates take no DISTINCT or FILTER: "
                    f"{projection.sql(dialect='postgres')!r}",
                    _token_of(projection, token),
                )
            if value is not None and value.find(*DERIVED_AGGREGATES) is not None:
                self._fail(
                    "an aggregate of a derived cached view takes an expression of the "
                    f"rows: {projection.sql(dialect='postgres')!r}",
                    _token_of(projection, token),
                )


# the aggregates a derived cached view keeps (count(*) is a Count of a Star)
DERIVED_AGGREGATES = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)


def is_derived(select: exp.Select) -> bool:
    """Whether a cached view's SELECT makes a derived view: it joins, groups or
    aggregates."""
    return bool(
        select.args.get("joins")
        or select.args.get("group")
        or any(p.find(*DERIVED_AGGREGATES) is not None for p in select.expressions)
    )


def _leading_selects(node: exp.Expr | None) -> list[exp.Select]:
    """The SELECT that begins at the same token as ``node`` (the left spine of set operations)."""
    while isinstance(node, exp.SetOperation):
        node = node.this
    return [node] if isinstance(node, exp.Select) else []


def _token_of(node: exp.Expr | None, fallback: Token | None) -> Token:
    """A token positioned at a node (from its meta), for error messages."""
    meta: dict[str, t.Any] = {}
    if node is not None:
        meta = node.meta if node.meta.get("line") else {}
        if not meta:
            for child in node.walk():
                if isinstance(child, exp.Expr) and child.meta.get("line"):
                    meta = child.meta
                    break
    if meta:
        return Token(
            TokenType.VAR,
            node.sql() if isinstance(node, exp.Identifier) else "",
            line=meta["line"],
            col=meta["col"],
            start=meta.get("start", 0),
            end=meta.get("end", 0),
        )
    return fallback or Token.string("")


class FastLists(Generator):
    """Prints an IN list of at least ``FAST_LIST`` plain constants in one go (the generic path
    dispatches each item on its own: seconds for a list of 150,000), and a `ConstantList`."""

    FAST_LIST = 32

    def constantlist_sql(self, expression: ConstantList) -> str:
        if expression.is_string:
            return ", ".join(["'" + c.replace("'", "''") + "'" for c in expression.constants])
        return ", ".join(expression.constants)

    def in_sql(self, expression: exp.In) -> str:
        items = expression.expressions
        if (
            len(items) >= self.FAST_LIST
            and not self.pretty
            and len(expression.args) == 2
            and all(type(e) is exp.Literal and not e.comments for e in items)
        ):
            listed = ", ".join([self.literal_sql(e) for e in items])
            return f"{self.sql(expression, 'this')} IN ({listed})"
        return super().in_sql(expression)


class MTCacheGenerator(FastLists, PostgresGenerator):
    """Prints the extended dialect back (round trip); PostgreSQL/DuckDB output strips it."""

    # sqlglot dispatches its own node classes by name; ours are registered explicitly.
    TRANSFORMS = {
        **PostgresGenerator.TRANSFORMS,
        CurrencyClause: lambda self, e: self.currencyclause_sql(e),
        ConstantList: lambda self, e: self.constantlist_sql(e),
        CurrencySpec: lambda self, e: self.currencyspec_sql(e),
        Duration: lambda self, e: self.duration_sql(e),
        Timeline: lambda self, e: self.timeline_sql(e),
        SessionBound: lambda self, e: " ".join(
            p for p in (e.name, "CURRENCY BOUND", self.sql(e, "expression")) if p
        ),
        ExplainStatement: lambda self, e: " ".join(
            p for p in ("EXPLAIN", self.sql(e, "options"), self.sql(e, "this")) if p
        ),
    }

    def select_sql(self, expression: exp.Select) -> str:
        sql = super().select_sql(expression)
        currency = expression.args.get("currency")
        return f"{sql} {self.sql(currency)}" if currency is not None else sql

    def currencyclause_sql(self, expression: CurrencyClause) -> str:
        return "CURRENCY BOUND " + ", ".join(self.sql(spec) for spec in expression.expressions)

    def currencyspec_sql(self, expression: CurrencySpec) -> str:
        sql = self.sql(expression, "this")
        if expression.args.get("on"):
            sql += " ON (" + ", ".join(self.sql(i) for i in expression.args["on"]) + ")"
        if expression.args.get("by"):
            sql += " BY " + ", ".join(self.sql(c) for c in expression.args["by"])
        return sql

    def duration_sql(self, expression: Duration) -> str:
        return f"{expression.this.name} {expression.text('unit')}"

    def timeline_sql(self, expression: Timeline) -> str:
        return f"{expression.name} TIMEORDERED"


class MTCacheTokenizer(Postgres.Tokenizer):
    # EXPLAIN is a command to PostgreSQL's tokenizer (the rest of the statement becomes one
    # string); mtcache parses the explained statement, so EXPLAIN is an ordinary word here.
    KEYWORDS = {k: v for k, v in Postgres.Tokenizer.KEYWORDS.items() if k != "EXPLAIN"}

    def tokenize(self, sql: str) -> list[Token]:
        # a long list of constants is one token (`sql_ext.long_lists`)
        return long_lists.tokenize(sql, super().tokenize)


def plain_tokens(text: str) -> list[Token]:
    """The tokens of ``text``, each constant of a long list a token of its own."""
    return Postgres.Tokenizer.tokenize(MTCache().tokenizer(), text)


class MTCache(Postgres):
    """PostgreSQL with mtcache's extensions."""

    class Tokenizer(MTCacheTokenizer):
        pass

    class Parser(MTCacheParser):
        pass

    class Generator(MTCacheGenerator):
        pass


class PlainGenerator(MTCacheGenerator):
    """Prints a parsed statement as plain PostgreSQL, its currency clauses left out: what
    stripping them from a copy would print, without the copy."""

    def select_sql(self, expression: exp.Select) -> str:
        return PostgresGenerator.select_sql(self, expression)


class MTCachePlain(MTCache):
    """The output dialect of `PlainGenerator`."""

    class Generator(PlainGenerator):
        pass


class LocalDuckDB(DuckDB):
    """DuckDB, as the cache prints the statements it runs locally (long constant lists in one
    go)."""

    class Generator(FastLists, DuckDBGenerator):
        TRANSFORMS = {
            **DuckDBGenerator.TRANSFORMS,
            ConstantList: lambda self, e: self.constantlist_sql(e),
        }
