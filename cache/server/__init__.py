"""`mtcache serve`: the cache as a PostgreSQL-compatible server (protocol version 3), a second
façade over the session engine (`cache.engine`) beside the DB-API."""
