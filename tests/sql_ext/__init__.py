"""Tests of sql_ext: the dialect, parsing and what a statement means."""
