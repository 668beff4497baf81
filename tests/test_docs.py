"""The documentation points only at what the repository holds: every file or module path a
README or docs page names in backticks, and every relative link, exists; docs/architecture.md
names each module of its walk once (no database)."""

from __future__ import annotations

import collections
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
TOP = (
    "cache",
    "optimizer",
    "control_tables",
    "heartbeat",
    "sql_ext",
    "tests",
    "experiments",
    "docs",
    "deploy",
)
PATH = re.compile(r"`((?:" + "|".join(TOP) + r")/[A-Za-z0-9_/.-]*[A-Za-z0-9_/])`")
_MADE = "experiments/results/"  # (what the benchmarks write when run: not in the repository)
LINK = re.compile(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)")  # (relative: a URL has a colon)


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_named_paths_exist() -> None:
    missing = [
        f"{page.relative_to(ROOT)}: {found}"
        for page in _pages()
        for found in PATH.findall(page.read_text())
        if not (ROOT / found).exists() and not found.startswith(_MADE)
    ]
    assert missing == []


def test_links_resolve() -> None:
    missing = [
        f"{page.relative_to(ROOT)}: {link}"
        for page in _pages()
        for link in LINK.findall(page.read_text())
        if not (page.parent / link).exists()
    ]
    assert missing == []


def test_the_architecture_walk_names_each_module_once() -> None:
    named = collections.Counter(PATH.findall((ROOT / "docs" / "architecture.md").read_text()))
    assert len(named) > 50
    assert [path for path, times in named.items() if times > 1] == []
