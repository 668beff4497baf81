"""The catalog the optimizer plans against: backend tables, columns, keys and views.

Pure values: reflected from PostgreSQL by `cache.backend.reflect`, later kept in the DuckDB
file's shadow catalog. Names are as PostgreSQL stores them (an unquoted name folded to lower
case, a quoted one as written: `sql_ext.quoting.folded`), unqualified (the first match on the
backend's search_path, as PostgreSQL resolves them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    nullable: bool = True
    n_distinct: float | None = None  # distinct values (estimated by the backend's ANALYZE)
    # A collation of its own (text types): does it order by bytes, as DuckDB does (None: the
    # database's default collation, `Catalog.text_byte_order`)? Is it deterministic (equal
    # only when byte-equal)?
    byte_order: bool | None = None
    deterministic: bool = True
    # what PostgreSQL's RowDescription gives a column read as it is: its type's OID and its
    # type modifier (atttypmod: char(n), varchar(n), numeric(p,s), ...), its number in its
    # table (attnum); 0 when not known (a catalog reflected before these were kept)
    type_oid: int = 0
    type_modifier: int = -1
    number: int = 0


@dataclass(frozen=True)
class Index:
    name: str
    columns: tuple[str, ...]
    unique: bool = False


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] = ()
    unique_keys: tuple[tuple[str, ...], ...] = ()
    schema: str = "public"
    row_count: float = 0.0  # the backend's estimate (pg_class.reltuples), 0 when unknown
    pages: int = 0  # heap pages (pg_class.relpages): partitions a full pull by block range
    indexes: tuple[Index, ...] = ()
    oid: int = 0  # pg_class.oid (0: not known)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def has_column(self, name: str) -> bool:
        return any(c.name == name for c in self.columns)

    def candidate_keys(self) -> tuple[tuple[str, ...], ...]:
        """Keys usable as functional dependencies K -> all columns.

        A UNIQUE key over nullable columns admits several rows with NULLs, so it determines
        nothing; only the primary key and all-NOT-NULL unique keys count (fewer FDs is always
        safe: §5.1, Theorem 6.2).
        """
        not_null = {c.name for c in self.columns if not c.nullable}
        keys = [self.primary_key] if self.primary_key else []
        keys += [k for k in self.unique_keys if k and set(k) <= not_null and k not in keys]
        return tuple(keys)


@dataclass(frozen=True)
class View:
    """A backend view: expanded into its base tables during normalization (§4.3)."""

    name: str
    definition: str
    schema: str = "public"


@dataclass(frozen=True)
class Catalog:
    tables: Mapping[str, Table] = field(default_factory=dict)
    views: Mapping[str, View] = field(default_factory=dict)
    # Does the backend order text by bytes (C/POSIX collation), as DuckDB does? If not, local
    # answers that order or range-compare text could differ from the backend's.
    text_byte_order: bool = True
    # Is the backend's LC_CTYPE C (upper, lower, ILIKE and ~* change ASCII letters only)? Case
    # mapping runs locally only then, where the cache knows what PostgreSQL does.
    ascii_case: bool = True
    utf8: bool = True  # the server's encoding is UTF8, as DuckDB's strings are
    # Under another ctype, how DuckDB's upper and lower stand to the database's, proven over
    # every character when the catalog is read (cache.backend.reflect): "equal", "sharp_s"
    # (equal but for PostgreSQL's upper keeping ß), or "" (case mapping stays at the backend)
    unicode_case: str = ""
    # Relations the backend has that the catalog does not describe (its system catalogs,
    # the session's temporary tables, tables of schemas off the search path), by the name a
    # statement gives them (`Source.written`): read from the backend as they are, never
    # cached. A temporary table shadows a table of the same name.
    outside: frozenset[str] = frozenset()

    def table(self, name: str, schema: str | None = None) -> Table | None:
        """The table of that name on the search path (of that schema, when one is given)."""
        table = self.tables.get(name)
        return table if table is not None and schema in (None, table.schema) else None

    def view(self, name: str, schema: str | None = None) -> View | None:
        view = self.views.get(name)
        return view if view is not None and schema in (None, view.schema) else None
