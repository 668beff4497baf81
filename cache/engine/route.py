"""What a statement sent through ``cursor.execute`` does, decided once by a pure function
(`route`) from its parse: a typed `Route` the cursor dispatches on.

* `CachedRead`: a query with currency clauses, planned and guarded;
* `Explain`: EXPLAIN of such a query, answered with the cache's plan;
* `Passthrough`: plain SQL for the backend, verbatim when it uses no extension;
* `Write`: INSERT / UPDATE / DELETE / MERGE (and commands sqlglot does not model) on backend
  tables, which the session's later reads must see (§5.8);
* `ControlEdit`: INSERT INTO / DELETE FROM a control table admits / evicts control keys;
* `CacheDdl`: CREATE / DROP of control tables and cached views;
* `TimelineBracket`: BEGIN / END TIMEORDERED (§2.3);
* `SessionSetting`: SET / RESET / SHOW of the cache's session settings (``mtcache.name``;
  CURRENCY BOUND is ``mtcache.currency_bound``);
* `Inspection`: EXPLAIN LAST STATEMENT, SHOW CACHED VIEWS, SHOW CACHE STATUS, SHOW CACHE STATS;
* `Refresh`: REFRESH CACHED VIEW(S).

With a session currency bound every query is read as carrying clauses, so a plain query takes
the cache's path too.
"""

from __future__ import annotations

import functools
import threading
import typing as t
from collections import OrderedDict
from collections.abc import Callable, Set
from dataclasses import dataclass

import psycopg
from psycopg._queries import _split_query  # psycopg's reading of % marks (no public one)
from sqlglot import exp

from cache.engine.link.effects import BackendEffects, effects_of
from cache.execution.provenance import Executed
from sql_ext import (
    CacheSetting,
    Inspect,
    Query,
    RefreshCachedView,
    SessionBound,
    Statement,
    Timeline,
    parse_one,
)
from sql_ext.errors import NotSupportedError, ProgrammingError, SqlSyntaxError
from sql_ext.quoting import folded
from sql_ext.statements import DIALECT, Inspected

_EXTENSION_WORDS = {"CURRENCY", "TIMEORDERED", "CACHED", "CONTROL", "EXPLAIN"}
# First words of statements that change no table: any other statement the parser cannot read
# counts as a write to every table (read your writes must hold; stricter is safe). EXPLAIN is
# not among them (EXPLAIN ANALYZE runs its statement), nor EXECUTE (a prepared write).
_READ_ONLY_WORDS = frozenset(
    {
        "SELECT",
        "VALUES",
        "TABLE",
        "SHOW",
        "SET",
        "RESET",
        "BEGIN",
        "START",
        "COMMIT",
        "END",
        "ROLLBACK",
        "ABORT",
        "SAVEPOINT",
        "RELEASE",
        "FETCH",
        "MOVE",
        "CLOSE",
        "LISTEN",
        "UNLISTEN",
        "NOTIFY",
        "DISCARD",
        "DEALLOCATE",
    }
)
_WRITES = (exp.Insert, exp.Update, exp.Delete, exp.Merge)


@dataclass(frozen=True)
class CachedRead:
    query: Query


@dataclass(frozen=True)
class Explain:
    query: Query  # the explained query (its EXPLAIN stripped)
    json: bool = False  # EXPLAIN (FORMAT JSON): the plan's document in one row


class _ToBackend:
    """What a statement sent to the backend as written may do there, read off its text."""

    sql: str

    @functools.cached_property
    def executed(self) -> Executed:
        return Executed(self.sql)

    @property
    def effects(self) -> BackendEffects:
        return effects_of(self.sql)


@dataclass(frozen=True)
class Passthrough(_ToBackend):
    sql: str
    reads: Query | None = None  # a plain query: its tables are named in the provenance
    changes_catalog: bool = False  # backend DDL: the shadow catalog must be read again


@dataclass(frozen=True)
class Write(_ToBackend):
    sql: str
    tables: frozenset[str] | None  # None: the parser could not name them (counts as all)
    changes_catalog: bool = False


@dataclass(frozen=True)
class ControlEdit:
    query: Query
    control: str
    kind: t.Literal["insert", "delete"]


@dataclass(frozen=True)
class CacheDdl:
    statement: Statement


@dataclass(frozen=True)
class TimelineBracket:
    begin: bool


