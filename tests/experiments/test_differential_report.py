"""The oracle's report (experiments/differential/run.py), without a database: each family's
local shares, with and without the remote answers no engine but PostgreSQL's own plan can give
(sums and averages of doubles)."""

from __future__ import annotations

from pathlib import Path

from experiments.differential.run import Report, write
from experiments.differential.shapes import Select


def test_a_familys_share_is_also_given_without_sums_of_doubles(tmp_path: Path) -> None:
    report = Report()
    query = Select(["sum(n.n_nationkey)"], "nation n", kind="aggregate")
    routes = [("local", False), ("local", False), ("remote", True), ("remote", False)]
    for route, doubles in routes:
        report.queries += 1
        report.routes["guarded"][route] += 1
        report.count_route(query, "guarded", route, doubles)
        report.count_route(query, "cost", "remote")
    text = write(report, tmp_path, 1).read_text()
    row = next(line for line in text.splitlines() if line.startswith("| aggregate |"))
    # 2 of 4 answered locally; 2 of the 3 that are not sums of doubles
    assert row == "| aggregate | 4 | 2 | 50.0% | 0 | 0.0% | 66.7% |"
