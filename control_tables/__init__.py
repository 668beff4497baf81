"""Control tables, regions, the cache DAG, safety rules and affected closure."""
