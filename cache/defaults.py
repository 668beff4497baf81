"""Defaults every layer shares, in a module that imports nothing: where the cache file lives,
and the engines a refresh may run on. (The command line's help shows them without loading the
engine.)"""

from __future__ import annotations

DEFAULT_CACHE = ".mtcache/cache.duckdb"  # the cache's DuckDB file, relative to the directory
# the refresh engines (`cache.maintenance.pipeline.make_engine`): auto chooses by size
ENGINES = ("auto", "inline", "spark")
DEFAULT_ENGINE = "auto"
