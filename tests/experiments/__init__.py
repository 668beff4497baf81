"""Tests of experiments: the runs, the differential oracle, TPC-H, chaos and fuzzing."""
