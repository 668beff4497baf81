"""Advice on what to cache (`SHOW CACHE ADVICE`, `mtcache advise`): the statement shapes the
backend answered (`cache.store.remote_reads`), each with its calls, backend time and why the
cache did not answer it, and the cache DDL that would, with what it would save and take.

Why a read went to the backend is told where it happened (`why_planned_remote`,
`why_guards_failed`), in one of the kinds of `REASONS`. The suggestion is worked out when the
advice is asked for, from the shape's text against the schema as it is then: each table the
statement reads that no cached view holds gets a view of the columns it reads, kept `REFRESH
AUTO` (its bounds then set its interval): the whole table when it fits the size budget's room,
else, when every read of it by the statement looks it up by key (equalities on columns), a
presence-controlled view of the keys read, under a new control table, that admissions on a miss
fill (the primary key when it is looked up whole, else the column looked up with the most
distinct values); a shape whose views' data was too old under a fixed interval gets its views
kept `REFRESH AUTO` instead, and one whose bound no refresh meets (too old under `REFRESH
AUTO`, whose pulls did not pay, or a bound below the refresh delay) `REFRESH CONTINUOUSLY`,
where the schema's rules allow it: the change stream keeps the view current; one whose regions
were not from one snapshot, `CONSISTENCY ON ALL`. A kind no DDL fixes (a function DuckDB cannot
compute as PostgreSQL, privileges, a presence miss that an admission fills) has none.
``saves_ms`` is the backend time the shape took per hour it has been seen (at least a minute),
which a local answer saves; ``bytes`` what the suggested views would hold, from the backend's
statistics (a presence-controlled view: the rows of as many keys as the shape was called, at
most all).

`apply_script` turns the suggestions into one script within the size budget: one view per
table (the union of the columns its suggestions read), the most saved per byte first.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
import typing as t
from collections.abc import Iterable
from dataclasses import dataclass

import psycopg

from cache.backend.pool import pooled
from cache.store.cache_file import CacheStore
from cache.store.remote_reads import REASONS
from control_tables.schema import CacheSchema
from control_tables.script import apply_script as check_script
from optimizer.analysis.analyze import analyze
from optimizer.plan import Plan
from optimizer.rules.evaluate_guards import Decision
from optimizer.rules.match_views import match_access
from sql_ext import CreateCachedView, CreateControlTable, DropCacheObject, Query, parse
from sql_ext.catalog import Catalog, Table
from sql_ext.errors import Error
from sql_ext.nodes import format_duration
from sql_ext.quoting import ident, idents

SUFFIX = "_cache"  # the name of a suggested view: its table's, and this
KEYS_SUFFIX = "_keys"  # the name of a suggested view's control table: its table's, and this
# the least bound REFRESH CONTINUOUSLY is suggested for: the change stream's lag is usually
# well under it, a refresh's delay often not
STREAM_BOUND = 1.0
PRIVILEGES = (
    "privileges: the session's role may not read the cached tables it reads (the backend "
    "decides what it may read; GRANT SELECT to let the cache answer it)"
)

# -- why the backend answered ---------------------------------------------------------------------


def why_planned_remote(plan: Plan) -> tuple[str, str]:
    """Why a plan chose the backend for the whole statement: (kind, message)."""
    analysis = plan.analysis
    message = plan.reason or REASONS["other"]
    if analysis.outside:  # (also a blocker: what it reads, before how)
        return "outside", message
    if analysis.local_blocker is not None:
        return "allowlist", message
    classes = "; ".join(c.remote_reason for c in plan.classes if c.remote_reason)
    if any(not a.guards for c in plan.classes for a in c.accesses):
        return "no view", classes or message
    if classes:
        return "bound below delay", classes  # (the one reason a class keeps its guards for)
    if plan.candidates:
        return "cheaper remote", message
    return "other", message


def why_guards_failed(plan: Plan, decision: Decision) -> tuple[str, str]:
    """Why a plan's guards sent the statement to the backend: (kind, message)."""
    misses = decision.misses
    if misses.presence:
        return "presence miss", (
            "presence miss: the keys it reads are not cached (admitted on a miss when "
            "admit_on_miss is on, or by mtcache admit)"
        )
    if misses.completeness:
        return "completeness miss", "completeness miss: a group it reads is not complete"
    if misses.consistency:
        return "consistency", "the regions it reads are not from one backend snapshot"
    if misses.timeline:
        return "timeline", "its session needs data newer than the cache holds"
    if misses.currency:
        return "bound not met", _not_met(plan.asks)
    return "other", REASONS["other"]


