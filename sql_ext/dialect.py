"""The ``mtcache`` sqlglot dialect: PostgreSQL plus the currency clause, TIMEORDERED brackets and
the cache DDL; its plain-PostgreSQL printer and the DuckDB the cache prints local statements in.

Extensions hook into sqlglot by subclassing (STYLE 3): the parser (`MTCacheParser`) stacks the
grammars of `sql_ext.grammar`; the generators print the extended dialect back, or leave it out.
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.dialects.postgres import Postgres
from sqlglot.generator import Generator
from sqlglot.generators.duckdb import DuckDBGenerator
from sqlglot.generators.postgres import PostgresGenerator
from sqlglot.tokens import Token

from sql_ext.errors import allow_deep_statements
from sql_ext.grammar.cache_ddl import CacheDDLParser
from sql_ext.grammar.commands import CommandParser
from sql_ext.grammar.tokenizer import MTCacheTokenizer
from sql_ext.nodes import (
    ConstantList,
    CurrencyClause,
    CurrencySpec,
    Duration,
    ExplainStatement,
    SessionBound,
    Timeline,
)

# statements nested ~1,000 levels deep parse (sqlglot recurses per level): set where parsing is
allow_deep_statements()


class MTCacheParser(CommandParser, CacheDDLParser):
    """PostgreSQL's parser with mtcache's extensions: the cache's own statements and its DDL,
    over the currency clause and the base of `sql_ext.grammar`."""


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
