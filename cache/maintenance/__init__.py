"""Pull maintenance (§3.4): admission, eviction and refresh by affected closure, in one
backend snapshot and one DuckDB transaction (`pipeline.Maintainer`: `pull`, `apply`, `evict`),
on a refresh engine behind one Protocol (`engines`: inline; `spark`), the scheduler
(`scheduler`) and named fault points for tests (`faults`)."""
