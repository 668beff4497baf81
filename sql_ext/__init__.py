"""mtcache's SQL extensions: the currency clause, TIMEORDERED brackets and the cache DDL.

>>> from sql_ext import parse_one
>>> q = parse_one("SELECT * FROM books b CURRENCY BOUND 10 MIN ON (b)")
>>> q.clauses[0].specs[0].bound_seconds
600.0
>>> q.to_sql("duckdb")
'SELECT * FROM books AS b'
"""

from sql_ext.blocks import Block, BlockAnalysis, Source, analyze
from sql_ext.ddl import (
    Completeness,
    Consistency,
    ControlColumn,
    CreateCachedView,
    CreateControlTable,
    Derivation,
    DerivedOutput,
    DerivedSource,
    DropCacheObject,
    Presence,
)
from sql_ext.dialect import MTCache
from sql_ext.errors import allow_deep_statements
from sql_ext.parsing import parse, parse_duration, parse_one
from sql_ext.statements import (
    BlockClause,
    CacheSetting,
    Inspect,
    Query,
    RefreshCachedView,
    SessionBound,
    Spec,
    Statement,
    Timeline,
    is_empty,
)

allow_deep_statements()

__all__ = [
    "Block",
    "BlockAnalysis",
    "BlockClause",
    "CacheSetting",
    "Completeness",
    "Consistency",
    "ControlColumn",
    "CreateCachedView",
    "CreateControlTable",
    "Derivation",
    "DerivedOutput",
    "DerivedSource",
    "DropCacheObject",
    "Inspect",
    "MTCache",
    "Presence",
    "Query",
    "RefreshCachedView",
    "SessionBound",
    "Source",
    "Spec",
    "Statement",
    "Timeline",
    "analyze",
    "is_empty",
    "parse",
    "parse_duration",
    "parse_one",
]
