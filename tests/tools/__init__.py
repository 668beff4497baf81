"""Tests of cache.tools: the command line and its JSON documents."""