@functools.lru_cache(maxsize=1024)
def _not_met(asks: tuple[tuple[str, float, float], ...]) -> str:
    """The message of a bound not met (told once per plan's asks: every remote read of a
    stale view tells it)."""
    older = ", ".join(f"{view} older than {format_duration(bound)}" for view, bound, _ in asks)
    return f"bound not met: {older}"


# -- the advice -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Advice:
    """One row of `SHOW CACHE ADVICE` (`ADVICE_COLUMNS`)."""

    statement: str
    calls: int
    backend_ms: float
    reason: str
    suggestion: str | None
    saves_ms: float  # backend time saved per hour
    bytes: int | None

    def to_json(self) -> dict[str, t.Any]:
        return {
            "statement": self.statement,
            "calls": self.calls,
            "backend_ms": self.backend_ms,
            "reason": self.reason,
            "suggestion": self.suggestion,
            "saves_ms": self.saves_ms,
            "bytes": self.bytes,
        }


def advice(store: CacheStore, catalog: Catalog, now: float | None = None) -> list[Advice]:
    """The advice for the shapes the backend answered, the costliest first."""
    now = time.time() if now is None else now
    schema = store.load_schema()
    room = budget_room(store)
    found = []
    for shape in store.load_remote_reads().shapes():
        kind, message = shape.reason
        suggested = suggest(shape.statement, kind, schema, catalog, room, shape.calls)
        hours = max(now - shape.first_seen, 60.0) / 3600.0
        found.append(
            Advice(
                shape.statement,
                shape.calls,
                round(shape.backend_ms, 3),
                message if message.startswith(kind) else f"{kind}: {message}",
                suggested[0] if suggested else None,
                round(shape.backend_ms / hours, 3) if suggested else 0.0,
                suggested[1] if suggested else None,
            )
        )
    return sorted(found, key=lambda a: (-a.backend_ms, a.statement))


def budget_room(store: CacheStore) -> float:
    """The bytes the size budget leaves for more data (inf: there is no budget)."""
    limit = store.budget.limit
    if limit is None:
        return math.inf
    return max(limit - store.resources()["data_bytes"], 0)


# the statements the backend ran most, from pg_stat_statements (in this database, SELECTs)
BACKEND_STATEMENTS = """
SELECT s.query, s.calls, s.total_exec_time FROM pg_stat_statements s
JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = current_database() AND s.query ~* '^\\s*(select|with)\\s'
ORDER BY s.total_exec_time DESC LIMIT 200
"""
NO_BOUND = (
    "no bound: the backend ran it {calls} times without the cache planning it (pg_stat_statements: "
    "no currency bound, so only the backend's current data answers it); give it a CURRENCY "
    "BOUND, or its session a bound, to let a cached view answer it"
)


def backend_statements(dsn: str, catalog: Catalog, seen: Iterable[Advice]) -> list[Advice]:
    """What pg_stat_statements counted on the backend that the cache did not: reads of cached-
    able tables with no currency bound, which reached the backend as written. None when the
    extension is not there (not loaded, not created in the database, not readable)."""
    try:
        with pooled(dsn) as conn:
            rows = conn.execute(BACKEND_STATEMENTS).fetchall()
    except psycopg.Error:
        return []
    ours = {_plain(a.statement, True) for a in seen}
    found = []
    for text, calls, ms in rows:
        plain = _plain(text, False)
        if plain is None or plain in ours:
            continue
        [query] = parse(text)
        assert isinstance(query, Query)
        try:
            analysis = analyze(query, catalog)
        except Error:
            continue
        if not analysis.accesses or analysis.outside:
            continue  # (the catalogs, the cache's own reads of them)
        found.append(
            Advice(
                query.normalized,
                int(calls),
                round(float(ms), 3),
                NO_BOUND.format(calls=int(calls)),
                None,
                0.0,
                None,
            )
        )
    return found


def _plain(statement: str, percent: bool) -> str | None:
    """A statement's shape without its currency clauses (None: not a SELECT the cache
    parses), to match the cache's shapes with the backend's."""
    try:
        [query] = parse(statement, percent=percent)
        if not isinstance(query, Query) or not query.is_select:
            return None
        [shape] = parse(query.normalized, percent=True)
    except Error:
        return None
    assert isinstance(shape, Query)
    return shape.to_sql()


