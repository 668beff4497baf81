"""The ground the mtcache dialect's grammars stand on (`BaseParser`, a PostgreSQL parser):
where an extension clause begins (the keywords are ordinary identifiers to PostgreSQL, so implicit
aliases must not swallow them: ``FROM books CURRENCY BOUND ...`` does not alias books as
"currency"), long lists of constants read straight from their tokens, where blocks and
parameters stand in the text, typed literals as PostgreSQL reads them, and the positioned errors
the grammars raise.
"""

from __future__ import annotations

import typing as t

from sqlglot import exp
from sqlglot.errors import ParseError
from sqlglot.parsers.postgres import PostgresParser
from sqlglot.tokens import Token, TokenType

from sql_ext.long_lists import ListToken, constant_list
from sql_ext.nodes import ConstantList

# meta key of a node's (start, end) character offsets in the parsed text (end exclusive)
SPAN = "mt_span"
BODY_START = "mt_body_start"  # EXPLAIN's meta: the character offset of the explained statement

# A keyword opens an extension clause only when the next token fits; otherwise it stays an
# ordinary identifier (a column or alias may be called "presence").
_CLAUSE_STARTS: dict[str, tuple[str, ...]] = {
    "CURRENCY": ("BOUND",),
    "PRESENCE": ("ON",),
    "CONSISTENCY": ("ON", "ROOT"),
    "COMPLETENESS": ("ON",),
    "REFRESH": ("EVERY", "CONTINUOUSLY", "AUTO"),
}


class BaseParser(PostgresParser):
    """PostgreSQL's parser, aware of where mtcache's clauses begin; the grammars build on it."""

    _in_cached_view = False  # (set while `CacheDDLParser` reads a cached view's SELECT)

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

    # -- where blocks and parameters stand -----------------------------------------------------

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


def _leading_selects(node: exp.Expr | None) -> list[exp.Select]:
    """The SELECT that begins at the same token as ``node`` (the left spine of set operations)."""
    while isinstance(node, exp.SetOperation):
        node = node.this
    return [node] if isinstance(node, exp.Select) else []


def token_of(node: exp.Expr | None, fallback: Token | None) -> Token:
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
