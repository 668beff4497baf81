"""What every experiment run shares: the context it runs in, tidy CSV rows with provenance,
plots made only from that CSV, and one markdown report.

An experiment is a module with ``NAME``, ``TITLE`` and three functions:

- ``run(ctx) -> list[dict]``: measure; one dict per measurement (tidy: one value per row and
  column, named by its columns). Progress bars (`Context.progress`) on every step that takes
  more than a second.
- ``plot(rows, out) -> list[Path]``: PNG files made from the rows *as read back from the CSV*
  (strings), so that a plot never shows what the CSV does not hold.
- ``report(rows, plots) -> str``: its markdown section: the dissertation's figures beside ours,
  a one-line verdict per row.
"""

from __future__ import annotations

import csv
import math
import typing as t
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from experiments.provenance import provenance

Row = dict[str, t.Any]
Read = dict[str, str]  # a row as the CSV gives it back


class Experiment(t.Protocol):
    NAME: str
    TITLE: str

    def run(self, ctx: Context) -> list[Row]: ...

    def plot(self, rows: list[Read], out: Path) -> list[Path]: ...

    def report(self, rows: list[Read], plots: list[Path]) -> str: ...


@dataclass
class Context:
    """Where and how an experiment runs: the backend (TPC-H loaded there as it needs), the
    scale factor, quick or full, the output directory."""

    dsn: str
    sf: float
    quick: bool
    out: Path
    console: Console

    @contextmanager
    def progress(self, description: str, total: int) -> Iterator[Callable[[str], None]]:
        """A progress bar of ``total`` steps; the callable marks one done and names the next."""
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
        ) as bar:
            task = bar.add_task(description, total=total)

            def done(next_step: str) -> None:
                bar.update(task, advance=1, description=f"{description}: {next_step}")

            yield done


def write_rows(path: Path, name: str, rows: list[Row], context: Row) -> Path:
    """The rows as tidy CSV, each with the run's provenance (git sha, versions, machine) and
    ``context`` (scale factor, quick)."""
    stamp = {"experiment": name, **context, **provenance()}
    records = [{**row, **stamp} for row in rows]
    fields: list[str] = []
    for record in records:
        fields += [f for f in record if f not in fields]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows({k: _cell(v) for k, v in r.items()} for r in records)
    return path


def _cell(value: t.Any) -> t.Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return "" if value is None else value


def read_rows(path: Path) -> list[Read]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def number(value: str) -> float | None:
    """A CSV cell as a number (None when empty)."""
    return float(value) if value not in ("", None) else None


def figure(width: float = 10, height: float = 4, columns: int = 1) -> tuple[t.Any, t.Any]:
    """A matplotlib figure and its axes (one per column, side by side), drawn off-screen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, columns, figsize=(width, height))


def save(drawn: t.Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    drawn.tight_layout()
    drawn.savefig(path, dpi=110)
    plt.close(drawn)
    return path


def scale_of(rows: list[Read]) -> str:
    """The scale factor the rows were measured at (as their CSV says)."""
    return rows[0].get("scale_factor", "?") if rows else "?"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def run_all(experiments: list[Experiment], ctx: Context) -> Path:
    """Run each experiment and write its CSV, then draw the plots and the one report from
    the CSVs; the report's path."""
    ctx.out.mkdir(parents=True, exist_ok=True)
    context = {"scale_factor": ctx.sf, "quick": ctx.quick}
    for experiment in experiments:
        ctx.console.print(f"[bold]{experiment.TITLE}[/bold]")
        rows = experiment.run(ctx)
        write_rows(ctx.out / f"{experiment.NAME}.csv", experiment.NAME, rows, context)
    return write_report(experiments, ctx.out)


def write_report(experiments: list[Experiment], out: Path) -> Path:
    """The plots and report.md of a run, from its CSVs in ``out`` (again, after a change of
    how they are drawn: `mtcache experiment ... --from-csv`); the report's path."""
    sections = []
    read: list[Read] = []
    for experiment in experiments:
        path = out / f"{experiment.NAME}.csv"
        if not path.exists():
            raise FileNotFoundError(
                f"{path} is missing: run `mtcache experiment {experiment.NAME}` into {out} first"
            )
        read = read_rows(path)
        plots = experiment.plot(read, out)
        body = experiment.report(read, plots)
        files = ", ".join(f"[{p.name}]({p.name})" for p in [path, *plots])
        sections.append(f"## {experiment.TITLE}\n\n{body.strip()}\n\nData and plots: {files}\n")
    first = read[0] if read else {}
    stamp = {k: first.get(k, "") for k in provenance()}  # the run's, as its CSV holds it
    sf, quick = first.get("scale_factor", "?"), first.get("quick") == "True"
    header = (
        "# mtcache experiment report\n\n"
        f"Experiments: {', '.join(e.NAME for e in experiments)}; TPC-H scale factor {sf}"
        f"{' (quick run: small data, short scales)' if quick else ''}.\n\n"
        + markdown_table(["", ""], [[k, str(v)] for k, v in stamp.items()])
        + "\n"
    )
    report = out / "report.md"
    report.write_text("\n".join([header, *sections]))
    return report
