"""Tests of cache.dbapi and cache.sqla: the DB-API and SQLAlchemy."""
