"""The `mtcache` command line. Environment variables are read here and nowhere else.

    mtcache [--backend DSN] [--cache FILE] COMMAND ...

Errors print one line to stderr and exit 1 (2 for usage errors, from argparse).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import math
import os
import signal
import sys
import typing as t
from importlib.metadata import entry_points
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.reflect import connect_backend, redact
from cache.dbapi.remote import ServerAdmin, server_conninfo
from cache.engine.admin import Admin
from cache.engine.engine import DEFAULT_CACHE
from cache.engine.session import Session
from cache.maintenance.pipeline import ENGINES
from cache.store.served import published, served_at
from cache.tools.formatting import describe_class, plural
from cache.tools.settings import Settings
from heartbeat.beat import DEFAULT_INTERVAL, DEFAULT_SOURCE, Heartbeat, beat, ensure_table
from heartbeat.beat import TABLE as HEARTBEAT_TABLE
from sql_ext import is_empty, parse_one
from sql_ext.errors import (
    BackendUnavailableError,
    DataError,
    Error,
    OperationalError,
    ProgrammingError,
    first_line,
    translate,
)
from sql_ext.nodes import format_duration

DEFAULT_ENGINE = "spark"
# the entry point group of commands other packages add: each a function given the sub-parsers
COMMANDS = "mtcache.commands"


# -- commands -------------------------------------------------------------------------------------


JSON_HELP = "print the JSON document (its shape: docs/json-outputs.md)"
SQL_HELP = "the statement; - reads it from standard input (a statement too long for an argument)"


def read_statement(args: argparse.Namespace) -> None:
    """``-`` for the statement: read it from standard input."""
    if getattr(args, "sql", None) == "-":
        try:
            args.sql = sys.stdin.read()
        except UnicodeDecodeError as exc:
            raise DataError(f"the statement on standard input is not valid UTF-8 ({exc})") from None


def cmd_parse(settings: Settings, args: argparse.Namespace) -> int:
    statement = parse_one(args.sql)
    document = statement.to_json()
    if args.json:
        _print_json(document)
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
    with _connect(settings) as conn:
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
        _print_json(document)
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


def _admin(settings: Settings) -> t.ContextManager[Admin | ServerAdmin]:
    """The cache file's administration; the backend is started or reached only if needed.
    While `mtcache serve` owns the file, the server's (through its protocol)."""
    served = served_at(settings.cache_path)
    if served is not None:
        return ServerAdmin.open(server_conninfo(served, settings.backend))
    return Admin.open(
        settings.cache_path,
        backend=settings.backend_dsn,
        memory_limit=settings.memory_limit,
        threads=settings.threads,
        cache_size_limit=settings.cache_size_limit,
    )


def _connect(settings: Settings) -> cache.Connection:
    """A session on the cache: through its server while one owns the file."""
    served = served_at(settings.cache_path)
    if served is not None:
        return cache.connect(settings.backend, settings.cache_path, server=served)
    return cache.connect(
        settings.backend_dsn(),
        settings.cache_path,
        background=False,
        memory_limit=settings.memory_limit,
        threads=settings.threads,
        cache_size_limit=settings.cache_size_limit,
    )


def _not_served(settings: Settings, advice: str) -> None:
    """Refuse a command that needs the file itself while a server owns it."""
    served = served_at(settings.cache_path)
    if served is not None:
        raise OperationalError(
            f"the cache file {settings.cache_path} is served by `mtcache serve` (pid "
            f"{served.pid}) at {served.address}: {advice}"
        )


def cmd_init(settings: Settings, args: argparse.Namespace) -> int:
    _not_served(
        settings, "its server keeps the catalog; stop the server to initialize the file again"
    )
    with Admin.open(settings.cache_path, backend=settings.backend_dsn) as admin:
        catalog = admin.reflect()
    print(
        f"cache {settings.cache_path}: shadow catalog of {len(catalog.tables)} backend tables "
        f"and {len(catalog.views)} views"
    )
    return 0


