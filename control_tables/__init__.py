"""Control tables, regions, the cache DAG, safety rules and affected closure (SPEC §3, §4, §7)."""
