"""The `mtcache` command line's wiring: its arguments (`build_parser`: the options before the
command, each command's own, and the commands other packages add through the
``mtcache.commands`` entry point group), the settings read from them and the environment, and
`main`, which runs a command and turns any error into one line."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import typing as t
from importlib.metadata import entry_points, version
from pathlib import Path

from cache.config import configured_file, variable
from cache.defaults import (
    DEFAULT_CACHE,
    DEFAULT_ENGINE,
    ENGINES,
)
from cache.tools.settings import Settings
from heartbeat.defaults import DEFAULT_INTERVAL, DEFAULT_SOURCE
from sql_ext.errors import DataError, Error, ProgrammingError

# the entry point group of commands other packages add: each a function given the sub-parsers
COMMANDS = "mtcache.commands"


JSON_HELP = "print the JSON document (its shape: docs/json-outputs.md)"
SQL_HELP = "the statement; - reads it from standard input (a statement too long for an argument)"


Command = t.Callable[[Settings, argparse.Namespace], int]


def _command(module: str, name: str) -> Command:
    """A command's function, imported when it runs: building the parser (``--help``,
    ``--version``) imports no engine, driver or SQL parser."""

    def run(settings: Settings, args: argparse.Namespace) -> int:
        found: Command = getattr(importlib.import_module(f"cache.tools.cli.{module}"), name)
        return found(settings, args)

    return run


def read_statement(args: argparse.Namespace) -> None:
    """``-`` for the statement: read it from standard input."""
    if getattr(args, "sql", None) == "-":
        try:
            args.sql = sys.stdin.read()
        except UnicodeDecodeError as exc:
            raise DataError(f"the statement on standard input is not valid UTF-8 ({exc})") from None


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
    parser.add_argument("--version", action="version", version=f"mtcache {version('mtcache')}")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a TOML file of options (env MTCACHE_CONFIG): the long options as keys, a "
        "command's in a table of its name ([serve]); a flag, then MTCACHE_<KEY>, then the "
        "file, then the default",
    )
    parser.add_argument(
        "--backend",
        help="PostgreSQL DSN or URL (env MTCACHE_BACKEND; default: the embedded cluster)",
    )
    parser.add_argument(
        "--cache", help=f"the cache's DuckDB file (env MTCACHE_CACHE; default {DEFAULT_CACHE})"
    )
    parser.add_argument(
        "--server",
        metavar="URL",
        help="go through this cache server (mtcache serve; a URL, conninfo or HOST:PORT) "
        "instead of opening the cache file: the commands from any machine that reaches it "
        "(env MTCACHE_SERVER; default: the server serving the cache file here, if any)",
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
    parser.add_argument(
        "--spark-master",
        metavar="URL",
        help="where refreshes on Spark run: local[*], a standalone cluster's spark://HOST:PORT "
        "or a Spark Connect server's sc://HOST:PORT (env MTCACHE_SPARK_MASTER; default "
        "local[*])",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = commands.add_parser("parse", help="parse a statement (no backend needed)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("sql", help=SQL_HELP)
    p.set_defaults(run=_command("query", "cmd_parse"))

    p = commands.add_parser("explain", help="explain a query: its normalized C&C constraint")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("sql", help=SQL_HELP)
    p.set_defaults(run=_command("query", "cmd_explain"))

    p = commands.add_parser("query", help="run a statement through the cache")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("sql", help=SQL_HELP)
    p.set_defaults(run=_command("query", "cmd_query"))

    p = commands.add_parser("init", help="create the cache file and reflect the backend catalog")
    p.set_defaults(run=_command("admin", "cmd_init"))

    p = commands.add_parser("ddl", help="apply a cache schema script, all or nothing")
    p.add_argument("file", help="a .sql file of CREATE CONTROL TABLE / CREATE CACHED VIEW / DROP")
    p.set_defaults(run=_command("admin", "cmd_ddl"))

    for name, run, what in (
        ("admit", _command("admin", "cmd_admit"), "add control-key values and pull their regions"),
        (
            "evict",
            _command("admin", "cmd_evict"),
            "remove control-key values and their rows (cascading)",
        ),
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
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default=DEFAULT_ENGINE,
        help="auto (the default): inline unless a pull is large enough for Spark to pay and "
        "Spark is installed; or always inline, or always spark",
    )
    p.add_argument(
        "--spark-master",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="as the option of that name before the command",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=_command("admin", "cmd_refresh"))

    p = commands.add_parser("status", help="views, regions, currency and counters")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument(
        "--view",
        action="append",
        help="list this view's regions even when it has more than 1,000 (again for "
        "more views; others with so many are summed up)",
    )
    p.set_defaults(run=_command("status", "cmd_status"))

    p = commands.add_parser(
        "advise",
        help="what to cache: the statements the backend answered, why, and the cache DDL that "
        "would answer them",
    )
    p.add_argument("--json", action="store_true", help='print {"advice": [...]} as JSON')
    p.add_argument(
        "--apply",
        action="store_true",
        help="apply the suggestions that fit the size budget, as one all-or-nothing script",
    )
    p.set_defaults(run=_command("admin", "cmd_advise"))

    p = commands.add_parser("demo", help="start the embedded backend and walk through examples")
    p.set_defaults(run=_command("backend", "cmd_demo"))

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
    p.set_defaults(run=_command("backend", "cmd_heartbeat"))

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
        "--spark-master",
        metavar="URL",
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
        help="a statement running longer is cancelled (57014), e.g. '30s' or '30 sec' (a "
        "number alone is ms, as PostgreSQL's statement_timeout); the backend's "
        "statement_timeout for the sessions' remote statements too",
    )
    p.add_argument(
        "--idle-in-transaction-timeout",
        metavar="DURATION",
        help="a session idle inside a transaction block longer is ended (25P03), e.g. "
        "'10min' (a number alone is ms, as PostgreSQL's setting)",
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
    p.add_argument(
        "--seed-from",
        metavar="HOST:PORT",
        help="when the cache file does not exist yet, start it from this running cache "
        "server's copy (as mtcache clone does) instead of pulling every view from the backend",
    )
    p.set_defaults(run=_command("serve", "cmd_serve"))

    p = commands.add_parser(
        "clone",
        help="make a new cache file from a running cache server's consistent copy (its "
        "views, control tables and regions at one stream position), then catch up on its own",
    )
    p.add_argument(
        "--from",
        dest="peer",
        required=True,
        metavar="HOST:PORT",
        help="the cache server to copy (HOST:PORT, a conninfo or URL; in front of --backend)",
    )
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(run=_command("admin", "cmd_clone"))

    p = commands.add_parser(
        "doctor",
        help="check the backend against what the cache needs (wal_level, replication, "
        "slots, the heartbeat table, pg_authid) and name each change to make",
    )
    p.add_argument("--json", action="store_true", help="print the requirements as JSON")
    p.set_defaults(run=_command("doctor", "cmd_doctor"))

    p = commands.add_parser(
        "psql",
        help="run psql on the backend (the embedded one by default), or through the "
        "cache's running server with --server",
        description="Run psql on the backend (the embedded PostgreSQL unless --backend "
        "names another), or with --server through the server that serves the cache file "
        "(mtcache serve). Every other argument goes to psql as it is, in its order "
        "(mtcache psql -v ON_ERROR_STOP=1 -f setup.sql -c 'SELECT 1'), and so does anything "
        "after --.",
    )
    p.add_argument(
        "--server",
        dest="through_server",
        action="store_true",
        help="connect through the cache server (the one serving the cache file, or the global "
        "--server) instead of the backend",
    )
    p.add_argument(
        "--dsn",
        dest="print_dsn",
        action="store_true",
        help="print the connection URL instead of running psql",
    )
    p.set_defaults(run=_command("backend", "cmd_psql"), psql_args=[])

    p = commands.add_parser("stop", help="stop the embedded PostgreSQL")
    p.set_defaults(run=_command("backend", "cmd_stop"))
    return parser


# (flags of one run, not settings: no MTCACHE_<KEY>, no key in the file)
_NOT_OPTIONS = ("help", "version", "config", "command", "run", "through_server", "print_dsn")
_PSQL_OWN = ("--server", "--dsn", "--help")  # `mtcache psql`'s own; the rest is psql's
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """A parser's long options that take a setting, by key (their dest)."""
    return {
        action.dest: action
        for action in parser._actions
        if action.option_strings and action.dest not in _NOT_OPTIONS
    }


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def settable(command: str | None = None) -> list[str]:
    """The keys a configuration file may hold: the global options (top level), or those of
    ``command`` (its table)."""
    parser = build_parser()
    return sorted(_options(parser if command is None else _commands(parser)[command]))


