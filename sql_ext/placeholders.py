"""PostgreSQL's ``$n`` parameters and the session engine's ``%s`` ones (psycopg's, as the DB-API
takes them): a statement a client prepared with ``$1 ... $n`` becomes the text the engine
plans (``%s`` per mark in textual order, every literal ``%`` doubled), and the engine's text for
the backend becomes ``$n`` text again.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from psycopg._queries import _split_query  # psycopg's reading of % marks (no public one)
from sqlglot.tokens import TokenType

from sql_ext.errors import ProgrammingError
from sql_ext.statements import DIALECT


@dataclass(frozen=True)
class Converted:
    """``sql``: the engine's text; ``order``: the parameter number (0-based) of each ``%s``."""

    sql: str
    order: tuple[int, ...]

    def params(self, values: list[object]) -> list[object]:
        """The engine's parameters, in the order of its marks."""
        return [values[n] for n in self.order]


@functools.lru_cache(maxsize=512)
def to_engine(sql: str) -> Converted:
    """``$n`` marks (outside strings, quoted names, comments and dollar quotes) as ``%s``."""
    try:
        tokens = list(DIALECT.tokenize(sql))
    except Exception as exc:
        raise ProgrammingError(f"cannot read the statement's parameters: {exc}") from None
    pieces: list[str] = []
    order: list[int] = []
    last = 0
    for i, token in enumerate(tokens[:-1]):
        if token.token_type != TokenType.PARAMETER or token.text != "$":
            continue
        number = tokens[i + 1]
        if (
            number.token_type != TokenType.NUMBER
            or number.start != token.end + 1
            or not number.text.isdigit()
        ):
            continue
        pieces.append(sql[last : token.start].replace("%", "%%"))
        pieces.append("%s")
        order.append(int(number.text) - 1)
        last = number.end + 1
    pieces.append(sql[last:].replace("%", "%%"))
    if any(n < 0 for n in order):
        raise ProgrammingError("there is no parameter $0")
    return Converted("".join(pieces), tuple(order))


def to_backend(engine_sql: str, order: tuple[int, ...]) -> str:
    """The engine's ``%s`` text (a query's clauses cut out) as ``$n`` text for the backend."""
    parts = _split_query(engine_sql.encode(), "utf-8")
    out: list[bytes] = []
    for mark, part in enumerate(parts[:-1]):  # psycopg's last part: the text after the last mark
        out.append(part.pre)
        out.append(f"${order[mark] + 1}".encode())
    out.append(parts[-1].pre)
    return b"".join(out).decode()
