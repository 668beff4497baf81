"""PostgreSQL's semantics, as far as a local answer depends on them: its types (`types`), the
allowlist of what DuckDB may compute as PostgreSQL does (`allowlist`, by function family), the
type inference over a statement (`expression_types`), the rewrites that make DuckDB's answer
PostgreSQL's (`semantics`, with `numeric_scales` and `divisions`), PostgreSQL's numeric
division (`numeric`) and float output (`float_text`), and whether an answer depends only on
the data it reads (`volatility`). It knows nothing of plans, views or the cache."""
