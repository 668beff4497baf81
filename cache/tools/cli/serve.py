"""`mtcache serve`: the cache served to PostgreSQL clients in the foreground, its options
checked before anything starts."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

import psycopg

from cache.store.served import published
from cache.tools.cli.access import not_served
from cache.tools.settings import Settings
from sql_ext.errors import ProgrammingError

MS = 0.001  # a millisecond, the unit of PostgreSQL's time settings


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
    from cache.server.options import (
        POOL_TIMEOUT,
        ServerOptions,
        listen_socket,
        metrics_address,
    )
    from cache.server.server import Server

    # (a `server` setting, from MTCACHE_SERVER or a file shared with the clients' commands,
    # names this server for those commands: the server itself opens the file)
    settings = dataclasses.replace(settings, server=None)
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
        # (named after PostgreSQL's settings: a number alone is in their unit, ms)
        statement_timeout=duration_option(args.statement_timeout, "--statement-timeout", MS),
        idle_in_transaction_timeout=duration_option(
            args.idle_in_transaction_timeout, "--idle-in-transaction-timeout", MS
        ),
    )
    pool_size = _positive(args.pool_size, "--pool-size") or 0
    pool_timeout = duration_option(args.pool_timeout, "--pool-timeout") or POOL_TIMEOUT
    verifiers: AuthFile | AuthQuery | None = (
        AuthFile(Path(args.auth_file)) if args.auth_file else None
    )
    not_served(settings, "connect to it, or stop it first")
    sock = listen_socket(args.listen, rules)  # a busy port fails before anything starts
    if args.seed_from and not settings.cache_path.exists():
        from cache.tools.seeding import clone

        try:
            seeded = clone(args.seed_from, settings.cache_path, settings.backend_dsn())
        except BaseException:
            sock.close()
            raise
        print(
            f"mtcache serve: seeded {seeded.path} from {args.seed_from} "
            f"({seeded.bytes:,} bytes, {seeded.seconds:.2f}s)",
            file=sys.stderr,
            flush=True,
        )
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
            spark_master=settings.spark_master,
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
            metrics = ""
            if server.metrics is not None:
                mhost, mport = server.metrics.address
                shown = f"[{mhost!s}]" if ":" in str(mhost) else str(mhost)
                metrics = f"; metrics on http://{shown}:{mport}/metrics"
            print(
                f"mtcache serve: listening on {host}:{port} (cache {settings.cache_path}"
                f"{metrics}); stop with Ctrl-C or SIGTERM",
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


def duration_option(text: str | None, option: str, bare: float | None = None) -> float | None:
    """A duration option ('30 sec', '500ms'; 0 or none: no limit); ``bare``: the unit of a
    number alone (an option named after a PostgreSQL setting reads it as that setting)."""
    from cache.engine.engine import bound_seconds

    seconds = bound_seconds(text, option, bare)
    return seconds if seconds else None