def suggest(
    statement: str,
    kind: str,
    schema: CacheSchema,
    catalog: Catalog,
    room: float = math.inf,
    calls: int = 1,
) -> tuple[str, int] | None:
    """The cache DDL that would answer ``statement`` locally and the bytes it would take
    (None: no DDL does, for that kind of reason, or the statement no longer plans); ``room``:
    the bytes the size budget leaves, ``calls``: how often the statement was run."""
    if kind not in (
        "no view",
        "bound not met",
        "bound below delay",
        "cheaper remote",
        "consistency",
    ):
        return None
    try:
        [query] = parse(statement, percent=True)
        if not isinstance(query, Query) or not query.is_select:
            return None
        analysis = analyze(query, catalog)
    except Error:
        return None
    if analysis.local_blocker is not None or analysis.outside:
        return None
    ddl: list[str] = []
    size = 0
    missing: dict[str, set[str]] = {}
    probed: dict[str, set[str]] = {}  # per table, the columns each of its reads looks up
    for access in analysis.accesses:
        if not match_access(access, schema):
            missing.setdefault(access.table, set()).update(access.columns)
            keys = set(access.probes)
            probed[access.table] = probed[access.table] & keys if access.table in probed else keys
    taken = set(schema.views) | set(schema.control_tables)
    for table, columns in sorted(missing.items()):
        made = _view_for(table, columns, catalog, taken, probed[table], room, calls)
        if made is None:
            return None
        ddl.append(made[0])
        size += made[1]
    bound = min((c.bound_seconds for c in analysis.constraint.classes), default=0.0)
    if kind == "bound below delay" and bound < STREAM_BOUND:
        return None  # (nothing keeps a copy that fresh)
    if not missing and kind in ("bound not met", "bound below delay"):
        for access in analysis.accesses:
            for match in match_access(access, schema)[:1]:
                view = match.view
                if view.continuous or view.is_gray:
                    continue  # (kept as fresh as it can be; a gray one follows its root)
                # under a fixed interval: its bounds choose one; chosen by its bounds already,
                # or below any refresh's delay: the change stream keeps it current
                mode = "AUTO" if kind == "bound not met" and not view.auto else "CONTINUOUSLY"
                again = _refreshed(view.statement, mode)
                if again is not None and again not in ddl:
                    ddl += [f"DROP CACHED VIEW {ident(view.name)}", again]
                    size += _bytes(catalog, view.table, view.columns)
    if kind == "consistency":
        views = {
            m.view.name: m.view for a in analysis.accesses for m in match_access(a, schema)[:1]
        }
        # (views refreshed apart share no snapshot however each is kept: one view only)
        for view in views.values() if len(views) == 1 else ():
            if view.view_level or view.is_gray:
                continue  # (one snapshot already; a gray one's is its root's)
            again = _consistent(view.statement)
            if again is not None:
                ddl += [f"DROP CACHED VIEW {ident(view.name)}", again]
                size += _bytes(catalog, view.table, view.columns)
    if not ddl:
        return None
    try:  # (a suggestion the schema's rules refuse is none: REFRESH CONTINUOUSLY takes no WHERE)
        check_script(schema, parse(";\n".join(ddl)), catalog)
    except Error:
        return None
    return ";\n".join(ddl) + ";", size