def _setting(action: argparse.Action, raw: t.Any, where: str) -> t.Any:
    """An option's value from the environment (text) or the file (TOML's types), as the
    option takes it; ``where`` it was given, for the message."""
    if isinstance(action, argparse._StoreTrueAction):
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in _TRUE + _FALSE:
            return raw.lower() in _TRUE
        raise ProgrammingError(f"{where} must be true or false, not {raw!r}")
    value: t.Any
    if action.type in (int, float):
        number = t.cast(t.Callable[[t.Any], t.Any], action.type)
        try:
            if isinstance(raw, bool) or not isinstance(raw, str | int | float):
                raise ValueError
            value = number(raw)
        except ValueError:
            raise ProgrammingError(f"{where} must be a number, not {raw!r}") from None
    elif isinstance(raw, str | int | float) and not isinstance(raw, bool):
        value = str(raw)  # (a duration or a size written as a number)
    else:
        raise ProgrammingError(f"{where} must be text or a number, not {raw!r}")
    if action.choices is not None and value not in action.choices:
        raise ProgrammingError(f"{where} must be one of {', '.join(map(str, action.choices))}")
    return value


def _given_config(argv: list[str]) -> str | None:
    for at, word in enumerate(argv):
        if word == "--config" and at + 1 < len(argv):
            return argv[at + 1]
        if word.startswith("--config="):
            return word.partition("=")[2]
    return None


