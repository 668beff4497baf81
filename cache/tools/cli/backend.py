"""`mtcache demo`, `heartbeat`, `psql` and `stop`: the commands about the backend itself (the
embedded PostgreSQL a demo starts, `psql` opens and `stop` stops, the heartbeat row beaten in
the foreground)."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys

import psycopg

from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.reflect import connect_backend, redact
from cache.store.served import served_at
from cache.tools.cli.access import server_target
from cache.tools.settings import Settings
from heartbeat.beat import TABLE as HEARTBEAT_TABLE
from heartbeat.beat import Heartbeat, beat, ensure_table
from sql_ext.errors import ProgrammingError, first_line, translate
from sql_ext.nodes import plural


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


def cmd_psql(settings: Settings, args: argparse.Namespace) -> int:
    """psql on the backend, or through the cache server (``--server``, or the global one);
    ``--dsn``: the connection string printed instead."""
    if args.through_server or settings.server:
        if settings.server:
            dsn = server_target(settings)
        else:
            served = served_at(settings.cache_path)
            if served is None:
                raise ProgrammingError(
                    f"no server serves {settings.cache_path}: start one with `mtcache serve` "
                    "(or leave out --server to reach the backend)"
                )
            dsn = served.url
    else:
        dsn = settings.backend_dsn()
    if args.print_dsn:
        print(dsn)
        return 0
    psql = shutil.which("psql")
    if psql is None:
        raise ProgrammingError(
            "psql is not installed (Debian: apt-get install postgresql-client); connect "
            "with another client to the URL `mtcache psql --dsn` prints"
        )
    sys.stdout.flush()
    # (the connection string first: psql reads its first word that is no option's as the
    # database, and a later -d or conninfo overrides it)
    os.execv(psql, [psql, "--dbname", dsn, *args.psql_args])


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
