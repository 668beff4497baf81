"""Tests of cache.wire: the protocol codec, its state and values."""
