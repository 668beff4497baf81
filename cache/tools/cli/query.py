"""`mtcache parse`, `explain` and `query`: a statement parsed, planned against the cache, or
run through it (its rows as a table or as JSON values, docs/json-outputs.md)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import typing as t

from rich.console import Console
from rich.table import Table

from cache.engine.admin import Admin
from cache.engine.session import Session
from cache.tools.cli.access import open_connection
from cache.tools.formatting import describe_class, print_json
from cache.tools.settings import Settings
from sql_ext import is_empty, parse_one
from sql_ext.errors import BackendUnavailableError, ProgrammingError
from sql_ext.nodes import format_duration, plural


def cmd_parse(settings: Settings, args: argparse.Namespace) -> int:
    statement = parse_one(args.sql)
    document = statement.to_json()
    if args.json:
        print_json(document)
        return 0
    print(f"kind: {document['kind']}")
    if document.get("sql"):
        print(f"sql:  {document['sql']}")
    if "timeline" in document:
        print(f"timeline: {document['timeline']} of a TIMEORDERED bracket")
    if "session" in document:
        session = document["session"]
        bound = session["bound_seconds"]
        print(
            f"session currency bound: {session['currency_bound']}"
            + (f" {format_duration(bound)}" if bound is not None else "")
        )
    if "inspect" in document:
        print(f"asks the cache: {document['inspect']}")
    if "setting" in document:
        setting = document["setting"]
        value = f" = {setting['value']!r}" if setting["value"] is not None else ""
        print(f"cache setting: {setting['action']} {setting['name']}{value}")
    if "refresh" in document:
        refresh = document["refresh"]
        keys = f" keys {refresh['keys']}" if refresh["keys"] else ""
        print(f"refresh: {refresh['view'] or 'every white view'}{keys}")
    for clause in document["clauses"]:
        for spec in clause["specs"]:
            on = f" ON ({', '.join(spec['on'])})" if spec["on"] is not None else " ON (every input)"
            by = f" BY {', '.join(spec['by'])}" if spec["by"] else ""
            print(f"block {clause['block']}: {format_duration(spec['bound_seconds'])}{on}{by}")
    if "ddl" in document:
        print("ddl:  " + json.dumps(document["ddl"]))
    return 0


def cmd_explain(settings: Settings, args: argparse.Namespace) -> int:
    with open_connection(settings) as conn:
        if conn.engine is None:  # through the server, which plans it: its plan as rows
            cur = conn.cursor()
            rows = cur.execute(f"EXPLAIN (CACHE, FORMAT JSON) {args.sql}").fetchall()
            document = json.loads(rows[0][0])
            lines = [row[0] for row in cur.execute(f"EXPLAIN (CACHE) {args.sql}").fetchall()]
        else:
            # plan against the backend's tables as they are now; while it is unreachable,
            # from the catalog on file without estimates (its guards decide)
            with contextlib.suppress(BackendUnavailableError):
                t.cast(Admin, conn.admin).reflect()
            session = conn.session
            assert isinstance(session, Session)  # (in process: not a server's)
            document, lines = session.explained(conn.explain(args.sql))
    if args.json:
        print_json(document)
        return 0
    print("normalized C&C constraint:")
    for number, cls in enumerate(document["constraint"], 1):
        print(f"  class {number} {describe_class(cls)}")
    if not document["constraint"]:
        print("  (none: the statement reads nothing; it goes to the backend as it is)")
    print("plan:")
    for line in lines:
        if not line.startswith(("constraint: ", "note: ")):
            print(f"  {line}")
    for note in document.get("notes", ()):
        print(f"note: {note}")
    return 0


def _json_value(value: t.Any) -> t.Any:
    """docs/json-outputs.md: numbers, strings, booleans and NULL as they are; json
    and jsonb values as the JSON they hold; arrays as lists; decimals as strings (exact);
    floats JSON cannot hold (NaN, infinities) as PostgreSQL prints them; dates and times as
    ISO 8601; intervals as ISO 8601 durations (PnDTnHnMnS, sign first); bytea as PostgreSQL's
    hex text (\\x...); anything else as its text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, bytes | bytearray | memoryview):
        return "\\x" + bytes(value).hex()
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, dt.timedelta):
        return _iso_duration(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def _iso_duration(value: dt.timedelta) -> str:
    sign, value = ("-", -value) if value < dt.timedelta(0) else ("", value)
    hours, rest = divmod(value.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    second = (
        f"{seconds}.{value.microseconds:06d}".rstrip("0").rstrip(".")
        if value.microseconds
        else str(seconds)
    )
    time = "".join(f"{n}{u}" for n, u in ((hours, "H"), (minutes, "M")) if n)
    time += f"{second}S" if seconds or value.microseconds else ""
    days = f"{value.days}D" if value.days else ""
    if not days and not time:
        return "PT0S"
    return f"{sign}P{days}" + (f"T{time}" if time else "")


def cmd_query(settings: Settings, args: argparse.Namespace) -> int:
    if is_empty(args.sql):
        raise ProgrammingError("empty statement: there is no SQL to run")
    with open_connection(settings) as conn:
        cur = conn.cursor()
        cur.execute(args.sql)
        columns = [d[0] for d in cur.description] if cur.description else []
        rows = cur.fetchall() if cur.description else []
        provenance = cur.provenance
    if args.json:
        print_json(
            {
                "columns": columns,
                "rows": [[_json_value(v) for v in row] for row in rows],
                "provenance": provenance.to_json(),
            }
        )
        return 0
    console = Console(highlight=False, soft_wrap=True)
    if columns:
        table = Table(*columns)
        for row in rows:
            table.add_row(*("NULL" if v is None else str(v) for v in row))
        console.print(table)
        console.print(plural(len(rows), "row"))
    else:
        console.print("done (no rows returned)")
    if provenance:
        parts = [
            f"{p['table']}: {p['route']}"
            + (f" via {p['view']}" if p["view"] else "")
            + (f", {p['currency_seconds']:.1f}s old" if p["currency_seconds"] else "")
            for p in provenance
        ]
        console.print("provenance: " + "; ".join(parts))
    return 0
