"""What a session can ask the cache about itself, as rows any client reads: ``EXPLAIN LAST
STATEMENT`` (where the last statement's rows came from), ``SHOW CACHED VIEWS`` (one row per
view) and ``SHOW CACHE STATUS`` (the status document, one row per entry, its value as JSON);
and the provenance NOTICE a session may ask for after each statement (``mtcache.provenance``).
Each is a `Result` whose columns carry PostgreSQL's types, so the cache server sends them as
PostgreSQL would send such rows.
"""

from __future__ import annotations

import datetime as dt
import json
import typing as t

from cache.engine.result import Result
from cache.engine.route import Explain, Inspection, Route, SessionSetting
from cache.engine.stats import Sample
from cache.execution.provenance import Provenance
from cache.store.cache_file import CacheStore
from cache.store.refresh_times import NOW, refresh_times
from cache.wire.oids import OID
from optimizer.plan import Plan
from sql_ext.nodes import format_duration

Columns = tuple[tuple[str, int], ...]


def unfilled_notes(plan: Plan, store: CacheStore, scheduled: bool) -> list[str]:
    """EXPLAIN's notes on the fully materialized views a plan's guards try first that were
    never filled: their guards fail, so the backend answers until a refresh fills them, and
    whether anything will (``scheduled``: this process runs the refresh scheduler, which
    fills a view due at once)."""
    schema = store.load_schema()
    notes = []
    for name in sorted({a.guards[0].view for a in plan.guarded_accesses}):
        view = schema.views.get(name)
        if view is None or not view.is_fully_materialized:
            continue
        times = refresh_times(store, schema, name)
        if not times.stamps.never:
            continue
        filler = (
            "the refresh scheduler fills it at once"
            if scheduled and times.due == NOW
            else f"nothing fills it until REFRESH CACHED VIEW {name} (mtcache refresh --view "
            f"{name}) or a refresh scheduler does"
        )
        notes.append(f"{name} was never filled: its guard fails and the backend answers; {filler}")
    return notes


LAST_STATEMENT: Columns = (
    ("table", OID.text),
    ("route", OID.text),
    ("view", OID.text),
    ("regions", OID.text),
    ("currency_seconds", OID.float8),
    ("snapshot_ids", OID.text),
    ("stale", OID.bool),
)

CACHED_VIEWS: Columns = (
    ("name", OID.text),
    ("table", OID.text),
    ("consistency", OID.text),
    ("root", OID.text),
    ("refresh", OID.text),
    ("rows", OID.int8),
    ("regions", OID.int8),
    ("currency_seconds", OID.float8),
    ("last_refresh", OID.timestamptz),
    ("next_refresh", OID.timestamptz),
    ("refresh_delay_seconds", OID.float8),
    ("refresh_reason", OID.text),  # REFRESH AUTO: why its interval (else NULL)
)

CACHE_STATUS: Columns = (("name", OID.text), ("value", OID.text))
# SHOW CACHE ADVICE (`cache.engine.advice.Advice`)
CACHE_ADVICE: Columns = (
    ("statement", OID.text),
    ("calls", OID.int8),
    ("backend_ms", OID.float8),
    ("reason", OID.text),
    ("suggestion", OID.text),
    ("saves_ms", OID.float8),
    ("bytes", OID.int8),
)
# SHOW CACHE SEED (`cache.store.seed`): a row of what the seed is, then the file's bytes
CACHE_SEED: Columns = (("part", OID.text), ("data", OID.bytea))
CACHE_STATS: Columns = (
    ("name", OID.text),
    ("labels", OID.text),
    ("value", OID.float8),
    ("kind", OID.text),
)


EXPLAIN: Columns = (("QUERY PLAN", OID.text),)


def result_columns(route: Route) -> Columns | None:
    """The columns of an engine statement's result, known before it runs (what a Describe
    of it answers, and what the statement's result is made with): None when it returns no
    rows. Not for cached reads (their columns are the backend's description of the query)."""
    if isinstance(route, Inspection):
        return {
            "last statement": LAST_STATEMENT,
            "cached views": CACHED_VIEWS,
            "cache status": CACHE_STATUS,
            "cache stats": CACHE_STATS,
            "cache advice": CACHE_ADVICE,
            "cache seed": CACHE_SEED,
        }[route.what]
    if isinstance(route, Explain):
        return EXPLAIN
    if isinstance(route, SessionSetting) and route.action == "show":
        return ((route.column, OID.text),)
    return None


class Notice(str):
    """A notice of the cache's own with a detail for programs (JSON), which the cache server
    sends in the NoticeResponse's detail field; read as text it is the message."""

    detail: str | None

    def __new__(cls, message: str, detail: str | None = None) -> Notice:
        notice = super().__new__(cls, message)
        notice.detail = detail
        return notice

    @classmethod
    def with_detail(cls, message: str, detail: t.Any) -> Notice:
        return cls(message, json.dumps(detail, separators=(",", ":")))


