"""The mtcache dialect's tokenizer: PostgreSQL's, with EXPLAIN an ordinary word and a long
list of constants one token (`sql_ext.long_lists`)."""

from __future__ import annotations

from sqlglot.dialects.postgres import Postgres
from sqlglot.tokens import Token

from sql_ext import long_lists


class MTCacheTokenizer(Postgres.Tokenizer):
    # EXPLAIN is a command to PostgreSQL's tokenizer (the rest of the statement becomes one
    # string); mtcache parses the explained statement, so EXPLAIN is an ordinary word here.
    KEYWORDS = {k: v for k, v in Postgres.Tokenizer.KEYWORDS.items() if k != "EXPLAIN"}

    def tokenize(self, sql: str) -> list[Token]:
        # a long list of constants is one token (`sql_ext.long_lists`)
        return long_lists.tokenize(sql, super().tokenize)
