"""The DB-API 2.0 façade (re-exported by `cache`): `connection.Connection` and `cursor.Cursor`
over a session of the engine (`cache.engine`), and the PEP 249 type objects (`types`)."""
