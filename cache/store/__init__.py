"""The cache file: cached views, control tables and metadata in DuckDB
(`cache_file.CacheStore`, a `handle.FileHandle` with the file's `shadow_catalog` and its cache
schema, `schema_store`), the region state the guards read (`region_state`), and the status
document (`status`)."""
