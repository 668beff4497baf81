"""Tests of heartbeat: the backend clock and the heartbeat."""
