"""mtcache's SQL extensions: the currency clause, TIMEORDERED brackets and the cache DDL.

>>> from sql_ext import parse_one
>>> q = parse_one("SELECT * FROM books b CURRENCY BOUND 10 MIN ON (b)")
>>> q.clauses[0].specs[0].bound_seconds
600.0
>>> q.to_sql("duckdb")
'SELECT * FROM books AS b'
"""

import typing as _t

if _t.TYPE_CHECKING:
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

# Imported when first used (PEP 562): `sql_ext.errors` and the like, which every layer imports,
# do not load sqlglot, and the command line's --help stays quick.
_LAZY = {
    "Block": "sql_ext.blocks",
    "BlockAnalysis": "sql_ext.blocks",
    "Source": "sql_ext.blocks",
    "analyze": "sql_ext.blocks",
    "Completeness": "sql_ext.ddl",
    "Consistency": "sql_ext.ddl",
    "ControlColumn": "sql_ext.ddl",
    "CreateCachedView": "sql_ext.ddl",
    "CreateControlTable": "sql_ext.ddl",
    "Derivation": "sql_ext.ddl",
    "DerivedOutput": "sql_ext.ddl",
    "DerivedSource": "sql_ext.ddl",
    "DropCacheObject": "sql_ext.ddl",
    "Presence": "sql_ext.ddl",
    "MTCache": "sql_ext.dialect",
    "parse": "sql_ext.parsing",
    "parse_duration": "sql_ext.parsing",
    "parse_one": "sql_ext.parsing",
    "BlockClause": "sql_ext.statements",
    "CacheSetting": "sql_ext.statements",
    "Inspect": "sql_ext.statements",
    "Query": "sql_ext.statements",
    "RefreshCachedView": "sql_ext.statements",
    "SessionBound": "sql_ext.statements",
    "Spec": "sql_ext.statements",
    "Statement": "sql_ext.statements",
    "Timeline": "sql_ext.statements",
    "is_empty": "sql_ext.statements",
}


def __getattr__(name: str) -> _t.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sql_ext' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # (asked once)
    return value


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
