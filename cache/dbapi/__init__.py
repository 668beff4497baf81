"""The DB-API 2.0 façade (re-exported by `cache`): `connection.Connection`, `cursor.Cursor`, the
pure statement router (`route`), the session state the guards see (`session`), background
admissions (`admission`), the administration API (`admin`) and the PEP 249 type objects
(`types`)."""