def rows_of(
    columns: Columns, rows: list[tuple[t.Any, ...]], status: str, *, plan: Plan | None = None
) -> Result:
    description = [(name, oid, None, None, None, None, None) for name, oid in columns]
    return Result(rows, description, status=status, plan=plan)


def last_statement(provenance: Provenance) -> Result:
    """EXPLAIN LAST STATEMENT: one row per table access of the session's last statement."""
    rows = [
        (
            a.table,
            a.route,
            a.view,
            _json([list(k) for k in a.regions]),
            a.currency_seconds,
            _json(list(a.snapshot_ids)),
            a.stale,
        )
        for a in provenance
    ]
    return rows_of(LAST_STATEMENT, rows, "EXPLAIN")


def cached_views(document: dict[str, t.Any], zone: dt.tzinfo) -> Result:
    """SHOW CACHED VIEWS: one row per cached view of a status document."""
    rows = []
    for view in document["views"]:
        auto = view.get("refresh_auto")
        if auto is not None:
            refresh = auto_refresh_text(auto)
        elif view["refresh_seconds"]:
            refresh = f"every {format_duration(view['refresh_seconds'])}"
        elif view.get("continuous"):
            refresh = "continuously"
        elif view["refresh_follows"]:
            refresh = f"with {view['refresh_follows']}"
        else:
            refresh = "on demand"
        rows.append(
            (
                view["name"],
                view["table"],
                view["consistency"],
                view["root"],
                refresh,
                view["rows"],
                view["region_count"],
                view["oldest_region_seconds"],
                _moment(view["last_refresh"], zone),
                _moment(view["next_refresh"], zone),
                view["refresh_delay_seconds"],
                auto["reason"] if auto is not None else None,
            )
        )
    return rows_of(CACHED_VIEWS, rows, f"SHOW {len(rows)}")


def auto_refresh_text(auto: dict[str, t.Any]) -> str:
    """A REFRESH AUTO view's refresh as status documents give it: ``auto, every 29.5 sec,
    within 1 min`` (``not now``: no interval pays)."""
    interval = auto["interval_seconds"]
    said = f"auto, every {format_duration(round(interval, 3))}" if interval else "auto, not now"
    if auto["within_seconds"]:
        said += f", within {format_duration(auto['within_seconds'])}"
    return said


def bounds_asked_text(asked: list[dict[str, t.Any]]) -> str:
    """The bounds asked of a view, as `mtcache status` prints them: ``10 min 1,200/h``."""
    return ", ".join(
        f"{'any age' if a['bound_seconds'] is None else format_duration(a['bound_seconds'])} "
        f"{a['queries_per_hour']:,.0f}/h"
        for a in asked
    )


def cache_advice(rows: t.Iterable[t.Any]) -> Result:
    """SHOW CACHE ADVICE: a row per statement shape the backend answered
    (`cache.engine.advice`)."""
    found = [
        (a.statement, a.calls, a.backend_ms, a.reason, a.suggestion, a.saves_ms, a.bytes)
        for a in rows
    ]
    return rows_of(CACHE_ADVICE, found, f"SHOW {len(found)}")


def cache_status(document: dict[str, t.Any]) -> Result:
    """SHOW CACHE STATUS: the status document, one row per entry with its value as JSON (a
    program rebuilds the document from the rows: `status_document`)."""
    rows = [(name, _json(value)) for name, value in document.items()]
    return rows_of(CACHE_STATUS, rows, "SHOW")


def cache_stats(samples: t.Iterable[Sample]) -> Result:
    """SHOW CACHE STATS: a row per sample (`cache.engine.stats`): its name, its labels as a
    JSON object, its value and kind, as the server's Prometheus endpoint gives them."""
    rows = [(s.name, _json(dict(s.labels)), s.value, s.kind) for s in samples]
    return rows_of(CACHE_STATS, rows, "SHOW")


def status_document(rows: t.Iterable[tuple[str, str]]) -> dict[str, t.Any]:
    """The status document of SHOW CACHE STATUS's rows."""
    return {name: json.loads(value) for name, value in rows}


PROVENANCE_NOTICE = "provenance: "  # how the message of a provenance NOTICE begins


def provenance_notice(provenance: Provenance) -> Notice:
    """The NOTICE of ``mtcache.provenance``: a line per access, the provenance as JSON in its
    detail (docs/json-outputs.md's shape)."""
    said = "; ".join(
        f"{a.table}: {a.route}"
        + (f" via {a.view}" if a.view else "")
        + (
            f", {a.currency_seconds:.1f}s old"
            if a.route == "local" and a.currency_seconds is not None
            else ""
        )
        + (" (stale)" if a.stale else "")
        for a in provenance
    )
    return Notice.with_detail(f"{PROVENANCE_NOTICE}{said or 'no table read'}", provenance.to_json())


def _json(value: t.Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def _moment(text: str | None, zone: dt.tzinfo) -> dt.datetime | None:
    return dt.datetime.fromisoformat(text).astimezone(zone) if text else None
