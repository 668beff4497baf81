"""Reflect the backend's catalog (tables, columns, types, primary and unique keys, views) from
PostgreSQL's pg_catalog in three queries."""

from __future__ import annotations

import re
import typing as t

import duckdb
import psycopg

from sql_ext.catalog import Catalog, Column, Index, Table, View
from sql_ext.errors import BackendUnavailableError, InterfaceError, first_line, translate

# Relations visible on the search path, first schema wins (as an unqualified name resolves).
_RELATIONS = """
SELECT c.oid, c.relname, n.nspname, c.relkind,
       CASE WHEN c.relkind = 'v' THEN pg_get_viewdef(c.oid, true) END AS definition,
       greatest(c.reltuples, 0)::float8, c.relpages
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')
  AND n.nspname = ANY (current_schemas(false))
  AND NOT c.relispartition
ORDER BY array_position(current_schemas(false), n.nspname::text), c.relname
"""

# n_distinct < 0 is a fraction of the row count (PostgreSQL's convention).
_COLUMNS = """
SELECT a.attrelid, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       CASE WHEN s.n_distinct < 0 THEN -s.n_distinct * greatest(c.reltuples, 0)
            ELSE s.n_distinct END,
       CASE WHEN a.attcollation NOT IN (0, 100) THEN to_jsonb(co) END,
       a.atttypid::int8, a.atttypmod, a.attnum
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_collation co ON co.oid = a.attcollation
LEFT JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname
                    AND s.attname = a.attname AND NOT s.inherited
WHERE a.attrelid = ANY (%s) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum
"""

_INDEXES = """
SELECT i.indrelid, ic.relname, i.indisunique,
       array_agg(coalesce(a.attname, '(expression)') ORDER BY k.ord)
FROM pg_index i
JOIN pg_class ic ON ic.oid = i.indexrelid
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = ANY (%s)
GROUP BY i.indexrelid, i.indrelid, ic.relname, i.indisunique
ORDER BY i.indrelid, ic.relname
"""

# Primary keys and unique indexes over plain columns without a predicate.
_KEYS = """
SELECT i.indrelid, i.indisprimary,
       array_agg(a.attname ORDER BY k.ord) AS columns
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = ANY (%s) AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
GROUP BY i.indexrelid, i.indrelid, i.indisprimary
ORDER BY i.indrelid, NOT i.indisprimary, i.indexrelid
"""


def reflect_catalog(conn: psycopg.Connection) -> Catalog:  # type: ignore[type-arg]
    """Read the catalog through an open connection."""
    try:
        relations = conn.execute(_RELATIONS).fetchall()
        oids = [r[0] for r in relations]
        columns: dict[int, list[Column]] = {}
        for (
            oid,
            name,
            type_,
            notnull,
            distinct,
            collation,
            type_oid,
            modifier,
            number,
        ) in conn.execute(_COLUMNS, (oids,)).fetchall():
            columns.setdefault(oid, []).append(
                Column(
                    name,
                    type_,
                    nullable=not notnull,
                    n_distinct=distinct,
                    byte_order=None if collation is None else _byte_order(collation, "coll"),
                    deterministic=(collation or {}).get("collisdeterministic", True),
                    type_oid=type_oid,
                    type_modifier=modifier,
                    number=number,
                )
            )
        indexes: dict[int, list[Index]] = {}
        for oid, name, is_unique, cols in conn.execute(_INDEXES, (oids,)).fetchall():
            indexes.setdefault(oid, []).append(Index(name, tuple(cols), unique=is_unique))
        primary: dict[int, tuple[str, ...]] = {}
        unique: dict[int, list[tuple[str, ...]]] = {}
        for oid, is_primary, cols in conn.execute(_KEYS, (oids,)).fetchall():
            if is_primary:
                primary[oid] = tuple(cols)
            else:
                unique.setdefault(oid, []).append(tuple(cols))
    except psycopg.Error as exc:
        raise translate(exc, "reading the backend catalog") from exc

    tables: dict[str, Table] = {}
    views: dict[str, View] = {}
    for oid, name, schema, kind, definition, row_count, pages in relations:
        if name in tables or name in views:
            continue  # shadowed by an earlier schema on the search path
        if kind == "v":  # a materialized view stores rows: the cache treats it as a table
            views[name] = View(name=name, definition=definition or "", schema=schema)
        else:
            tables[name] = Table(
                name=name,
                columns=tuple(columns.get(oid, [])),
                primary_key=primary.get(oid, ()),
                unique_keys=tuple(unique.get(oid, [])),
                schema=schema,
                row_count=float(row_count),
                pages=int(pages),
                indexes=tuple(indexes.get(oid, [])),
                oid=int(oid),
            )
    database = _database(conn)
    row = conn.execute("SELECT current_setting('server_encoding')").fetchone()
    utf8 = row is not None and row[0] == "UTF8"
    ascii_case = _ascii_case(database)
    return Catalog(
        tables=tables,
        views=views,
        text_byte_order=_byte_order(database, "dat"),
        ascii_case=ascii_case,
        utf8=utf8,
        unicode_case="" if ascii_case or not utf8 else unicode_case(conn),
    )


