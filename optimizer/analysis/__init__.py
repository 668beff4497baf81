"""A statement's analysis, made once per statement shape for every rule after it: its currency
clauses normalized into one C&C constraint (`normalize_constraint`, §4.3, §5.1), the
equivalence classes of its columns (`equivalences`), its table accesses with what DuckDB
needs to answer as PostgreSQL would (`analyze`), and each access's remote leaf (`leaves`)."""
