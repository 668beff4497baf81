"""A long fuzzing run: tests/experiments/test_fuzz.py's properties with many more examples
(issue 10).

    python -m experiments.fuzz [--scale 50] [--seed N]

Runs the properties of tests/experiments/test_fuzz.py (parser, clauses, DDL scripts, queries with
parameters against PostgreSQL, control keys, the CLI) through pytest with ``--scale`` times the
examples of the short run in ``make test``, drawing new inputs from ``--seed`` (random when not
given; printed, so a failing run can be repeated). Prints the examples run per property and
in all, and the failures (0 is the only passing number). The short run needs the same
PostgreSQL the tests start; so does this (pytest's session cluster).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from experiments.provenance import append_rows

ROOT = Path(__file__).resolve().parents[1]
_PROPERTY = re.compile(r"^tests/test_fuzz\.py::(\w+):")
_COUNTS = re.compile(r"- (\d+) passing, (\d+) failing, and (\d+) invalid")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale",
        type=float,
        default=50.0,
        help="examples per property, as a multiple of the short run's",
    )
    parser.add_argument("--seed", type=int, help="hypothesis seed (default: a random one)")
    args = parser.parse_args(argv)
    console = Console()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    console.print(f"fuzzing at {args.scale:g}x the short run, seed {seed} ...")
    env = {**os.environ, "MTCACHE_FUZZ_SCALE": str(args.scale), "MTCACHE_FUZZ_RANDOM": "1"}
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/experiments/test_fuzz.py",
            "--hypothesis-show-statistics",
            f"--hypothesis-seed={seed}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    minutes = (time.monotonic() - started) / 60
    rows: list[dict[str, object]] = []
    current = None
    for line in result.stdout.splitlines():
        if (found := _PROPERTY.match(line.strip())) is not None:
            current = found.group(1)
        elif current and (counts := _COUNTS.search(line)) is not None:
            passing, failing, invalid = map(int, counts.groups())
            rows.append(
                {
                    "property": current,
                    "examples": passing + failing,
                    "failing": failing,
                    "invalid": invalid,
                    "seed": seed,
                    "scale": args.scale,
                }
            )
    table = Table(title=f"fuzzing, seed {seed}, {minutes:.1f} min")
    for column in ("property", "examples", "failing"):
        table.add_column(column, justify="left" if column == "property" else "right")
    for row in rows:
        table.add_row(str(row["property"]), str(row["examples"]), str(row["failing"]))
    console.print(table)
    total = sum(int(str(row["examples"])) for row in rows)
    failures = result.returncode != 0
    console.print(
        f"{total} examples in all; pytest exit {result.returncode}"
        + (" - FAILURES:" if failures else ", 0 failures, 0 tracebacks")
    )
    if failures:
        console.print(result.stdout[-6000:], markup=False)
        console.print(result.stderr[-2000:], markup=False)
    append_rows("fuzz", rows)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
