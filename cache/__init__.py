"""mtcache: a currency-and-consistency-aware mid-tier cache in front of PostgreSQL."""