def cmd_ddl(settings: Settings, args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProgrammingError(f"cannot read the DDL script {path}: {exc.strerror}") from None
    with _admin(settings) as admin:
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
        _print_json(report.to_json())
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


def cmd_admit(settings: Settings, args: argparse.Namespace) -> int:
    with _admin(settings) as admin:
        keys = _keys(admin, args.name, args.values)
        _print_report(admin.admit(args.name, keys, allow_empty=args.allow_empty), args.json)
    return 0


def cmd_evict(settings: Settings, args: argparse.Namespace) -> int:
    with _admin(settings) as admin:
        _print_report(admin.evict(args.name, _keys(admin, args.name, args.values)), args.json)
    return 0


def cmd_refresh(settings: Settings, args: argparse.Namespace) -> int:
    keys = [tuple(k.split(",")) for k in args.key] if args.key else None
    if keys and not args.view:
        raise ProgrammingError("--key needs --view: keys are presence keys of one view")
    master = args.spark_master or os.environ.get("MTCACHE_SPARK_MASTER")
    with _admin(settings) as admin:
        report = admin.refresh(args.view, keys, engine=args.engine, spark_master=master)
        _print_report(report, args.json)
    return 0


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    if not settings.cache_path.exists():
        raise ProgrammingError(
            f"no cache file at {settings.cache_path}: create one with `mtcache init` "
            "(or pass --cache)"
        )
    with _admin(settings) as admin:
        document = admin.status(args.view or ())
    if args.json:
        _print_json(document)
        return 0
    clock = document.get("backend_clock")
    measured = (
        f", offset {clock['offset_seconds']:+.6f}s measured {clock['measured_at']}" if clock else ""
    )
    print(f"cache {document['cache']} (currency by the {document['clock']} clock{measured})")
    now = dt.datetime.fromisoformat(document["now"])
    for view in document["views"]:
        parents = f" under {', '.join(view['parents'])}" if view["parents"] else ""
        every = (
            f", refresh every {format_duration(view['refresh_seconds'])}"
            if view["refresh_seconds"]
            else ", refreshed continuously"
            if view.get("continuous")
            else ""
        )
        print(
            f"  {view['name']} ({view['table']}, {view['color']}, {view['consistency']}-level"
            f"{parents}{every}): {plural(view['rows'], 'row')}; {_refresh_line(view, now)}"
        )
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
            where = f"{region['control']}{tuple(region['key'])}" if region["control"] else "all"
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
    if view["refresh_follows"]:
        return f"{said}, with {view['refresh_follows']}"
    if view.get("continuous"):
        return f"{said}, continuously from the WAL"
    upcoming = view["next_refresh"]
    if upcoming is None:
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


def _print_json(document: t.Any) -> None:
    """Valid JSON only (no NaN or Infinity tokens): a value that cannot be JSON is an error."""
    print(json.dumps(document, allow_nan=False))


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
    with _connect(settings) as conn:
        cur = conn.cursor()
        cur.execute(args.sql)
        columns = [d[0] for d in cur.description] if cur.description else []
        rows = cur.fetchall() if cur.description else []
        provenance = cur.provenance
    if args.json:
        _print_json(
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


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from cache.tools.demo import run_demo  # (SQLAlchemy: only the demo needs it at start)

    return run_demo(settings)


def cmd_heartbeat(settings: Settings, args: argparse.Namespace) -> int:
    """Beat in the foreground until Ctrl-C or SIGTERM (exit 0); riding out backend
    outages (one line on stderr each)."""
    if not args.interval > 0:
        raise ProgrammingError(
            f"--interval must be a positive number of seconds, not {args.interval:g}"
        )
    dsn = settings.backend_dsn()
    heart = Heartbeat(dsn, args.interval, args.source)
    # the first beat here: an unreachable backend or a refused table is an error at once
    with connect_backend(dsn, autocommit=True) as conn:
        try:
            ensure_table(conn)
            beat(conn, args.source)
        except psycopg.Error as exc:
            raise translate(exc, "the heartbeat could not write its row") from exc
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: heart.stop())
    print(
        f"heartbeat: source {args.source!r} in {HEARTBEAT_TABLE} every {args.interval:g}s "
        f"at {redact(dsn)}; stop with Ctrl-C or SIGTERM",
        flush=True,
    )
    beats = heart.run(
        on_failure=lambda exc: print(
            f"mtcache: heartbeat: the backend is unreachable ({first_line(exc)}); retrying every "
            f"{args.interval:g}s",
            file=sys.stderr,
            flush=True,
        )
    )
    print(f"heartbeat stopped after {plural(beats + 1, 'beat')}", flush=True)
    return 0


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    """Serve the cache to PostgreSQL clients in the foreground until SIGTERM or Ctrl-C."""
    from cache.engine.engine import Engine, bound_seconds
    from cache.server.auth import (
        LOOPBACK_TRUST,
        AuthFile,
        AuthQuery,
        Login,
        Rules,
        backend_membership,
        tls_context,
    )
    from cache.server.limits import Limits
    from cache.server.server import (
        POOL_TIMEOUT,
        Server,
        ServerOptions,
        listen_socket,
        metrics_address,
    )

    if args.heartbeat is not None and not args.heartbeat > 0:
        raise ProgrammingError(
            f"--heartbeat must be a positive number of seconds, not {args.heartbeat:g}"
        )
    if not args.grace >= 0:
        raise ProgrammingError(f"--grace must be 0 or more seconds, not {args.grace:g}")
    rules = Rules.load(Path(args.hba)) if args.hba else LOOPBACK_TRUST
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ProgrammingError("give both --tls-cert and --tls-key, or neither")
    tls, binding = (
        tls_context(Path(args.tls_cert), Path(args.tls_key))
        if args.tls_cert is not None
        else (None, None)
    )
    if rules.needs_tls and tls is None:
        raise ProgrammingError(f"{rules.source} has hostssl rules: give --tls-cert and --tls-key")
    currency_bound = bound_seconds(args.currency_bound, "--currency-bound")
    if args.metrics is not None:
        metrics_address(args.metrics)  # (a bad or busy address fails now, in one line)
    limits = Limits(
        max_sessions=_positive(args.max_sessions, "--max-sessions"),
        max_sessions_per_role=_positive(args.max_sessions_per_role, "--max-sessions-per-role"),
        statement_timeout=_duration(args.statement_timeout, "--statement-timeout"),
        idle_in_transaction_timeout=_duration(
            args.idle_in_transaction_timeout, "--idle-in-transaction-timeout"
        ),
    )
    pool_size = _positive(args.pool_size, "--pool-size") or 0
    pool_timeout = _duration(args.pool_timeout, "--pool-timeout") or POOL_TIMEOUT
    verifiers: AuthFile | AuthQuery | None = (
        AuthFile(Path(args.auth_file)) if args.auth_file else None
    )
    _not_served(settings, "connect to it, or stop it first")
    sock = listen_socket(args.listen, rules)  # a busy port fails before anything starts
    try:
        backend = settings.backend_dsn()
        if verifiers is None and rules.challenges:
            verifiers = AuthQuery(backend, args.auth_query)
            verifiers.check()  # (a query the backend refuses fails now, in one line)
        login = Login(rules, verifiers, binding, member=backend_membership(backend))
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(asctime)s mtcache serve: %(message)s"
        )
        engine = Engine(
            backend,
            settings.cache_path,
            heartbeat=args.heartbeat,
            memory_limit=settings.memory_limit,
            threads=settings.threads,
            cache_size_limit=settings.cache_size_limit,
            doorkeeper_seconds=args.doorkeeper,
        )
    except BaseException:
        sock.close()
        raise
    try:
        options = ServerOptions(
            listen=args.listen,
            grace_seconds=args.grace,
            currency_bound=currency_bound,
            login=login,
            limits=limits,
            tls=tls,
            metrics=args.metrics,
            pool_size=pool_size,
            pool_timeout=pool_timeout,
            max_result_bytes=_positive(args.max_result_bytes, "--max-result-bytes"),
        )
        server = Server(engine, options, sock)
        server.install_signals()
        dsn = psycopg.conninfo.conninfo_to_dict(engine.backend)
        host, port = server.address
        user, dbname = (str(dsn[k]) if k in dsn else None for k in ("user", "dbname"))
        # the commands and connections that find the file served go through the server
        with published(settings.cache_path, host, port, user, dbname):
            print(
                f"mtcache serve: listening on {host}:{port} (cache {settings.cache_path}); "
                "stop with Ctrl-C or SIGTERM",
                file=sys.stderr,
                flush=True,
            )
            server.serve_forever()
    finally:
        engine.close()
    return 0