@dataclass(frozen=True)
class SessionSetting:
    """SET / RESET / SHOW of a cache session setting (`cache.engine.settings`)."""

    action: t.Literal["set", "reset", "show"]
    name: str  # its full name: mtcache.currency_bound
    value: str | float | None = None  # SET's (None: the session's default)
    column: str = ""  # SHOW's column name (the name as written)


@dataclass(frozen=True)
class Inspection:
    what: Inspected
    views: tuple[str, ...] = ()  # the status lists these views' regions, however many


@dataclass(frozen=True)
class Refresh:
    view: str | None  # None: every white view
    keys: tuple[tuple[str, ...], ...] | None


Route = (
    CachedRead
    | Explain
    | Passthrough
    | Write
    | ControlEdit
    | CacheDdl
    | TimelineBracket
    | SessionSetting
    | Inspection
    | Refresh
)


def route(
    statement: Statement | None,
    operation: str,
    control_tables: Set[str],
    session_bound: bool = False,
) -> Route:
    """The route of a statement (None: text the parser cannot read that uses no extension:
    the backend judges it, verbatim); ``session_bound``: the session has a currency bound."""
    if statement is None:
        tokens = _tokens(operation)
        if tokens and tokens[0].text.upper() in _READ_ONLY_WORDS:
            return Passthrough(operation)
        return Write(operation, None)
    if isinstance(statement, Timeline):
        return TimelineBracket(statement.begin)
    if isinstance(statement, SessionBound):
        return SessionSetting(
            statement.action, "mtcache.currency_bound", statement.bound_seconds, "currency_bound"
        )
    if isinstance(statement, CacheSetting):
        return SessionSetting(statement.action, statement.name, statement.value, statement.name)
    if isinstance(statement, Inspect):
        return Inspection(statement.what, statement.views)
    if isinstance(statement, RefreshCachedView):
        return Refresh(statement.view, statement.keys)
    if not isinstance(statement, Query):
        return CacheDdl(statement)
    tree = statement.tree
    extended = statement.has_currency_clause or statement.explain is not None
    if statement.is_select and statement.explain is None:  # reads: the hot path first
        if tree.find(*_WRITES) is not None:  # WITH d AS (DELETE ... RETURNING ...) SELECT
            return Write(statement.backend_sql if extended else operation, _written_tables(tree))
        if statement.has_currency_clause or session_bound:
            return CachedRead(statement)
        return Passthrough(operation, reads=statement)
    control = _control_target(tree, control_tables)
    if control is not None:
        return ControlEdit(statement, *control)
    if statement.explain is not None and statement.is_select:
        options = explain_options(statement.explain)
        if options.cache or statement.has_currency_clause or session_bound:
            return Explain(statement.without_explain(), options.json)
    # Only a statement using an extension is regenerated; plain SQL reaches PostgreSQL as
    # written (psycopg's %%, dollar quotes, casts untouched).
    sql = statement.backend_sql if extended else operation
    if isinstance(tree, _WRITES):
        return Write(sql, _written_tables(tree))
    if isinstance(tree, exp.Command):
        if str(tree.this).upper() in _READ_ONLY_WORDS:  # RESET TimeZone, SHOW ..., LISTEN
            return Passthrough(sql)
        return Write(sql, None, changes_catalog=True)
    return Passthrough(sql, changes_catalog=isinstance(tree, exp.Create | exp.Drop | exp.Alter))


class ExplainOptions(t.NamedTuple):
    cache: bool  # EXPLAIN (CACHE): the cache's plan, clauses or not
    json: bool  # FORMAT JSON


def explain_options(text: str) -> ExplainOptions:
    """EXPLAIN's options as written (``(CACHE, FORMAT JSON)``, ``ANALYZE``): the cache's own
    (CACHE) and the format. With CACHE, only FORMAT TEXT or JSON may come along: the rest
    (ANALYZE, BUFFERS, ...) are the backend's."""
    words = [w.strip().upper() for w in text.strip().strip("()").split(",") if w.strip()]
    cache = "CACHE" in words
    json = any(w.split()[:2] == ["FORMAT", "JSON"] for w in words)
    if cache:
        others = [w for w in words if w != "CACHE" and w.split()[:1] != ["FORMAT"]]
        if others:
            raise NotSupportedError(
                f"EXPLAIN (CACHE) shows the cache's plan, which has no "
                f"{others[0].split()[0]}: drop it, or drop CACHE to ask "
                "the backend"
            )
        if any(
            w.split()[:1] == ["FORMAT"] and w.split()[1:] not in (["TEXT"], ["JSON"]) for w in words
        ):
            raise NotSupportedError("EXPLAIN (CACHE) gives FORMAT TEXT or FORMAT JSON")
    return ExplainOptions(cache, json)


