"""The optimizer's rules over a plan: view matching (`match_views`, §4.5), guard placement
(`place_guards`, §4.4, Fig 7.2), cost (`estimate_cost`, §4.6), the cache's own divisions
(`divide_outputs`), the DuckDB statement of a decision (`local_statement`), the run-time
SwitchUnion decision (`evaluate_guards`) with §5.2's consistency rules
(`derive_consistency`), and which regions leave under the size budget (`eviction_policy`,
by the cost model's worth)."""
