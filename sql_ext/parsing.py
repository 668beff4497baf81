"""Text to typed statements: `parse` (a script), `parse_one` (one statement) and
`parse_duration`. The mtcache dialect reads the text (`sql_ext.dialect`), each tree becomes its
typed statement (`sql_ext.typed`), and sqlglot's errors become `SqlSyntaxError` (a
`ProgrammingError`) carrying the line and column of the offending token.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from sql_ext.ddl import CreateCachedView, CreateControlTable, DropCacheObject
from sql_ext.dialect import plain_tokens
from sql_ext.errors import SqlSyntaxError, offset_position, too_deep
from sql_ext.long_lists import ListToken
from sql_ext.nodes import ConstantList
from sql_ext.statements import DIALECT, SessionBound, Statement, is_empty, script_pieces
from sql_ext.typed import typed_statement


def parse(text: str, percent: bool = False) -> list[Statement]:
    """Parse a script of one or more statements separated by semicolons. ``percent``: the
    text comes with parameters, so ``%%`` is a ``%`` (psycopg's rule: the backend is sent the
    text as written and psycopg reads it so)."""
    if "\0" in text:  # (libpq would send the text up to it: another statement, or half of one)
        raise SqlSyntaxError(
            "the statement holds a NUL byte, which no PostgreSQL statement can: remove it "
            "(a value with one is no text either: bytea takes any byte)",
            *offset_position(text, text.index("\0")),
        )
    try:
        tokens = _percent_tokens(DIALECT.tokenize(text)) if percent else DIALECT.tokenize(text)
        parsed = DIALECT.parser().parse(tokens, text)
        if not _lists_in_place(tokens, parsed):
            # a long list read where no IN list stands: read it one constant at a time
            tokens = _percent_tokens(plain_tokens(text)) if percent else plain_tokens(text)
            parsed = DIALECT.parser().parse(tokens, text)
    except ParseError as exc:
        raise _syntax_error(exc, text) from None
    except TokenError as exc:
        raise _token_error(exc, text) from None
    except RecursionError:
        raise too_deep() from None
    # empty statements (";;", or only a comment, which sqlglot keeps as a Semicolon): nothing
    trees = [tree for tree in parsed if tree is not None and not isinstance(tree, exp.Semicolon)]
    if not trees and not is_empty(text):
        # sqlglot read tokens as nothing at all (a lone ELSE): refuse them at the first
        first = DIALECT.tokenize(text)[0]
        raise SqlSyntaxError(
            f"unexpected {first.text!r}: a statement cannot start with it",
            *offset_position(text, first.start),
        )
    chunks = _statement_texts(text, tokens, len(trees))
    for tree, (chunk, start) in zip(trees, chunks, strict=True):
        if isinstance(tree, exp.Condition | exp.Alias | exp.Identifier) and not isinstance(
            tree, exp.Query
        ):
            refused = _not_a_statement(chunk, start, text)
            if refused is not None:
                raise refused
    statements = [
        _placed(typed_statement(tree, chunk, start), text, start)
        for tree, (chunk, start) in zip(trees, chunks, strict=True)
    ]
    if not statements:
        raise SqlSyntaxError("empty statement: there is no SQL to run", 1, 1)
    return statements


def _lists_in_place(tokens: list[Token], trees: list[exp.Expr | None]) -> bool:
    """Did every long list of the tokens become the `ConstantList` of an IN list?"""
    lists = {id(token.node.constants) for token in tokens if isinstance(token, ListToken)}
    if not lists:
        return True
    nodes = {
        id(node.constants)
        for tree in trees
        if tree is not None
        for node in tree.find_all(ConstantList)
    }
    return lists <= nodes


def _percent_tokens(tokens: list[Token]) -> list[Token]:
    """Tokens of a text with parameters as psycopg reads it: ``%%`` (two adjacent % tokens) is
    one %, also inside strings and quoted names; positions stay the text's."""
    found: list[Token] = []
    for token in tokens:
        previous = found[-1] if found else None
        if (
            token.token_type == TokenType.MOD
            and previous is not None
            and previous.token_type == TokenType.MOD
            and previous.text == "%"
            and previous.end + 1 == token.start
            and not previous.comments
        ):
            found[-1] = Token(
                TokenType.MOD,
                "%%",
                previous.line,
                previous.col,
                previous.start,
                token.end,
                previous.comments,
            )
            continue
        if isinstance(token, ListToken):
            found.append(
                token
                if not token.node.is_string
                else ListToken(
                    ConstantList(
                        constants=tuple(c.replace("%%", "%") for c in token.node.constants),
                        is_string=True,
                    ),
                    token.line,
                    token.col,
                    token.start,
                    token.end,
                )
            )
        elif "%%" in token.text and token.token_type in _QUOTED:
            found.append(
                Token(
                    token.token_type,
                    token.text.replace("%%", "%"),
                    token.line,
                    token.col,
                    token.start,
                    token.end,
                    token.comments,
                )
            )
        else:
            found.append(token)
    return found


