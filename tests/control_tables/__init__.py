"""Tests of control_tables: regions and affected closure."""
