"""Derived cached views (`control_tables.derived`): what the cache stores of one and how the
backend computes it (`states`), its incremental maintenance from the stream's changes
(`delta`), matching a whole query against it (`match`), and the planning rule that answers a
statement from it when that costs less (`answer`)."""