_QUOTED = frozenset(
    {
        TokenType.STRING,
        TokenType.IDENTIFIER,
        TokenType.NATIONAL_STRING,
        TokenType.BIT_STRING,
        TokenType.HEX_STRING,
        TokenType.RAW_STRING,
    }
)


def parse_one(text: str, percent: bool = False) -> Statement:
    """Parse exactly one statement (a trailing semicolon is fine; ``percent``: as `parse`)."""
    statements = parse(text, percent)
    if len(statements) != 1:
        raise SqlSyntaxError(
            f"expected one statement, found {len(statements)}: send them one at a time "
            "(cursor.execute) or as a DDL script (mtcache ddl FILE)",
            *_second_statement_start(text),
        )
    return statements[0]


def _second_statement_start(text: str) -> tuple[int | None, int | None]:
    tokens = DIALECT.tokenize(text)
    for token, following in itertools.pairwise(tokens):
        if token.token_type.name == "SEMICOLON" and following.token_type.name != "SEMICOLON":
            return following.line, following.col - len(following.text) + 1
    return None, None


def _statement_texts(text: str, tokens: list[Token], count: int) -> list[tuple[str, int]]:
    """Each statement's text and its offset in the script (``count`` statements: the trees
    sqlglot made, empty ones left out). The typed results keep their own text (for commands
    sqlglot keeps verbatim); a script split is only needed for multi-statement input."""
    if count <= 1:
        return [(text, 0)] * count
    pieces = script_pieces(text, tokens)
    if len(pieces) != count:
        raise SqlSyntaxError(
            f"cannot split the script into its {count} statements: send them one at a time", 1, 1
        )
    return pieces


def _placed(statement: Statement, script: str, start: int) -> Statement:
    """A DDL statement with the script position of its text (for errors found later, when
    the script is checked as a whole)."""
    if not isinstance(statement, CreateControlTable | CreateCachedView | DropCacheObject):
        return statement
    return dataclasses.replace(statement, position=offset_position(script, start))


def _token_error(exc: TokenError, text: str) -> SqlSyntaxError:
    # sqlglot says "Missing ' from <line>:<offset of the opening quote>" in the cause.
    cause = str(exc.__cause__ or exc)
    match = re.match(r"Missing (.+) from (\d+):(\d+)", cause)
    if match is None:
        return SqlSyntaxError(f"cannot read the statement: {cause}")
    delimiter, line, offset = match.group(1), int(match.group(2)), int(match.group(3))
    col = offset - text.rfind("\n", 0, offset)
    what = {"'": "string", '"': "quoted identifier"}.get(delimiter, "quoted text")
    return SqlSyntaxError(f"unterminated {what}: add the closing {delimiter}", line, col)


def _syntax_error(exc: ParseError, text: str) -> SqlSyntaxError:
    misspelled = _unknown_statement_start(text)
    if misspelled is not None:
        return misspelled
    info = exc.errors[0] if exc.errors else {}
    description = str(info.get("description") or exc).strip()
    highlight = str(info.get("highlight") or "").strip()
    if description.startswith("Invalid expression / Unexpected token"):
        description = (
            f"unexpected {highlight!r}: the statement should have ended before it"
            if highlight
            else "unexpected end of statement"
        )
    elif description.startswith("Required keyword") or description.startswith("Expecting"):
        near = f" near {highlight!r}" if highlight else ""
        description = f"incomplete statement{near}: {description}"
    line, col = info.get("line"), info.get("col")
    if col is not None and highlight and "\n" not in highlight:
        # sqlglot reports where the token ends; people look for where it starts.
        col = max(1, int(col) - len(str(info.get("highlight"))) + 1)
    return SqlSyntaxError(description, line, col)


