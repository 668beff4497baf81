"""PostgreSQL's frontend/backend protocol, version 3, without I/O: its messages (`protocol`),
values in its text and binary formats (`values`) and its built-in type OIDs (`oids`). The
server reads clients' messages and writes answers with it; the engine's backend link relays
what PostgreSQL sends with it."""
