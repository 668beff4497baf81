"""Optimizer rules: normalization of C&C constraints (and, later, view matching, guards, cost)."""