def _view_for(
    table: str,
    columns: set[str],
    catalog: Catalog,
    taken: set[str],
    probed: set[str],
    room: float,
    calls: int,
) -> tuple[str, int] | None:
    """A view of ``table`` holding ``columns`` and its key, kept REFRESH AUTO, and its
    estimated bytes: all its rows when they fit ``room``, else, when its reads look it up
    by key (``probed``: the columns every one of them looks up), the rows of the keys read,
    under a new control table (its name and the view's are added to ``taken``). None: the
    table has no key to cache it by."""
    found = catalog.table(table)
    if found is None or not found.primary_key:
        return None
    order = [c.name for c in found.columns]
    key = _presence_key(found, probed)
    held = sorted(set(columns) | set(found.primary_key) | set(key), key=order.index)
    size = _bytes(catalog, table, held)
    name = _unused(f"{table}{SUFFIX}", taken)
    listed = "*" if len(held) == len(order) else idents(held)
    where = ident(table) if found.schema == "public" else f"{ident(found.schema)}.{ident(table)}"
    ddl = f"CREATE CACHED VIEW {ident(name)} AS SELECT {listed} FROM {where}"
    if size <= room or not key:
        return f"{ddl} REFRESH AUTO", size
    control = _unused(f"{table}{KEYS_SUFFIX}", taken)
    types = {c.name: c.type for c in found.columns}
    declared = ", ".join(f"{ident(c)} {types[c]}" for c in key)
    distinct = max(_distinct(found, key), 1.0)
    return (
        f"CREATE CONTROL TABLE {ident(control)} ({declared});\n"
        f"{ddl} PRESENCE ON ({idents(key)}) IN {ident(control)} REFRESH AUTO",
        math.ceil(size * min(1.0, calls / distinct)),
    )


def _presence_key(table: Table, probed: set[str]) -> tuple[str, ...]:
    """The columns to control a view of ``table`` by, of those its reads look up: its primary
    key when they look it up whole, else the one with the most distinct values (() : none)."""
    if not probed:
        return ()
    if set(table.primary_key) <= probed:
        return table.primary_key
    return (max(sorted(probed), key=lambda c: _distinct(table, (c,))),)


def _distinct(table: Table, columns: tuple[str, ...]) -> float:
    """How many distinct values ``columns`` take, by the backend's statistics."""
    if any(set(key) <= set(columns) for key in (table.primary_key, *table.unique_keys)):
        return table.row_count
    found = [c.n_distinct for c in table.columns if c.name in columns]
    return max((n for n in found if n is not None), default=table.row_count)


def _unused(name: str, taken: set[str]) -> str:
    """``name``, or it numbered, not in ``taken`` (to which it is added)."""
    found, number = name, 2
    while found in taken:
        found, number = f"{name}{number}", number + 1
    taken.add(found)
    return found


def _bytes(catalog: Catalog, table: str, columns: Iterable[str]) -> int:
    """The bytes ``columns`` of ``table`` take at the backend, by its statistics: its pages,
    in the share of its columns held."""
    found = catalog.table(table)
    if found is None:
        return 0
    share = len(list(columns)) / max(len(found.columns), 1)
    return math.ceil(found.pages * 8192 * share)


_REFRESH = re.compile(
    r"\s+REFRESH\s+(EVERY\s+\S+\s+\S+|CONTINUOUSLY|AUTO(\s+WITHIN\s+\S+\s+\S+)?)", re.I
)


def _refreshed(statement: str, mode: str) -> str | None:
    """A view's DDL with ``REFRESH <mode>`` instead of its refresh clause (None: the text does
    not parse back to the same view with it)."""
    text = statement.strip().rstrip(";")
    bare = _REFRESH.sub("", text)
    again = f"{bare} REFRESH {mode}"
    both = _reparsed(text, again)
    if both is None:
        return None
    before, after = both
    if not _same_view(before, after, "refresh_seconds", "auto", "within_seconds", "continuous") or (
        after.auto,
        after.continuous,
    ) != (mode == "AUTO", mode == "CONTINUOUSLY"):
        return None
    return again


def _reparsed(text: str, again: str) -> tuple[CreateCachedView, CreateCachedView] | None:
    """A view's DDL and the text rewritten from it, parsed (None: either is not one view's
    DDL)."""
    try:
        [before], [after] = parse(text), parse(again)
    except Error:
        return None
    if isinstance(before, CreateCachedView) and isinstance(after, CreateCachedView):
        return before, after
    return None


def _same_view(before: CreateCachedView, after: CreateCachedView, *changed: str) -> bool:
    """Whether two views' DDL are the same but for the ``changed`` fields (the SELECT compared
    as SQL: a regular expression must not have touched a string in it)."""
    kept = {name: getattr(before, name) for name in ("text", "position", *changed)}
    return (
        dataclasses.replace(after, **kept) == before and after.select.sql() == before.select.sql()
    )


_CONSISTENCY = re.compile(r"\s+CONSISTENCY\s+(ROOT|ON\s+ALL|ON\s*\([^)]*\)(\s+IN\s+\S+)?)", re.I)
_AFTER_CONSISTENCY = re.compile(r"\s+(COMPLETENESS|REFRESH|WITH\s+NO\s+DATA)\b", re.I)


