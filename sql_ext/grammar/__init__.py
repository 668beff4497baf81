"""The mtcache dialect's parser, a grammar a module: `base` (where extension clauses begin,
long constant lists, positions), `currency` (§2 the currency clause), `cache_ddl` (§3 the cache
DDL), `commands` (the statements the cache reads itself: TIMEORDERED brackets, its session
commands, EXPLAIN) and `tokenizer`. `sql_ext.dialect` stacks them into `MTCacheParser`.
"""
