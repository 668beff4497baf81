"""The shadow catalog in the cache file (`CatalogStore`): the backend's tables, columns, keys,
indexes, statistics, views and text settings as last reflected, kept in ``mtcache.backend_*``
so planning needs no backend."""

from __future__ import annotations

import datetime as dt

from cache.store.handle import FileHandle
from sql_ext.catalog import Catalog, Column, Index, Table, View


class CatalogStore(FileHandle):
    """A handle's shadow catalog: saved, checked and loaded."""

    def save_catalog(self, catalog: Catalog) -> None:
        now = dt.datetime.now(dt.UTC)
        with self.transaction() as con:
            for internal in (
                "backend_tables",
                "backend_columns",
                "backend_unique_keys",
                "backend_indexes",
                "backend_views",
            ):
                con.execute(f"DELETE FROM mtcache.{internal}")
            for table in catalog.tables.values():
                con.execute(
                    "INSERT INTO mtcache.backend_tables (name, schema, row_count, pages, "
                    "primary_key, reflected_at, oid) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        table.name,
                        table.schema,
                        table.row_count,
                        table.pages,
                        list(table.primary_key),
                        now,
                        table.oid,
                    ],
                )
                con.executemany(
                    "INSERT INTO mtcache.backend_columns (table_name, position, name, type, "
                    "nullable, n_distinct, byte_order, deterministic, type_oid, type_modifier, "
                    "number) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        [
                            table.name,
                            i,
                            c.name,
                            c.type,
                            c.nullable,
                            c.n_distinct,
                            c.byte_order,
                            c.deterministic,
                            c.type_oid,
                            c.type_modifier,
                            c.number,
                        ]
                        for i, c in enumerate(table.columns)
                    ],
                )
                for key in table.unique_keys:
                    con.execute(
                        "INSERT INTO mtcache.backend_unique_keys VALUES (?, ?)",
                        [table.name, list(key)],
                    )
                for index in table.indexes:
                    con.execute(
                        "INSERT INTO mtcache.backend_indexes VALUES (?, ?, ?, ?)",
                        [table.name, index.name, list(index.columns), index.unique],
                    )
            for view in catalog.views.values():
                con.execute(
                    "INSERT INTO mtcache.backend_views VALUES (?, ?, ?)",
                    [view.name, view.schema, view.definition],
                )
            for setting, on in (
                ("text_byte_order", catalog.text_byte_order),
                ("ascii_case", catalog.ascii_case),
                ("utf8", catalog.utf8),
            ):
                con.execute(
                    "INSERT OR REPLACE INTO mtcache.meta VALUES (?, ?)", [setting, str(on).lower()]
                )
            con.execute(
                "INSERT OR REPLACE INTO mtcache.meta VALUES ('unicode_case', ?)",
                [catalog.unicode_case],
            )
        with self._shared.lock:
            self._shared.catalog_version += 1

    def has_catalog(self) -> bool:
        row = self.con.execute("SELECT count(*) FROM mtcache.backend_tables").fetchone()
        return bool(row and row[0])

    def catalog_is_current(self) -> bool:
        """Whether the shadow catalog holds all it keeps now (one saved by an older version
        lacks the columns' type OIDs and numbers)."""
        row = self.con.execute(
            "SELECT count(*) FROM mtcache.backend_columns WHERE type_oid IS NULL"
        ).fetchone()
        return not (row and row[0])

    def load_catalog(self) -> Catalog:
        columns: dict[str, list[Column]] = {}
        for (
            table,
            name,
            type_,
            nullable,
            distinct,
            byte_order,
            deterministic,
            type_oid,
            modifier,
            number,
        ) in self.con.execute(
            "SELECT table_name, name, type, nullable, n_distinct, byte_order, deterministic, "
            "type_oid, type_modifier, number FROM mtcache.backend_columns "
            "ORDER BY table_name, position"
        ).fetchall():
            columns.setdefault(table, []).append(
                Column(
                    name,
                    type_,
                    nullable,
                    distinct,
                    byte_order,
                    deterministic is not False,
                    type_oid or 0,
                    -1 if modifier is None else modifier,
                    number or 0,
                )
            )
        unique: dict[str, list[tuple[str, ...]]] = {}
        for table, cols in self.con.execute(
            "SELECT table_name, columns FROM mtcache.backend_unique_keys"
        ).fetchall():
            unique.setdefault(table, []).append(tuple(cols))
        indexes: dict[str, list[Index]] = {}
        for table, name, cols, is_unique in self.con.execute(
            "SELECT table_name, name, columns, is_unique FROM mtcache.backend_indexes ORDER BY 1, 2"
        ).fetchall():
            indexes.setdefault(table, []).append(Index(name, tuple(cols), is_unique))
        tables = {
            name: Table(
                name=name,
                columns=tuple(columns.get(name, [])),
                primary_key=tuple(pk or ()),
                unique_keys=tuple(unique.get(name, [])),
                schema=schema,
                row_count=row_count or 0.0,
                pages=int(pages or 0),
                indexes=tuple(indexes.get(name, [])),
                oid=oid or 0,
            )
            for name, schema, row_count, pages, pk, oid in self.con.execute(
                "SELECT name, schema, row_count, pages, primary_key, oid "
                "FROM mtcache.backend_tables"
            ).fetchall()
        }
        views = {
            name: View(name, definition, schema)
            for name, schema, definition in self.con.execute(
                "SELECT name, schema, definition FROM mtcache.backend_views"
            ).fetchall()
        }
        meta = dict(
            self.con.execute(
                "SELECT key, value FROM mtcache.meta "
                "WHERE key IN ('text_byte_order', 'ascii_case', 'utf8', 'unicode_case')"
            ).fetchall()
        )
        # a catalog saved before the ctype was read: case mapping stays at the backend
        return Catalog(
            tables=tables,
            views=views,
            text_byte_order=meta.get("text_byte_order", "true") == "true",
            ascii_case=meta.get("ascii_case") == "true",
            utf8=meta.get("utf8") == "true",
            unicode_case=meta.get("unicode_case", ""),
        )