# the words PostgreSQL statements begin with (its SQL command reference)
_STATEMENT_WORDS = frozenset(
    {
        "ABORT",
        "ALTER",
        "ANALYZE",
        "BEGIN",
        "CALL",
        "CHECKPOINT",
        "CLOSE",
        "CLUSTER",
        "COMMENT",
        "COMMIT",
        "COPY",
        "CREATE",
        "DEALLOCATE",
        "DECLARE",
        "DELETE",
        "DISCARD",
        "DO",
        "DROP",
        "END",
        "EXECUTE",
        "EXPLAIN",
        "FETCH",
        "GRANT",
        "IMPORT",
        "INSERT",
        "LISTEN",
        "LOAD",
        "LOCK",
        "MERGE",
        "MOVE",
        "NOTIFY",
        "PREPARE",
        "REASSIGN",
        "REFRESH",
        "REINDEX",
        "RELEASE",
        "RESET",
        "REVOKE",
        "ROLLBACK",
        "SAVEPOINT",
        "SECURITY",
        "SELECT",
        "SET",
        "SHOW",
        "START",
        "TABLE",
        "TRUNCATE",
        "UNLISTEN",
        "UPDATE",
        "VACUUM",
        "VALUES",
        "WITH",
    }
)


def _no_statement_word(word: str, line: int, col: int) -> SqlSyntaxError:
    """A statement begun by a word that begins none (a typo, or a bare expression)."""
    return SqlSyntaxError(
        f"{word!r} does not begin a statement: expected SELECT, WITH, VALUES, INSERT, UPDATE, "
        "DELETE, CREATE, ... (a misspelled keyword?)",
        line,
        col,
    )


def _not_a_statement(chunk: str, start: int, text: str) -> SqlSyntaxError | None:
    """A statement that is a bare expression (``hello``, ``hello world``, ``1``), which sqlglot
    reads and PostgreSQL refuses, refused at its first word; None: it begins with a statement's
    word (``LISTEN x`` reads as an expression too)."""
    first = DIALECT.tokenize(chunk)[0]
    if first.text.upper() in _STATEMENT_WORDS:
        return None
    line, col = offset_position(text, start + first.start)
    if first.token_type.name == "VAR":
        return _no_statement_word(first.text, line, col)
    return SqlSyntaxError(f"unexpected {first.text!r}: a statement cannot start with it", line, col)


def _unknown_statement_start(text: str) -> SqlSyntaxError | None:
    """A statement that begins with a word that is no keyword (``SELCT name FROM t``): the
    parser would stumble later (at FROM); the typo is where the statement begins."""
    try:
        tokens = DIALECT.tokenize(text)
    except TokenError:
        return None
    starts = [
        b
        for a, b in itertools.pairwise([None, *tokens])
        if a is None or a.token_type.name == "SEMICOLON"
    ]
    for token in starts:
        if (
            token is not None
            and token.token_type.name == "VAR"
            and token.text.upper() not in _STATEMENT_WORDS
        ):
            return _no_statement_word(token.text, *offset_position(text, token.start))
    return None


def parse_duration(text: str, bare: float | None = None) -> float:
    """Seconds of a duration written as in a currency clause (``10 min``, ``1.5 SECONDS``) or
    as PostgreSQL writes its time settings (``500ms``, ``2s``, ``10min``); ``bare``: the unit
    (in seconds) of a number written alone, for a setting named after one of PostgreSQL's,
    which reads it so (``statement_timeout``: ms); None: a number alone is refused."""
    if bare is not None:
        try:
            number = float(text.strip())
        except ValueError:
            pass
        else:
            if not number >= 0 or number == float("inf"):
                raise SqlSyntaxError(f"{text!r} is not a duration: give 0 or more")
            return number * bare
    try:
        statement = parse_one(f"SET CURRENCY BOUND {text}")
    except SqlSyntaxError as exc:
        raise SqlSyntaxError(f"{text!r} is not a duration: {exc.reason}") from None
    assert isinstance(statement, SessionBound) and statement.bound_seconds is not None
    return statement.bound_seconds
