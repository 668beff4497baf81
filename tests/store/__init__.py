"""Tests of cache.store: the cache file, its budget, bad input leaving it as it was."""
