"""The optimizer (§4, §5), pure: a statement's analysis (`analyze`), the planner and its rules
(`planner`: `place_guards` with `match_views`, `estimate_cost`), the frozen `plan.Plan`, the
DuckDB statement of a decision (`local_statement`), and the run-time SwitchUnion decision
(`evaluate_guards`, with `derive_consistency`'s §5.2 rules). No I/O: what it needs from the
backend and the cache file is passed in. docs/query-processing.md maps sections to modules."""