def _database(conn: psycopg.Connection) -> dict[str, t.Any]:  # type: ignore[type-arg]
    """The current database's pg_database row, as JSON."""
    row = conn.execute(
        "SELECT to_jsonb(d) FROM pg_database d WHERE datname = current_database()"
    ).fetchone()
    return t.cast(dict[str, t.Any], row[0] if row else {})


# every character, once, with PostgreSQL's upper and lower of them under the database's ctype
_EVERY_CHARACTER = """
SELECT s, upper(s), lower(s)
FROM (SELECT string_agg(chr(c), '' ORDER BY c) AS s
      FROM generate_series(1, 1114111) AS c
      WHERE c NOT BETWEEN 55296 AND 57343) AS every_character"""


def unicode_case(conn: psycopg.Connection) -> str:  # type: ignore[type-arg]
    """How DuckDB's upper and lower stand to the database's under its (not C) ctype, proven
    over every character: "equal", "sharp_s" (equal but for PostgreSQL's upper keeping ß,
    which DuckDB's makes ẞ), or "" (case mapping stays at the backend). Both map one character
    at a time (libc's towupper / towlower, DuckDB's Unicode tables), so agreeing on each
    character is agreeing on every string."""
    try:
        row = conn.execute(_EVERY_CHARACTER).fetchone()
    except psycopg.Error:
        return ""  # (a server that cannot say: the backend keeps answering)
    if row is None:
        return ""
    every, upper, lower = row
    duck = duckdb.connect()
    try:
        found = duck.execute("SELECT upper($1), lower($1)", [every]).fetchone()
    finally:
        duck.close()
    if found is None or found[1] != lower or len(found[0]) != len(upper):
        return ""
    if found[0] == upper:
        return "equal"
    differs = {c for c, ours, theirs in zip(every, found[0], upper, strict=True) if ours != theirs}
    return "sharp_s" if differs == {"ß"} and upper[every.index("ß")] == "ß" else ""


def _ascii_case(database: dict[str, t.Any]) -> bool:
    """Does the database map case for ASCII letters only (LC_CTYPE C or POSIX, libc's or the
    builtin provider's C), as the cache's rewrites of upper, lower, ILIKE and ~* do?"""
    provider = database.get("datlocprovider", "c")
    if provider == "c":
        return database.get("datctype") in ("C", "POSIX")
    if provider == "b":
        return database.get("datlocale") == "C"
    return False


_BYTE_ORDER_LOCALES = ("C", "POSIX", "C.UTF-8", "C.utf8")


def _byte_order(info: dict[str, t.Any], prefix: str) -> bool:
    """Is a collation (a pg_database or pg_collation row, as JSON; ``prefix``: its column
    prefix) byte order, as DuckDB compares text: libc C/POSIX/C.UTF-8, or the builtin
    provider's C and C.UTF-8 (PostgreSQL 17; code point order is UTF-8 byte order)? ICU and
    other libc locales are not."""
    provider = info.get(f"{prefix}locprovider", info.get(f"{prefix}provider", "c"))
    if provider == "c":
        return info.get(f"{prefix}collate") in _BYTE_ORDER_LOCALES
    if provider == "b":
        return info.get(f"{prefix}locale") in _BYTE_ORDER_LOCALES
    return False


CONNECT_SECONDS = 10  # a backend connection's time to be made, unless the DSN says otherwise