def _positive(value: int | None, option: str) -> int | None:
    if value is not None and value < 1:
        raise ProgrammingError(f"{option} must be at least 1, not {value}")
    return value


def _duration(text: str | None, option: str) -> float | None:
    """A duration option ('30 sec', '500 ms'; 0 or none: no limit)."""
    from cache.engine.engine import bound_seconds

    seconds = bound_seconds(text, option)
    return seconds if seconds else None


def cmd_stop(settings: Settings, args: argparse.Namespace) -> int:
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


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line too (exit 2, as argparse's), pointing at --help."""

    def error(self, message: str) -> t.NoReturn:
        _fail(f"{message} (see {self.prog} --help)", 2)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
    parser.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help="the memory the cache file's DuckDB may use, as 2GB (env "
        "MTCACHE_MEMORY_LIMIT; default: 80%% of the machine's)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="the threads the cache file's DuckDB may use (env "
        "MTCACHE_THREADS; default: every core)",
    )
    parser.add_argument(
        "--cache-size-limit",
        metavar="SIZE",
        help="the budget of the cached data's bytes, as 500MB: admissions, "
        "refreshes and the stream evict presence regions to stay within it "
        "(env MTCACHE_CACHE_SIZE_LIMIT; default: none)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = commands.add_parser("parse", help="parse a statement (no backend needed)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("sql", help=SQL_HELP)
    p.set_defaults(run=cmd_parse)

    p = commands.add_parser("explain", help="explain a query: its normalized C&C constraint")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("sql", help=SQL_HELP)
    p.set_defaults(run=cmd_explain)

    p = commands.add_parser("query", help="run a statement through the cache")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("sql", help=SQL_HELP)
    p.set_defaults(run=cmd_query)

    p = commands.add_parser("init", help="create the cache file and reflect the backend catalog")
    p.set_defaults(run=cmd_init)

    p = commands.add_parser("ddl", help="apply a cache schema script, all or nothing")
    p.add_argument("file", help="a .sql file of CREATE CONTROL TABLE / CREATE CACHED VIEW / DROP")
    p.set_defaults(run=cmd_ddl)

    for name, run, what in (
        ("admit", cmd_admit, "add control-key values and pull their regions"),
        ("evict", cmd_evict, "remove control-key values and their rows (cascading)"),
    ):
        p = commands.add_parser(name, help=what)
        p.add_argument("name", help="a control table")
        p.add_argument("values", nargs="+", metavar="VALUE", help="control-key values")
        p.add_argument("--json", action="store_true", help="print the report as JSON")
        if name == "admit":
            p.add_argument(
                "--allow-empty",
                action="store_true",
                help="admit presence keys the backend has no rows for (as empty "
                "regions) instead of refusing them",
            )
        p.set_defaults(run=run)

    p = commands.add_parser("refresh", help="refresh regions by their affected closure")
    p.add_argument("--view", help="a white cached view (default: every white view)")
    p.add_argument(
        "--key", action="append", help="a presence key of --view (comma-separated columns)"
    )
    p.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE)
    p.add_argument(
        "--spark-master",
        help="Spark master URL (env MTCACHE_SPARK_MASTER; default local[*])",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=cmd_refresh)

    p = commands.add_parser("status", help="views, regions, currency and counters")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument(
        "--view",
        action="append",
        help="list this view's regions even when it has more than 1,000 (again for "
        "more views; others with so many are summed up)",
    )
    p.set_defaults(run=cmd_status)

    p = commands.add_parser("demo", help="start the embedded backend and walk through examples")
    p.set_defaults(run=cmd_demo)

    for command in entry_points(group=COMMANDS):
        # commands other packages provide (experiments: `mtcache experiment`), which the
        # cache itself does not import
        command.load()(commands)

    p = commands.add_parser(
        "heartbeat", help="update the backend's heartbeat row every few seconds, in the foreground"
    )
    p.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL,
        help=f"seconds between beats (default {DEFAULT_INTERVAL:g})",
    )
    p.add_argument(
        "--source", default=DEFAULT_SOURCE, help=f"the row's name (default {DEFAULT_SOURCE!r})"
    )
    p.set_defaults(run=cmd_heartbeat)

    p = commands.add_parser(
        "serve",
        help="serve the cache to PostgreSQL clients (psql, JDBC, psycopg, ...) in the foreground",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:6432",
        help="HOST:PORT to listen on (default 127.0.0.1:6432; beyond loopback "
        "only with --hba rules that ask for a password)",
    )
    p.add_argument(
        "--heartbeat",
        type=float,
        metavar="SECONDS",
        help="also beat the backend's heartbeat row this often",
    )
    # (the option before the command, given after it too: the same destination, untouched
    # when absent here)
    p.add_argument(
        "--cache-size-limit",
        metavar="SIZE",
        default=argparse.SUPPRESS,
        help="as the option of that name before the command",
    )
    p.add_argument(
        "--doorkeeper",
        type=float,
        metavar="SECONDS",
        help="admit a missed presence key on its second miss within this many "
        "seconds, not its first (default: on the first)",
    )
    p.add_argument(
        "--currency-bound",
        metavar="DURATION",
        help="every session's default currency bound, e.g. '10 min' (a session "
        "changes it with SET CURRENCY BOUND; default: none, reads go to the "
        "backend unless they carry a clause)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="at shutdown, how long running statements may finish before they "
        "are cancelled (default 10)",
    )
    p.add_argument(
        "--hba",
        metavar="FILE",
        help="who may connect and how, a rule a line as in pg_hba.conf: TYPE "
        "(host, hostssl, hostnossl) DATABASE USER ADDRESS METHOD (trust for "
        "loopback only, reject, scram-sha-256, password over TLS); default: "
        "loopback clients trusted",
    )
    p.add_argument(
        "--auth-file",
        metavar="FILE",
        help='the roles\' SCRAM verifiers, a line each: "role" '
        '"SCRAM-SHA-256$..." (pgbouncer\'s auth_file; default: --auth-query)',
    )
    p.add_argument(
        "--auth-query",
        metavar="SQL",
        help="the query (one parameter, the role) that reads a role's verifier "
        "on the backend (default: from pg_authid, which needs a superuser)",
    )
    p.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="the server's certificate (PEM, with its chain): clients may use TLS",
    )
    p.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    p.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics, with /livez "
        "and /readyz (default: none)",
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        metavar="N",
        help="client sessions at once (more are refused with 53300; default: none)",
    )
    p.add_argument(
        "--max-sessions-per-role",
        type=int,
        metavar="N",
        help="client sessions at once per role (default: none)",
    )
    p.add_argument(
        "--statement-timeout",
        metavar="DURATION",
        help="a statement running longer is cancelled (57014), e.g. '30 sec'; the "
        "backend's statement_timeout for the sessions' remote statements too",
    )
    p.add_argument(
        "--idle-in-transaction-timeout",
        metavar="DURATION",
        help="a session idle inside a transaction block longer is ended (25P03), e.g. '10 min'",
    )
    p.add_argument(
        "--max-result-bytes",
        type=int,
        metavar="N",
        help="a result the cache answers whose rows take more than N bytes is "
        "refused with 54000 instead of held in the server (default: no limit)",
    )
    p.add_argument(
        "--pool-size",
        type=int,
        metavar="N",
        help="transaction pooling: the sessions of a role share N backend "
        "connections, each held for a transaction or a statement outside one "
        "(default: each session has its own)",
    )
    p.add_argument(
        "--pool-timeout",
        metavar="DURATION",
        help="with --pool-size, how long a statement waits for a free backend "
        "connection before it fails with 53300 (default '60 sec')",
    )
    p.set_defaults(run=cmd_serve)

    p = commands.add_parser("stop", help="stop the embedded PostgreSQL")
    p.set_defaults(run=cmd_stop)
    return parser