def _control_target(
    tree: exp.Expr, control_tables: Set[str]
) -> tuple[str, t.Literal["insert", "delete"]] | None:
    """(control table, "insert"|"delete") when the statement edits a control table."""
    kind: t.Literal["insert", "delete", "update"]
    if isinstance(tree, exp.Insert):
        table = tree.this.this if isinstance(tree.this, exp.Schema) else tree.this
        kind = "insert"
    elif isinstance(tree, exp.Delete):
        table, kind = tree.this, "delete"
    elif isinstance(tree, exp.Update):
        table, kind = tree.this, "update"
    else:
        return None
    if not isinstance(table, exp.Table) or table.db:
        return None
    name = folded(table)
    if name not in control_tables:
        return None
    if kind == "update":
        raise NotSupportedError(
            f"UPDATE on control table {name}: control keys are admitted with INSERT and "
            "evicted with DELETE"
        )
    return name, kind


def _written_tables(tree: exp.Expr) -> frozenset[str] | None:
    """The tables a statement writes (its own target and any data-modifying CTE's); None if
    one of them is not a plain table name."""
    tables = set()
    for write in tree.find_all(*_WRITES):
        target = write.this
        if isinstance(target, exp.Schema):
            target = target.this
        if not isinstance(target, exp.Table):
            return None
        tables.add(folded(target))
    return frozenset(tables)


# -- parsing, once per statement text -------------------------------------------------------------


def parse_statement(operation: str, with_params: bool = False) -> Statement | None:
    """The typed statement, or None for plain SQL the parser cannot read but the backend may:
    anything using an extension must parse. ``with_params``: it comes with parameters, so a
    ``%`` is read as psycopg reads it (``%%`` is one, a lone one an error)."""
    try:
        if with_params:
            _split_query(operation.encode(), "utf-8")  # psycopg's own check of the % marks
        return parse_one(operation, percent=with_params)
    except psycopg.ProgrammingError as exc:
        if _uses_extension(operation):
            raise ProgrammingError(f"{exc} (write %% for a literal %)") from None
        return None  # psycopg reports it, as it would without the cache
    except SqlSyntaxError:
        if _uses_extension(operation) or "\0" in operation:
            raise  # (a NUL byte: libpq would send the backend half of the statement)
        return None


def _uses_extension(operation: str) -> bool:
    return bool({tok.text.upper() for tok in _tokens(operation)} & _EXTENSION_WORDS)


def _tokens(operation: str) -> list[t.Any]:
    try:
        return list(DIALECT.tokenize(operation))
    except Exception:
        return []


class StatementCache:
    """Parses and routes by statement text, least recently used first out: the hot path pays
    one lookup. A route is made again when the cache schema has changed (its control tables
    decide what an INSERT or DELETE is). Shared by the sessions of an engine (thread-safe:
    parsing runs outside the lock; two sessions parsing one new text keep either parse)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._entries: OrderedDict[
            tuple[str, bool], tuple[Statement | None, Route | None, t.Any]
        ] = OrderedDict()
        self._lock = threading.Lock()

    def parse(self, operation: str, with_params: bool = False) -> Statement | None:
        return self._entry(operation, with_params)[0]

    def route(
        self,
        operation: str,
        schema_version: int,
        control_tables: Callable[[], Set[str]],
        session_bound: bool = False,
        with_params: bool = False,
    ) -> Route:
        """The route of a statement (``with_params``: executed with parameters, which change
        how psycopg reads its % marks)."""
        key = (operation, with_params)
        statement, routed, made_for = self._entry(operation, with_params)
        if routed is None or made_for != (schema_version, session_bound):
            routed = route(statement, operation, control_tables(), session_bound)
            with self._lock:
                self._entries[key] = (statement, routed, (schema_version, session_bound))
        return routed

    def _entry(
        self, operation: str, with_params: bool
    ) -> tuple[Statement | None, Route | None, t.Any]:
        entries = self._entries
        key = (operation, with_params)
        with self._lock:
            try:
                entries.move_to_end(key)
                return entries[key]
            except KeyError:
                pass
        entry = (parse_statement(operation, with_params), None, None)
        with self._lock:
            entries[key] = entry
            if len(entries) > self.size:
                entries.popitem(last=False)
        return entry