def _consistent(statement: str) -> str | None:
    """A view's DDL with ``CONSISTENCY ON ALL`` (every region of it from one snapshot)
    instead of its consistency clause (None: the text does not parse back to the same view
    with it)."""
    text = statement.strip().rstrip(";")
    bare = _CONSISTENCY.sub("", text)
    found = _AFTER_CONSISTENCY.search(bare)
    at = found.start() if found is not None else len(bare)
    again = f"{bare[:at]} CONSISTENCY ON ALL{bare[at:]}"
    both = _reparsed(text, again)
    if both is None:
        return None
    before, after = both
    whole = after.consistency is not None and after.consistency.kind == "all"
    return again if whole and _same_view(before, after, "consistency") else None


# -- applying it ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Applied:
    """What `apply_script` chose: the script, and the suggestions left out for the budget."""

    script: str
    views: tuple[str, ...]
    left_out: tuple[tuple[str, int], ...]  # (view, bytes) over the budget


def apply_script(rows: Iterable[Advice], room: float = math.inf) -> Applied:
    """One script of the suggestions: a view per table (the union of the columns they read),
    re-created views as suggested, the most saved per byte first while they fit in ``room``
    bytes. A table's view is its first suggestion's (with the control table it is under, if
    any), holding the columns all of them read."""
    # per table: its first view, the control tables created for it, the columns, saves, bytes
    per_table: dict[str, tuple[CreateCachedView, str, set[str] | None, float, int]] = {}
    again: dict[str, tuple[list[str], float, int]] = {}
    for row in rows:
        if row.suggestion is None:
            continue
        statements = parse(row.suggestion)
        dropped = {s.name for s in statements if isinstance(s, DropCacheObject)}
        created = {s.name: s for s in statements if isinstance(s, CreateControlTable)}
        for statement in statements:
            if not isinstance(statement, CreateCachedView):
                continue
            if statement.name in dropped:
                text = f"DROP CACHED VIEW {ident(statement.name)};\n{statement.text.strip()};"
                kept = again.get(statement.name)
                again[statement.name] = (  # (the costliest shape's comes first: it stands)
                    kept[0] if kept else [text],
                    (kept[1] if kept else 0.0) + row.saves_ms,
                    kept[2] if kept else row.bytes or 0,
                )
                continue
            kept_view = per_table.get(statement.table)
            # (None: every column, SELECT *)
            columns = set(statement.columns) if statement.columns is not None else None
            if kept_view is None:
                controls = "".join(
                    f"{created[p.control].text.strip()};\n"
                    for p in statement.presence
                    if p.control in created
                )
                per_table[statement.table] = (
                    statement,
                    controls,
                    columns,
                    row.saves_ms,
                    row.bytes or 0,
                )
            elif kept_view[0].presence == statement.presence:  # (else it does not answer it)
                first, under, held, saves, size = kept_view
                per_table[statement.table] = (
                    first,
                    under,
                    None if held is None or columns is None else held | columns,
                    saves + row.saves_ms,
                    max(size, row.bytes or 0),
                )
    candidates: list[tuple[float, str, str, int]] = []  # (saved per byte, name, ddl, bytes)
    for first, under, columns, saves, size in per_table.values():
        ddl = first.text.strip().rstrip(";")
        if first.columns is not None and (columns is None or columns != set(first.columns)):
            listed = "*" if columns is None else idents(sorted(columns))
            # (the list spliced in as it is: a replacement string would read its backslashes)
            found = re.search(r"AS\s+SELECT\s+.*?\s+FROM\s", ddl, flags=re.S)
            if found is not None:
                ddl = f"{ddl[: found.start()]}AS SELECT {listed} FROM {ddl[found.end() :]}"
        candidates.append((saves / max(size, 1), first.name, f"{under}{ddl};", size))
    for name, (texts, saves, size) in again.items():
        candidates.append((saves / max(size, 1), name, "\n".join(texts), 0))
    chosen, left, used = [], [], 0
    for _, name, ddl, size in sorted(candidates, key=lambda c: (-c[0], c[1])):
        if used + size > room:
            left.append((name, size))
            continue
        used += size
        chosen.append((name, ddl))
    return Applied("\n".join(ddl for _, ddl in chosen), tuple(n for n, _ in chosen), tuple(left))