def connect_backend(dsn: str, **kwargs: object) -> psycopg.Connection:  # type: ignore[type-arg]
    """Open a psycopg connection, turning a refusal into a clear `BackendUnavailableError`;
    within CONNECT_SECONDS unless the DSN or ``kwargs`` give a `connect_timeout` (a backend
    host that drops packets does not hold a session for minutes)."""
    if "connect_timeout" not in kwargs and "connect_timeout" not in dsn:
        kwargs["connect_timeout"] = CONNECT_SECONDS
    try:
        return psycopg.connect(dsn, **kwargs)  # type: ignore[arg-type]
    except psycopg.ProgrammingError as exc:  # libpq cannot read the connection string
        raise InterfaceError(
            f"the backend {redact(dsn)} is not a PostgreSQL connection string or URL "
            f"({first_line(exc)}); check --backend / MTCACHE_BACKEND, e.g. "
            "postgresql://user@host:5432/dbname"
        ) from None
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BackendUnavailableError(
            f"cannot reach the PostgreSQL backend at {redact(dsn)}: {first} "
            "(check --backend / MTCACHE_BACKEND, or omit it to use the embedded default)"
        ) from exc


# libpq's connection keywords a client's startup parameters may carry; any other parameter is a
# setting (DateStyle, TimeZone, search_path), passed in ``options``
_LIBPQ_KEYWORDS = frozenset({"user", "application_name", "client_encoding", "options"})


def connection_parameters(parameters: t.Mapping[str, str]) -> dict[str, str]:
    """psycopg.connect keywords for a backend session with a client's startup parameters."""
    found: dict[str, str] = {}
    settings = []
    for name, value in parameters.items():
        if name in _LIBPQ_KEYWORDS:
            found[name] = value
        else:
            escaped = value.replace("\\", "\\\\").replace(" ", "\\ ")
            settings.append(f"-c {name}={escaped}")
    if settings:
        found["options"] = " ".join([found.get("options", ""), *settings]).strip()
    return found


def existing_relations(conn: psycopg.Connection, names: t.Sequence[str]) -> dict[str, bool]:  # type: ignore[type-arg]
    """Which relation names (as SQL writes them) a backend session resolves, as a statement of
    it would (its search path with pg_catalog, its temporary tables, schema-qualified names),
    each with whether it is a system relation (made by initdb, never changed by DDL)."""
    rows = _session_rows(
        conn,
        "SELECT n, to_regclass(n)::oid < 16384 FROM unnest(%s::text[]) "
        "AS n WHERE to_regclass(n) IS NOT NULL",
        [list(names)],
    )
    return {name: system for name, system in rows}


def temporary_relations(conn: psycopg.Connection) -> set[str]:  # type: ignore[type-arg]
    """The names of a backend session's temporary tables (they come first on its search
    path, before any table of that name)."""
    rows = _session_rows(
        conn, "SELECT relname FROM pg_class WHERE relnamespace = pg_my_temp_schema()"
    )
    return {row[0] for row in rows}


def _session_rows(
    conn: psycopg.Connection,
    sql: str,
    params: t.Any = None,  # type: ignore[type-arg]
) -> list[tuple[t.Any, ...]]:
    """A catalog question on a statement's own backend session, its errors the DB-API's."""
    try:
        return conn.execute(sql, params).fetchall()
    except psycopg.Error as exc:
        raise translate(
            exc, unreachable="the statement needs it: reconnect when it is back"
        ) from exc


def fetch_catalog(dsn: str) -> Catalog:
    with connect_backend(dsn, autocommit=True) as conn:
        return reflect_catalog(conn)


def database_of(dsn: str) -> str | None:
    """The database a DSN names (None: none, or not a DSN libpq reads)."""
    try:
        return psycopg.conninfo.conninfo_to_dict(dsn).get("dbname")  # type: ignore[return-value]
    except psycopg.ProgrammingError:
        return None


def redact(dsn: str) -> str:
    """A DSN fit for messages: no password (host:port/db; a string libpq cannot read, quoted
    with anything that looks like a password masked)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        text = re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", dsn, flags=re.IGNORECASE)
        return repr(re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", text))
    info.pop("password", None)
    host = info.get("host", "localhost")
    port = info.get("port", "5432")
    db = info.get("dbname", "")
    return f"{host}:{port}/{db}"
