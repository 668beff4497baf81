"""The optimizer (§4, §5), pure: no I/O, what it needs from the backend and the cache file is
passed in. Its subpackages show the design, each importing only those before it:
`postgres` (what PostgreSQL computes and how DuckDB is made to compute the same: types, the
allowlist, the type inference and the rewrites), `analysis` (a statement's analysis, once per
shape: its normalized C&C constraint, table accesses and remote leaves), `plan` (the frozen
`plan.Plan`), `rules` (the planner's rules - `place_guards` with `match_views`,
`estimate_cost` - the DuckDB statement of a decision (`local_statement`), the run-time
SwitchUnion decision (`evaluate_guards`, with `derive_consistency`'s §5.2 rules) and the
eviction policy), `derived` (derived cached views: what they store, their incremental
maintenance, matching and answering a query from them), and on top `planner` and
`describe_result`. docs/query-processing.md maps sections to modules."""
