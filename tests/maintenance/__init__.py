"""Tests of cache.maintenance: pulls, refreshes, the scheduler and the stream."""
