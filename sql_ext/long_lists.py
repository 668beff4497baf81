"""Long ``IN (...)`` lists of constants, read as one `ConstantList` node.

A list of at least `LONG_LIST` constants, all unsigned integers or all strings without
backslashes or control characters, becomes one node, whether the parser meets it among the
tokens (`constant_list`) or the tokenizer never reads it one constant at a time: `tokenize`
finds such lists in the text with a regular expression, tokenizes only the text around them,
and puts one `ListToken` in each list's place. The splice is taken only where the text's own
tokens prove the list stands in SQL (an ``IN`` keyword token and a ``(`` token right before
it, not a string, comment or quoted name), and every token keeps the position it has in the
whole text, so errors, currency clause spans and parameter offsets are those of the text as
written.
"""

from __future__ import annotations

import re
import typing as t
from collections.abc import Callable, Sequence

from sqlglot.errors import TokenError
from sqlglot.tokens import Token, TokenType

from sql_ext.errors import offset_position
from sql_ext.nodes import ConstantList

LONG_LIST = 1000  # constants in one list from which it is read as one node

_SPACE = r"[ \t\r\n]*"
_INT = r"[0-9]+"
_STRING = r"'(?:[^'\\\x00-\x1f]|'')*'"
# "IN (" as a keyword (not part of a longer name), then the list's first constant
_OPENING = re.compile(r"(?<![\w$\"])in" + _SPACE + r"\(" + _SPACE + r"(?=[0-9'])", re.I)
_LISTS = {
    False: re.compile(f"{_INT}(?:{_SPACE},{_SPACE}{_INT}){{{LONG_LIST - 1},}}{_SPACE}\\)"),
    True: re.compile(f"{_STRING}(?:{_SPACE},{_SPACE}{_STRING}){{{LONG_LIST - 1},}}{_SPACE}\\)"),
}
_FIRST = {False: re.compile(_INT), True: re.compile(_STRING)}
_STRINGS = re.compile(r"'((?:[^'\\\x00-\x1f]|'')*)'")
_PLAIN_STRING = re.compile(r"[^\\\x00-\x1f]*")


class ListToken(Token):
    """The constants of one long list, standing in the token stream for all of them (between
    its ``(`` and ``)`` tokens, placed where its first constant is); only the dialect's parser
    reads it."""

    __slots__ = ("node",)

    def __init__(self, node: ConstantList, line: int, col: int, start: int, end: int) -> None:
        super().__init__(TokenType.VAR, f"<{len(node.constants)} constants>", line, col, start, end)
        self.node = node


def constant_list(tokens: Sequence[Token]) -> ConstantList | None:
    """The list of these constant tokens as one node, if it is long and plain enough."""
    if len(tokens) < LONG_LIST:
        return None
    kinds = {token.token_type for token in tokens}
    if kinds == {TokenType.NUMBER}:
        texts = tuple(token.text for token in tokens)
        return (
            ConstantList(constants=texts, is_string=False)
            if all(text.isascii() and text.isdigit() for text in texts)
            else None
        )
    if kinds == {TokenType.STRING}:
        texts = tuple(token.text for token in tokens)
        return (
            ConstantList(constants=texts, is_string=True)
            if all(_PLAIN_STRING.fullmatch(text) for text in texts)
            else None
        )
    return None


def tokenize(text: str, plain: Callable[[str], list[Token]]) -> list[Token]:
    """The tokens of ``text`` as ``plain`` reads it, each long list of constants read as one
    `ListToken` (see the module's text)."""
    found: list[Token] = []
    done = 0  # the text before this offset is in `found`
    search = 0
    while True:
        opening = _OPENING.search(text, search)
        if opening is None:
            break
        search = opening.end()
        body = _LISTS[text[search] == "'"].match(text, search)
        if body is None:
            continue
        closing = body.end() - 1  # the ")"
        try:
            head = _shifted(plain(text[done:search]), text, done)
        except TokenError:
            continue
        if (
            len(head) < 2
            or head[-2].token_type != TokenType.IN
            or head[-2].start != opening.start()
            or head[-1].token_type != TokenType.L_PAREN
            or head[-1].end != text.rfind("(", 0, search)
        ):
            continue  # the words "IN (" are in a string, a comment or a quoted name
        inside = text[search:closing]
        if text[search] == "'":
            node = ConstantList(
                constants=tuple(s.replace("''", "'") for s in _STRINGS.findall(inside)),
                is_string=True,
            )
        else:
            node = ConstantList(
                constants=tuple(c.strip() for c in inside.split(",")), is_string=False
            )
        first = _FIRST[node.is_string].match(text, search)
        end = t.cast(re.Match[str], first).end() - 1
        found += head
        found.append(ListToken(node, *offset_position(text, end), search, end))
        done = search = closing
    found += _shifted(plain(text[done:]), text, done) if done else plain(text)
    return found


def _shifted(tokens: list[Token], text: str, offset: int) -> list[Token]:
    """Tokens of ``text[offset:]``, placed where they stand in ``text``."""
    if not offset:
        return tokens
    line, column = offset_position(text, offset)
    for token in tokens:
        if token.line == 1:
            token.col += column - 1
        token.line += line - 1
        token.start += offset
        token.end += offset
    return tokens
