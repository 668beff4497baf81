"""Tests of cache.engine and cache.execution: routing, the cached read, memos, inspection."""
