"""Tests of cache.backend: the embedded PostgreSQL, pgoutput, values read from PostgreSQL."""
