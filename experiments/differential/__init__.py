"""A randomized differential oracle (issue 25), in the spirit of SQLancer and SQLsmith: seeded
random PostgreSQL SELECTs over the TPC-H schema (`generate`), each run through the cache and
directly on PostgreSQL and compared (`oracle`), with ternary-logic partitioning; a long run is
`mtcache experiment differential --queries N --seed S` (`run`)."""
