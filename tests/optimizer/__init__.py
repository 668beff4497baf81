"""Tests of optimizer: PostgreSQL's semantics, analysis, the rules and plans."""
