"""The cache schema in the cache file (`SchemaStore`): the control tables and cached views, kept
as their DDL texts in ``mtcache.objects`` and parsed once per schema version, and the DuckDB
tables a DDL script's actions create and drop."""

from __future__ import annotations

import typing as t

import duckdb
from sqlglot import exp

from cache.store.budget import copy_tables, pulled_copies
from cache.store.handle import FileHandle
from control_tables.schema import CachedView, CacheSchema, ControlTable, view_from_statement
from control_tables.types import duckdb_type
from optimizer.derived.delta import copies, copy_name, copy_table, tables_read
from optimizer.derived.states import layout
from sql_ext import CreateCachedView, CreateControlTable, parse
from sql_ext.catalog import Catalog
from sql_ext.errors import NotSupportedError, translate
from sql_ext.quoting import ident, idents

Action = tuple[str, str]  # ("create" | "drop" | "forget", name); forget: a copy's pull


class SchemaStore(FileHandle):
    """A handle's cache schema: loaded, and its tables made and dropped."""

    def load_schema(self) -> CacheSchema:
        """The cache schema, parsed from the DDL texts once per schema version."""
        shared = self._shared
        with shared.lock:
            version = shared.schema_version
            if shared.schema is not None and shared.schema[0] == version:
                return shared.schema[1]
        schema = self._parse_schema()
        with shared.lock:
            if shared.schema_version == version:
                shared.schema = (version, schema)
        return schema

    def control_table_names(self) -> t.AbstractSet[str]:
        return self.load_schema().control_tables.keys()

    def _parse_schema(self) -> CacheSchema:
        schema = CacheSchema()
        for kind, text, columns, key in self.con.execute(
            "SELECT kind, statement, columns, key FROM mtcache.objects ORDER BY seq"
        ).fetchall():
            statement = parse(text)[0]
            if kind == "control table":
                assert isinstance(statement, CreateControlTable)
                schema = schema.with_control_table(statement)
            else:
                assert isinstance(statement, CreateCachedView)
                view = view_from_statement(statement, tuple(columns), tuple(key))
                schema = schema.with_view(view)
        return schema

    def _execute_actions(
        self,
        actions: list[Action],
        schema: CacheSchema,
        catalog: Catalog,
        then: t.Callable[[duckdb.DuckDBPyConnection], None] | None,
    ) -> None:
        try:
            with self.transaction() as con:
                row = con.execute("SELECT coalesce(max(seq), 0) FROM mtcache.objects").fetchone()
                seq = int(row[0]) if row else 0
                for action, name in actions:
                    if action == "forget":  # (pulled anew with its readers)
                        con.execute("DELETE FROM mtcache.view_state WHERE view = ?", [name])
                        continue
                    if action == "drop":
                        con.execute(f"DROP TABLE IF EXISTS {ident(name)}")
                        con.execute("DELETE FROM mtcache.objects WHERE name = ?", [name])
                        con.execute("DELETE FROM mtcache.view_state WHERE view = ?", [name])
                        continue
                    seq += 1
                    if name in schema.control_tables:
                        self._create_control_table(schema.control_tables[name], seq)
                    else:
                        self._create_view(schema, schema.views[name], catalog, seq)
                self._keep_copies(schema, catalog)
                if then is not None:
                    then(con)
        except duckdb.Error as exc:
            raise translate(exc, "applying the cache schema (nothing was changed)") from exc

    def recreated_readers(
        self, before: CacheSchema, after: CacheSchema, catalog: Catalog, actions: list[Action]
    ) -> list[Action]:
        """``actions`` with, first, the readers of a copy that must be made again made again
        with it: a continuously maintained derived view kept as it was, reading a table whose
        copy must now hold columns it lacks, or is now held by another DuckDB table (its own,
        or a base view that holds all of the table: made, dropped, or made again); the copy
        is then pulled anew in one snapshot with all its readers, each as a view just created
        (`_keep_copies`; a copy held by another table has its last pull forgotten)."""
        touched = {name for _, name in actions}
        created = {name for action, name in actions if action == "create"}
        held = self._held_copies()
        wanted = copies(after.views.values(), catalog)
        wider = {
            table
            for table, copy in wanted.items()
            if copy.name in held and not set(copy.columns) <= set(held[copy.name])
        }
        try:
            previous = {t: c.name for t, c in copies(before.views.values(), catalog).items()}
        except NotSupportedError:  # (a view dropped that the backend's tables no longer fit)
            previous = {}
        moved = {
            table
            for table, copy in wanted.items()
            if (
                copy.name in after.views
                and (previous.get(table) != copy.name or copy.name in created)
            )
            or (copy.name not in after.views and copy.name not in held)
        }
        forgotten: list[Action] = [("forget", copy_name(t)) for t in sorted(moved)]
        wider |= moved
        again = [
            name
            for name in before.topological_order()
            if name in after.views
            and name not in touched
            and after.views[name].is_derived
            and after.views[name].continuous
            and wider & tables_read(after.views[name])
        ]
        partial = [n for n in again if not after.views[n].view_level]
        if partial:  # (its groups would be listed present with none held until a pull)
            raise NotSupportedError(
                f"cached view {partial[0]} keeps groups under PRESENCE and reads a table "
                f"({', '.join(sorted(wider & tables_read(after.views[partial[0]])))}) whose "
                "copy must now hold more columns, which pulls it anew with every view reading "
                f"it; drop {partial[0]} and create it again in the same script"
            )
        return forgotten + [("drop", n) for n in again] + [("create", n) for n in again] + actions

    def _keep_copies(self, schema: CacheSchema, catalog: Catalog) -> None:
        """The copies of tables the continuously maintained derived views read
        (`optimizer.derived.delta.copies`) made to hold what those of ``schema`` read: one
        no view reads any more dropped, a new one made (it is pulled with its readers, see
        `cache.maintenance.pull`), one whose readers read fewer columns narrowed, one they
        read more of made again (`recreated_readers` made them again with it)."""
        wanted = copies(schema.views.values(), catalog)
        held = self._held_copies()
        for name, columns in held.items():
            table = copy_table(name)
            copy = wanted.get(table or "")
            if copy is not None and copy.name == name and set(copy.columns) <= set(columns):
                for column in columns:
                    if column not in copy.columns:
                        self.con.execute(f"ALTER TABLE {ident(name)} DROP COLUMN {ident(column)}")
                continue
            self.con.execute(f"DROP TABLE {ident(name)}")
            self.con.execute("DELETE FROM mtcache.view_state WHERE view = ?", [name])
            held[name] = []
        for copy in wanted.values():  # (a base view holding its table's copy: made above)
            if copy.name not in schema.views and not held.get(copy.name):
                self._create_keyed(copy, catalog)
        # (the pulls of copies no view reads any more, held by base views, forgotten too)
        for name in pulled_copies(self.con).keys() - {copy_name(table) for table in wanted}:
            self.con.execute("DELETE FROM mtcache.view_state WHERE view = ?", [name])

    def _copies_held_by_base_views(self, catalog: Catalog) -> None:
        """Format 3 (a file of format 2 opened): a base view that holds all of a table is
        the table's copy (`optimizer.derived.delta.copies`), so the copy kept beside it is
        dropped. Its pull stays when the view is at the stream's position as the copy is
        (both pulled, neither pending); else it is forgotten with its readers' pulls, and
        they wait, answered by the backend, for a pull that brings them all (`mtcache
        refresh` of any of them)."""
        schema = self._parse_schema()
        held = set(copy_tables(self.con))
        try:
            wanted = copies(schema.views.values(), catalog)
        except NotSupportedError:  # (the backend changed under a view: which table holds
            # which copy cannot be told, so every copy's pull is forgotten with its readers')
            for name in pulled_copies(self.con):
                self.con.execute("DELETE FROM mtcache.view_state WHERE view = ?", [name])
            for reader in schema.views.values():
                if reader.is_derived and reader.continuous:
                    self.con.execute("DELETE FROM mtcache.view_state WHERE view = ?", [reader.name])
            return
        pulled = {v for (v,) in self.con.execute("SELECT view FROM mtcache.view_state").fetchall()}
        pending = {
            v for (v,) in self.con.execute("SELECT view FROM mtcache.stream_pulls").fetchall()
        }
        for table, copy in wanted.items():
            name = copy_name(table)
            if copy.name not in schema.views or name not in held:
                continue
            self.con.execute(f"DROP TABLE {ident(name)}")
            if {copy.name, name} <= pulled and not {copy.name, name} & pending:
                continue
            readers = [
                v.name
                for v in schema.views.values()
                if v.is_derived and v.continuous and table in tables_read(v)
            ]
            for view in [name, *readers]:
                self.con.execute("DELETE FROM mtcache.view_state WHERE view = ?", [view])

    def _create_keyed(self, view: CachedView, catalog: Catalog) -> None:
        """The DuckDB table of a view of a table's rows (a base view, a copy), keyed."""
        table = catalog.table(view.table)
        assert table is not None
        types = {c.name: c.type for c in table.columns}
        columns = [f"{ident(c)} {duckdb_type(types[c])}" for c in view.columns]
        self.con.execute(
            f"CREATE TABLE {ident(view.name)} ({', '.join(columns)}, "
            f"PRIMARY KEY ({idents(view.key)}))"
        )

    def _held_copies(self) -> dict[str, list[str]]:
        """The copies of tables in the file, each with its columns."""
        held: dict[str, list[str]] = {name: [] for name in copy_tables(self.con)}
        for name, column in self.con.execute(
            "SELECT table_name, column_name FROM duckdb_columns() WHERE schema_name = 'main' "
            "ORDER BY table_name, column_index"
        ).fetchall():
            if name in held:
                held[name].append(column)
        return held

    def _create_control_table(self, control: ControlTable, seq: int) -> None:
        columns = [
            f"{ident(name)} {exp.DataType.build(type_, dialect='postgres').sql(dialect='duckdb')}"
            for name, type_ in control.columns
        ]
        self.con.execute(
            f"CREATE TABLE {ident(control.name)} ({', '.join(columns)}, "
            f"refreshed_at TIMESTAMPTZ, snapshot_id BIGINT, "
            f"PRIMARY KEY ({idents(control.column_names)}))"
        )
        self.con.execute(
            "INSERT INTO mtcache.objects VALUES (?, ?, 'control table', ?, ?, NULL, NULL, NULL, "
            "NULL, now())",
            [seq, control.name, control.statement, list(control.column_names)],
        )

    def _create_view(
        self, schema: CacheSchema, view: CachedView, catalog: Catalog, seq: int
    ) -> None:
        if view.is_derived:  # (its stored columns, and no primary key: a group may be NULL)
            stored = layout(view, catalog).columns
            columns = [f"{ident(c.name)} {c.duckdb_type}" for c in stored]
            self.con.execute(f"CREATE TABLE {ident(view.name)} ({', '.join(columns)})")
        else:
            self._create_keyed(view, catalog)
        self.con.execute(
            "INSERT INTO mtcache.objects VALUES (?, ?, 'cached view', ?, ?, ?, ?, ?, ?, now())",
            [
                seq,
                view.name,
                view.statement,
                list(view.columns),
                list(view.key),
                view.color,
                "view" if view.view_level else "group",
                [p.control for p in view.presence],
            ],
        )
