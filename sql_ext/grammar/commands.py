"""The statements the mtcache dialect reads itself (`CommandParser`): BEGIN/END TIMEORDERED,
SET/RESET/SHOW CURRENCY BOUND, the cache's session settings (SET/RESET/SHOW mtcache.name),
SHOW CACHED VIEWS / CACHE STATUS / CACHE STATS, REFRESH CACHED VIEW(S) and EXPLAIN (whose
explained statement is parsed too); everything else is PostgreSQL's.
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from sql_ext.errors import offset_position
from sql_ext.grammar.base import BODY_START
from sql_ext.grammar.currency import CurrencyParser
from sql_ext.grammar.tokenizer import MTCacheTokenizer
from sql_ext.nodes import (
    CacheSetting,
    ExplainStatement,
    Inspect,
    RefreshCached,
    SessionBound,
    Timeline,
)
from sql_ext.quoting import folded, folded_text

# the prefix of the cache's own session settings (SET mtcache.provenance = on)
CACHE_SETTINGS = "mtcache."


class CommandParser(CurrencyParser):
    """`CurrencyParser` reading the statements the cache answers or runs itself."""

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
        """SHOW/RESET CURRENCY BOUND, SHOW CACHED VIEWS, SHOW CACHE STATUS / STATS / ADVICE / SEED,
        SHOW/RESET mtcache.name, REFRESH CACHED VIEW(S) ...; None for the backend's commands."""
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
            ["CACHE", "ADVICE"],
            ["CACHE", "SEED"],
        ):
            node = Inspect(this=" ".join(words).lower())
        elif action == "SHOW" and upper[:4] == ["CACHE", "STATUS", "FOR", "VIEW"]:
            # SHOW CACHE STATUS FOR VIEW a, b: those views' regions listed, however many
            listed = nxt.text.split(None, 4)[4] if len(words) > 4 else ""
            names = [name.strip() for name in listed.split(",")]
            if not all(names):
                self._fail("expected view names after SHOW CACHE STATUS FOR VIEW", curr)
            node = Inspect(this="cache status", views=[folded_text(n) for n in names])
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