def _env_number(name: str) -> int | None:
    text = os.environ.get(name)
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ProgrammingError(f"{name} must be a number, not {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    # the backend pool retries in the background while the backend is down and logs each
    # attempt; the CLI says what matters in its one line
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    args = build_parser().parse_args(argv)
    try:
        read_statement(args)
        _check_text(vars(args))
        threads = args.threads if args.threads is not None else _env_number("MTCACHE_THREADS")
        settings = Settings(
            cache_path=Path(args.cache or os.environ.get("MTCACHE_CACHE") or DEFAULT_CACHE),
            backend=args.backend or os.environ.get("MTCACHE_BACKEND") or None,
            memory_limit=args.memory_limit or os.environ.get("MTCACHE_MEMORY_LIMIT") or None,
            threads=threads,
            cache_size_limit=args.cache_size_limit
            or os.environ.get("MTCACHE_CACHE_SIZE_LIMIT")
            or None,
        )
        return int(args.run(settings, args))
    except Error as exc:
        return _fail(f"{type(exc).__name__}: {exc}")
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except BrokenPipeError:
        # the reader went away (`mtcache status | head`): nothing more to say, to anyone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:  # a bug: still one line, never a traceback
        return _fail(
            f"InternalError: internal error ({type(exc).__name__}: {exc}): this is a bug in "
            "mtcache; please report it with the command that caused it"
        )


def _fail(message: str, code: int = 1) -> int:
    text = " ".join(message.split())  # one line, whatever the driver said
    print(f"mtcache: {text.encode('utf-8', 'backslashreplace').decode()}", file=sys.stderr)
    return code


def _check_text(arguments: dict[str, t.Any]) -> None:
    """Arguments are text: bytes the OS gave that are not UTF-8 (kept by Python as lone
    surrogates) are refused here, before they reach a parser or a driver."""
    for name, value in arguments.items():
        if not isinstance(value, str):
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raw = value.encode("utf-8", "surrogateescape")
            offset = len(value[: exc.start].encode("utf-8", "surrogateescape"))
            raise ProgrammingError(
                f"the {name} argument is not valid UTF-8 text (byte 0x{raw[offset]:02x} at "
                f"offset {offset}): pass SQL and names as UTF-8"
            ) from None


if __name__ == "__main__":
    sys.exit(main())
