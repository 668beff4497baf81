"""The cache file: cached views, control tables and metadata in DuckDB
(`cache_file.CacheStore`), the region state the guards read (`region_state`), and the status
document (`status`)."""
