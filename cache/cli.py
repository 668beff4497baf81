"""The `mtcache` command line (SPEC §1). Environment variables are read here and nowhere else.

    mtcache [--backend DSN] [--cache FILE] COMMAND ...

Errors print one line to stderr and exit 1 (2 for usage errors, from argparse).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import typing as t
from dataclasses import dataclass
from pathlib import Path

from cache.errors import Error, ProgrammingError

DEFAULT_CACHE = ".mtcache/cache.duckdb"


@dataclass(frozen=True)
class Settings:
    """Where the cache lives and which backend it fronts (None = the embedded default)."""

    cache_path: Path
    backend: str | None

    @property
    def embedded_root(self) -> Path:
        # The embedded cluster lives beside the cache file: one cache directory, one backend.
        return self.cache_path.parent / "pg"

    def backend_dsn(self) -> str:
        if self.backend:
            return self.backend
        from cache.embedded_pg import EmbeddedPostgres

        return EmbeddedPostgres(self.embedded_root).ensure_running()


def format_seconds(seconds: float) -> str:
    for unit, size in (("day", 86400.0), ("hour", 3600.0), ("min", 60.0), ("sec", 1.0)):
        if seconds >= size and (seconds / size).is_integer():
            value = int(seconds / size)
            return f"{value} {unit}{'s' if value != 1 and unit in ('day', 'hour') else ''}"
    return f"{seconds:g} sec"


# -- commands -------------------------------------------------------------------------------------


def cmd_parse(settings: Settings, args: argparse.Namespace) -> int:
    from sql_ext import parse_one

    statement = parse_one(args.sql)
    document = statement.to_json()
    if args.json:
        print(json.dumps(document))
        return 0
    print(f"kind: {document['kind']}")
    if document.get("sql"):
        print(f"sql:  {document['sql']}")
    if "timeline" in document:
        print(f"timeline: {document['timeline']} of a TIMEORDERED bracket")
    for clause in document["clauses"]:
        for spec in clause["specs"]:
            on = f" ON ({', '.join(spec['on'])})" if spec["on"] is not None else " ON (every input)"
            by = f" BY {', '.join(spec['by'])}" if spec["by"] else ""
            print(f"block {clause['block']}: {format_seconds(spec['bound_seconds'])}{on}{by}")
    if "ddl" in document:
        print("ddl:  " + json.dumps(document["ddl"]))
    return 0


def describe_class(cls: dict[str, t.Any]) -> str:
    tables = ", ".join(cls["tables"])
    if cls["bound_seconds"] == 0:
        freshness = "must be current (bound 0: read from the backend)"
    else:
        freshness = f"at most {format_seconds(cls['bound_seconds'])} stale"
    grouping = (
        f"one snapshot per group of ({', '.join(cls['by'])})" if cls["by"] else "one snapshot"
    )
    return f"({tables}): {freshness}, {grouping}"


def cmd_explain(settings: Settings, args: argparse.Namespace) -> int:
    from cache.backend_catalog import fetch_catalog
    from optimizer.normalize_constraint import normalize_constraint
    from sql_ext import Query, parse_one

    statement = parse_one(args.sql)
    if not isinstance(statement, Query):
        raise ProgrammingError(
            f"explain takes a query; this is a {statement.kind} statement (try `mtcache parse`)"
        )
    catalog = fetch_catalog(settings.backend_dsn())
    constraint = normalize_constraint(statement, catalog)
    if args.json:
        print(json.dumps({"constraint": constraint.to_json()}))
        return 0
    print("normalized C&C constraint:")
    for number, cls in enumerate(constraint.to_json(), 1):
        print(f"  class {number} {describe_class(cls)}")
    if not constraint.classes:
        print("  (none: the statement reads nothing; it goes to the backend as it is)")
    print(
        "plan: not shown yet - view matching, SwitchUnion guards and costs arrive with the "
        "optimizer; this build explains the constraint only"
    )
    return 0


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from cache.demo import run_demo

    return run_demo(settings)


def cmd_stop(settings: Settings, args: argparse.Namespace) -> int:
    from cache.embedded_pg import EmbeddedPostgres

    if settings.backend:
        print("a --backend was given: mtcache only stops the embedded PostgreSQL it started")
        return 0
    cluster = EmbeddedPostgres(settings.embedded_root)
    if cluster.stop():
        print(f"stopped the embedded PostgreSQL under {cluster.root}")
    else:
        print(f"the embedded PostgreSQL under {cluster.root} was not running")
    return 0


# -- wiring ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mtcache",
        description="A currency-and-consistency-aware mid-tier cache in front of PostgreSQL.",
    )
    parser.add_argument(
        "--backend",
        help="PostgreSQL DSN or URL (env MTCACHE_BACKEND; default: the embedded cluster)",
    )
    parser.add_argument(
        "--cache", help=f"the cache's DuckDB file (env MTCACHE_CACHE; default {DEFAULT_CACHE})"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = commands.add_parser("parse", help="parse a statement (no backend needed)")
    p.add_argument("--json", action="store_true", help="print the SPEC §9 JSON document")
    p.add_argument("sql")
    p.set_defaults(run=cmd_parse)

    p = commands.add_parser("explain", help="explain a query: its normalized C&C constraint")
    p.add_argument("--json", action="store_true", help="print the SPEC §9 JSON document")
    p.add_argument("sql")
    p.set_defaults(run=cmd_explain)

    p = commands.add_parser("demo", help="start the embedded backend and walk through examples")
    p.set_defaults(run=cmd_demo)

    p = commands.add_parser("stop", help="stop the embedded PostgreSQL")
    p.set_defaults(run=cmd_stop)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings(
        cache_path=Path(args.cache or os.environ.get("MTCACHE_CACHE") or DEFAULT_CACHE),
        backend=args.backend or os.environ.get("MTCACHE_BACKEND") or None,
    )
    try:
        return int(args.run(settings, args))
    except Error as exc:
        message = " ".join(str(exc).split())  # one line, whatever the driver said
        print(f"mtcache: {type(exc).__name__}: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mtcache: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
