"""`mtcache status`: the cache's views, regions, currency, stream and counters, as text (each
view's refresh line, the stream's line) or as its JSON document."""

from __future__ import annotations

import argparse
import datetime as dt
import typing as t

from cache.engine.inspect import auto_refresh_text, bounds_asked_text
from cache.tools.cli.access import open_admin
from cache.tools.formatting import print_json
from cache.tools.settings import Settings
from control_tables.regions import key_text
from sql_ext.errors import ProgrammingError
from sql_ext.nodes import format_duration, plural


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    if not settings.server and not settings.cache_path.exists():
        raise ProgrammingError(
            f"no cache file at {settings.cache_path}: create one with `mtcache init` "
            "(or pass --cache)"
        )
    with open_admin(settings) as admin:
        document = admin.status(args.view or ())
    if args.json:
        print_json(document)
        return 0
    clock = document.get("backend_clock")
    measured = (
        f", offset {clock['offset_seconds']:+.6f}s measured {clock['measured_at']}" if clock else ""
    )
    print(f"cache {document['cache']} (currency by the {document['clock']} clock{measured})")
    now = dt.datetime.fromisoformat(document["now"])
    for view in document["views"]:
        parents = f" under {', '.join(view['parents'])}" if view["parents"] else ""
        auto = view.get("refresh_auto")
        every = (
            f", refresh {auto_refresh_text(auto)}"
            if auto is not None
            else f", refresh every {format_duration(view['refresh_seconds'])}"
            if view["refresh_seconds"]
            else ", refreshed continuously"
            if view.get("continuous")
            else ""
        )
        print(
            f"  {view['name']} ({view['table']}, {view['color']}, {view['consistency']}-level"
            f"{parents}{every}): {plural(view['rows'], 'row')}; {_refresh_line(view, now)}"
        )
        if auto is not None:
            print(f"    refresh auto: {auto['reason']}")
        if view.get("bounds_asked"):
            print(f"    bounds asked: {bounds_asked_text(view['bounds_asked'])}")
        if view["regions"] is None:
            oldest = view["oldest_region_seconds"]
            print(
                f"    {plural(view['region_count'], 'region')} "
                f"({view['regions_never_refreshed']} never refreshed"
                f"{f', the oldest {oldest:.1f}s old' if oldest is not None else ''}): "
                f"`mtcache status --view {view['name']}` lists them"
            )
            continue
        for region in view["regions"]:
            where = f"{region['control']}{key_text(region['key'])}" if region["control"] else "all"
            age = (
                f"{region['currency_seconds']:.1f}s old, snapshot {region['snapshot_id']}"
                if region["currency_seconds"] is not None
                else "never refreshed"
            )
            print(f"    {region['kind']:<12} {where}: {plural(region['rows'], 'row')}, {age}")
    if document.get("stream"):
        print(f"  stream: {_stream_line(document['stream'])}")
    counters = ", ".join(f"{k} {v}" for k, v in sorted(document["counters"].items()))
    print(f"  counters: {counters}")
    used = document.get("resources")
    if used:
        print(
            f"  resources: DuckDB memory {used['memory_in_use_bytes']:,} bytes in use of "
            f"{used['memory_limit']}, {plural(used['threads'], 'thread')}; file "
            f"{used['file_bytes']:,} bytes checkpointed, WAL {used['wal']}"
        )
        limit = used.get("cache_size_limit")
        print(
            f"  budget: data {used['data_bytes']:,} bytes"
            + (
                f" of {limit:,} (cache_size_limit)"
                if limit is not None
                else ", no cache_size_limit"
            )
        )
    return 0


def _refresh_line(view: dict[str, t.Any], now: dt.datetime) -> str:
    """When the view was refreshed last and will be next, as `status` prints it."""

    def seconds(moment: str) -> float:  # from now on; negative: ago
        return round((dt.datetime.fromisoformat(moment) - now).total_seconds(), 1)

    last = view["last_refresh"]
    said = f"refreshed {format_duration(-seconds(last))} ago" if last else "never refreshed"
    if not last and (view["regions"] or view.get("region_count")):
        said += f" (read at the backend until `mtcache refresh --view {view['name']}` fills it)"
    if view["refresh_delay_seconds"] is not None:  # d of §4.6, measured
        said += f" (landing {format_duration(round(view['refresh_delay_seconds'], 3))} old)"
    if last and view.get("last_engine"):
        why = view.get("last_engine_reason")
        said += f", engine {view['last_engine']}" + (f" ({why})" if why else "")
    if view["refresh_follows"]:
        return f"{said}, with {view['refresh_follows']}"
    if view.get("continuous"):
        return f"{said}, continuously from the WAL"
    upcoming = view["next_refresh"]
    if upcoming is None:
        if view.get("refresh_auto") is not None:
            return f"{said}, next when its reads pay for it"
        return (
            f"{said}, next on demand"
            if not view["refresh_seconds"]
            else f"{said}, next once regions are admitted"
        )
    wait = seconds(upcoming)
    return f"{said}, next {'now' if wait <= 0 else 'in ' + format_duration(wait)}"


def _stream_line(stream: dict[str, t.Any]) -> str:
    """The replication stream of continuously maintained views, as `status` prints it."""
    said = f"slot {stream['slot']}, applied to {stream['applied_lsn']}"
    if stream["lag_seconds"] is not None:
        said += f", current as of {format_duration(round(stream['lag_seconds'], 1))} ago"
    else:
        said += ", no heartbeat applied yet (run mtcache heartbeat)"
    if stream["slot_exists"] is False:
        said += "; the slot is gone at the backend (the owning process makes it again)"
    elif stream["lag_bytes"] is not None:
        said += f", {plural(stream['lag_bytes'], 'byte')} of WAL behind"
        if stream["over_limit"]:
            said += " - OVER THE LAG LIMIT: is the process that owns the cache running?"
    else:
        said += " (backend unreachable: lag in bytes unknown)"
    if stream["problem"]:
        said += f"; STOPPED: {stream['problem']}"
    return said
