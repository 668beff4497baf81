"""`mtcache experiment NAME`: the command this package adds to the cache's CLI, through the
``mtcache.commands`` entry point pyproject.toml declares (the cache does not import the
experiments; they import the cache)."""

from __future__ import annotations

import argparse
import importlib.util
import typing as t
from pathlib import Path

from cache.tools.settings import Settings
from experiments.runs import EXPERIMENTS, QUICK_SF
from sql_ext.errors import ProgrammingError


def register(commands: t.Any) -> None:
    """Add ``experiment`` to the CLI's subcommands (argparse's sub-parsers action)."""
    p = commands.add_parser(
        "experiment",
        help="run an experiment: CSV, plots and a markdown report (chaos: the C&C checker)",
    )
    p.add_argument(
        "name",
        choices=[*EXPERIMENTS, "all", "chaos", "differential"],
        help="an experiment (experiments/runs/), all of them (not chaos or "
        "differential), chaos: the randomized concurrent C&C checker "
        "(experiments/chaos/), or differential: random queries compared with "
        "PostgreSQL's answers (experiments/differential/)",
    )
    p.add_argument(
        "--sf", type=float, help=f"TPC-H scale factor (default 1; {QUICK_SF:g} with --quick)"
    )
    p.add_argument("--quick", action="store_true", help="small data, short scales")
    p.add_argument(
        "--out",
        default="mtcache-experiments",
        help="directory for the CSV, plots and report.md (default ./mtcache-experiments)",
    )
    p.add_argument(
        "--from-csv",
        action="store_true",
        help="measure nothing: draw the plots "
        "and report.md again from the CSVs a run left in --out",
    )
    p.add_argument("--minutes", type=float, default=1.0, help="chaos: how long (default 1)")
    p.add_argument(
        "--seed",
        type=int,
        help="chaos, differential: reproduce a run's choices "
        "(differential: its first seed, default 1)",
    )
    p.add_argument(
        "--queries",
        type=int,
        default=2000,
        help="differential: how many random queries (default 2000)",
    )
    p.add_argument("--no-spark", action="store_true", help="chaos: refresh inline only")
    p.add_argument(
        "--wire",
        action="store_true",
        help="chaos: the cache as `mtcache serve`, its clients over the protocol, "
        "a faulty network between it and the backend",
    )
    p.set_defaults(run=cmd_experiment)


def cmd_experiment(settings: Settings, args: argparse.Namespace) -> int:
    # the experiments ship with the package; loaded when asked (registering the command, for
    # every `mtcache --help`, imports no driver)
    from rich.console import Console

    from cache.backend.embedded_pg import EmbeddedPostgres

    if (
        args.name not in ("chaos", "differential")
        and importlib.util.find_spec("matplotlib") is None
    ):
        raise ProgrammingError(
            "the experiments draw with matplotlib: pip install 'mtcache[experiments]'"
        )
    if args.name == "differential":
        from experiments.differential import run as differential

        if args.queries <= 0:
            raise ProgrammingError(f"--queries must be positive, not {args.queries}")
        return differential.main(
            ["--queries", str(args.queries), "--seed", str(args.seed or 1), "--out", args.out],
            backend=settings.backend,
            embedded=settings.embedded_root,
        )
    if args.name == "chaos":
        from experiments import chaos

        if args.minutes <= 0:
            raise ProgrammingError(f"--minutes must be positive, not {args.minutes:g}")
        backend = (
            ["--backend", settings.backend]
            if settings.backend
            else ["--embedded", str(settings.embedded_root)]
        )
        return chaos.main(
            [
                "--seconds",
                str(args.minutes * 60),
                *backend,
                *(["--seed", str(args.seed)] if args.seed is not None else []),
                *(["--no-spark"] if args.no_spark else []),
                *(["--wire"] if args.wire else []),
            ]
        )
    from experiments import runs
    from experiments.runs.framework import Context

    if args.from_csv:  # no measuring, no backend: the run's CSVs drawn again
        try:
            report = runs.redraw([args.name], Path(args.out))
        except FileNotFoundError as exc:
            raise ProgrammingError(str(exc)) from None
        print(f"report: {report}")
        return 0
    sf = args.sf if args.sf is not None else runs.QUICK_SF if args.quick else 1.0
    if not 0 < sf <= 100:
        raise ProgrammingError(f"--sf must be a TPC-H scale factor in (0, 100], not {sf:g}")
    if settings.backend:
        dsn = settings.backend  # TPC-H is loaded there (replacing other scale factors' tables)
    else:  # a database per scale factor on the embedded cluster: no reloading between runs
        cluster = EmbeddedPostgres(settings.embedded_root)
        cluster.ensure_running()
        dsn = cluster.ensure_database("tpch_sf" + f"{sf:g}".replace(".", "_"))
    ctx = Context(dsn=dsn, sf=sf, quick=args.quick, out=Path(args.out), console=Console())
    report = runs.run([args.name], ctx)
    print(f"report: {report}")
    return 0
