"""Tests of cache.server: the server over the wire, with real clients."""
