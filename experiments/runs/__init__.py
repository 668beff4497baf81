"""`mtcache experiment NAME`: the dissertation's experiments as runs (experiments/runs/
framework.py says what a run writes). Each experiment is a module here; ``all`` runs every one
in the order below into one report."""

from __future__ import annotations

import importlib
import typing as t
from pathlib import Path

if t.TYPE_CHECKING:  # the CLI reads the names below on every call: nothing heavy at import
    from experiments.runs.framework import Context, Experiment

# in the order `all` runs them (the dissertation's)
EXPERIMENTS = [
    "workload-shift",
    "plan-choices",
    "guard-overhead",
    "consistency-guards",
    "tpch",
    "derived-views",
]
QUICK_SF = 0.01  # --quick without --sf: small data


def load(name: str) -> Experiment:
    module = importlib.import_module(f"experiments.runs.{name.replace('-', '_')}")
    return t.cast("Experiment", module)


def redraw(names: list[str], out: Path) -> Path:
    """Draw the plots and the report of a run again from its CSVs in ``out``."""
    from experiments.runs.framework import write_report

    chosen = EXPERIMENTS if names == ["all"] else names
    return write_report([load(n) for n in chosen], out)


def run(names: list[str], ctx: Context) -> Path:
    """Run the named experiments (``all``: every one); the report's path."""
    from experiments.runs.framework import run_all

    chosen = EXPERIMENTS if names == ["all"] else names
    return run_all([load(n) for n in chosen], ctx)