def configure(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """The options' defaults from the environment (``MTCACHE_<KEY>``) and the configuration
    file (`cache.config`), for a flag to override; a key the file cannot hold refused with
    its line."""
    config = configured_file(_given_config(argv))
    commands = _commands(parser)
    scopes: list[tuple[str | None, argparse.ArgumentParser]] = [(None, parser)]
    scopes += list(commands.items())
    if config is not None:
        known = _options(parser)
        for key in config.values:
            if key not in known:
                raise ProgrammingError(
                    f"{config.where(key)}: no such option (the keys are the long options, "
                    f"{', '.join(sorted(known))}; a command's in a table of its name)"
                )
        for table, keys in config.tables.items():
            if table not in commands:
                raise ProgrammingError(
                    f"{config.path} line {config.line_of(table)}: [{table}] is no command "
                    f"(the tables are the commands' names: {', '.join(sorted(commands))})"
                )
            own = _options(commands[table])
            for key in keys:
                if key not in own:
                    raise ProgrammingError(
                        f"{config.where(key, table)}: mtcache {table} has no such option "
                        f"({', '.join(sorted(own))})"
                    )
    for command, scope in scopes:
        defaults: dict[str, t.Any] = {}
        for key, action in _options(scope).items():
            env = os.environ.get(variable(key))
            if env:
                defaults[key] = _setting(action, env, variable(key))
            elif config is not None:
                values = config.values if command is None else config.tables.get(command, {})
                if key in values:
                    defaults[key] = _setting(action, values[key], config.where(key, command))
        scope.set_defaults(**defaults)


def main(argv: list[str] | None = None) -> int:
    # the backend pool retries in the background while the backend is down and logs each
    # attempt; the CLI says what matters in its one line
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    parser = build_parser()
    try:
        configure(parser, list(sys.argv[1:] if argv is None else argv))
    except Error as exc:
        return _fail(f"{type(exc).__name__}: {exc}")
    args = parse_arguments(parser, list(sys.argv[1:] if argv is None else argv))
    try:
        read_statement(args)
        _check_text(vars(args))
        settings = Settings(
            cache_path=Path(args.cache or DEFAULT_CACHE),
            backend=args.backend or None,
            memory_limit=args.memory_limit or None,
            threads=args.threads,
            cache_size_limit=args.cache_size_limit or None,
            spark_master=args.spark_master or None,
            server=args.server or None,
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


def parse_arguments(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The command line's arguments (`mtcache psql`'s own split from psql's first)."""
    words, psql_args = _psql_split(parser, argv)
    args = parser.parse_args(words)
    if psql_args is not None:
        args.psql_args = psql_args
    return args


def _psql_split(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[list[str], list[str] | None]:
    """(the arguments for mtcache, psql's own): after the command `psql`, every argument but
    `--server`, `--dsn` and `--help` is psql's, in its order (a `--` ends ours); None: another
    command."""
    valued = {
        flag for action in parser._actions if action.nargs != 0 for flag in action.option_strings
    }
    at = 0
    while at < len(argv):
        word = argv[at]
        if word in valued:
            at += 2
        elif word.startswith("-"):
            at += 1
        elif word != "psql":
            return argv, None
        else:
            rest = argv[at + 1 :]
            end = rest.index("--") if "--" in rest else len(rest)
            ours = [w for w in rest[:end] if w in _PSQL_OWN]
            theirs = [w for w in rest[:end] if w not in _PSQL_OWN] + rest[end + 1 :]
            return [*argv[: at + 1], *ours], theirs
    return argv, None


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
