"""`mtcache init`, `ddl`, `admit`, `evict`, `refresh` and `advise`: the cache file's catalog,
its schema and its regions, the report each change prints, and what to cache."""

from __future__ import annotations

import argparse
import math
import typing as t
from pathlib import Path

from cache.dbapi.remote import ServerAdmin
from cache.engine.admin import Admin
from cache.engine.advice import apply_script
from cache.tools.cli.access import not_served, open_admin
from cache.tools.formatting import print_json
from cache.tools.settings import Settings
from sql_ext.errors import ProgrammingError
from sql_ext.nodes import plural


def cmd_init(settings: Settings, args: argparse.Namespace) -> int:
    not_served(
        settings, "its server keeps the catalog; stop the server to initialize the file again"
    )
    with Admin.open(settings.cache_path, backend=settings.backend_dsn) as admin:
        catalog = admin.reflect()
    print(
        f"cache {settings.cache_path}: shadow catalog of "
        f"{plural(len(catalog.tables), 'backend table')} and {plural(len(catalog.views), 'view')}"
    )
    return 0


def cmd_ddl(settings: Settings, args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProgrammingError(f"cannot read the DDL script {path}: {exc.strerror}") from None
    with open_admin(settings) as admin:
        result = admin.apply_ddl(text)
    for name in result.dropped:
        print(f"dropped {name}")
    for name in result.created:
        print(f"created {name}")
    for report in result.filled:
        print(f"filled {', '.join(report.rows_inserted)}: {_rows(report)} in {report.seconds:.1f}s")
    for name, why in result.unfilled:
        print(f"not filled {name}: {why} (`mtcache refresh --view {name}` fills it)")
    return 0


def cmd_advise(settings: Settings, args: argparse.Namespace) -> int:
    with open_admin(settings) as admin:
        rows = admin.advice()
        applied = None
        if args.apply:
            used = admin.status()["resources"]
            limit = used.get("cache_size_limit")
            room = math.inf if limit is None else max(limit - used["data_bytes"], 0)
            applied = apply_script(rows, room)
            result = admin.apply_ddl(applied.script) if applied.script else None
    if args.json:
        document: dict[str, t.Any] = {"advice": [row.to_json() for row in rows]}
        if applied is not None:
            document["applied"] = {
                "script": applied.script,
                "views": list(applied.views),
                "left_out": [{"view": v, "bytes": b} for v, b in applied.left_out],
            }
        print_json(document)
        return 0
    if not rows:
        print("no statement was answered by the backend yet: nothing to advise")
    for row in rows:
        print(
            f"{row.statement}\n  {plural(row.calls, 'call')}, {row.backend_ms:,.1f} ms at the "
            f"backend; {row.reason}"
        )
        if row.suggestion is not None:
            size = f"{row.bytes:,} bytes" if row.bytes is not None else "size unknown"
            print(f"  would save {row.saves_ms:,.1f} ms an hour ({size}) with:")
            print("    " + row.suggestion.replace("\n", "\n    "))
    if applied is not None:
        if result is None:
            print("nothing to apply" + (": over the size budget" if applied.left_out else ""))
        else:
            print(f"applied: created {', '.join(result.created)}")
        for view, weight in applied.left_out:
            print(f"left out {view}: {weight:,} bytes would pass the size budget")
    return 0


def _rows(report: t.Any) -> str:
    count = sum(report.rows_inserted.values())
    return f"{count:,} row{'s' if count != 1 else ''}"


def _keys(admin: Admin | ServerAdmin, control: str, values: list[str]) -> list[tuple[str, ...]]:
    """VALUE... grouped by the control table's key width (one value per key column)."""
    columns = admin.control_key(control)
    width = len(columns)
    if not values or len(values) % width:
        raise ProgrammingError(
            f"{control} has {width} control-key column(s) ({', '.join(columns)}): give values "
            f"in groups of {width}"
        )
    return [tuple(values[i : i + width]) for i in range(0, len(values), width)]


def _print_report(report: t.Any, as_json: bool) -> None:
    if as_json:
        print_json(report.to_json())
        return
    changed = ", ".join(
        f"{v} -{report.rows_deleted.get(v, 0)}/+{report.rows_inserted.get(v, 0)}"
        for v in sorted(set(report.rows_deleted) | set(report.rows_inserted))
    )
    snapshot = f" at snapshot {report.snapshot_id}" if report.snapshot_id else ""
    print(
        f"{report.operation}{snapshot} ({report.engine}, {report.seconds:.2f}s, "
        f"{plural(report.regions_counted, 'region')}): rows {changed or 'unchanged'}"
    )
    if report.engine_reason not in (None, "asked for"):
        print(f"  engine {report.engine}: {report.engine_reason}")


def cmd_clone(settings: Settings, args: argparse.Namespace) -> int:
    from cache.tools.seeding import clone

    seeded = clone(args.peer, settings.cache_path, settings.backend_dsn())
    if args.json:
        print_json(
            {
                "cache": str(seeded.path),
                "bytes": seeded.bytes,
                "views": seeded.views,
                "seconds": round(seeded.seconds, 3),
                "stream_position": seeded.position,
            }
        )
    else:
        at = f" at stream position {seeded.position}" if seeded.position else ""
        print(
            f"seeded {seeded.path} from {args.peer}{at}: {plural(seeded.views, 'view')}, "
            f"{seeded.bytes:,} bytes in {seeded.seconds:.2f}s"
        )
    return 0


def cmd_admit(settings: Settings, args: argparse.Namespace) -> int:
    with open_admin(settings) as admin:
        keys = _keys(admin, args.name, args.values)
        _print_report(admin.admit(args.name, keys, allow_empty=args.allow_empty), args.json)
    return 0


def cmd_evict(settings: Settings, args: argparse.Namespace) -> int:
    with open_admin(settings) as admin:
        _print_report(admin.evict(args.name, _keys(admin, args.name, args.values)), args.json)
    return 0


def cmd_refresh(settings: Settings, args: argparse.Namespace) -> int:
    keys = [tuple(k.split(",")) for k in args.key] if args.key else None
    if keys and not args.view:
        raise ProgrammingError("--key needs --view: keys are presence keys of one view")
    with open_admin(settings) as admin:
        report = admin.refresh(
            args.view, keys, engine=args.engine, spark_master=settings.spark_master
        )
        _print_report(report, args.json)
    return 0
