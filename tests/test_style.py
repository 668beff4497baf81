"""The code is formatted and linted as `make lint` checks it (ruff format, ruff check): a
formatter owns the layout, so nothing is exempt from it and no diff is about spacing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
_EXEMPTIONS = ("skip", "off")  # (the markers' words apart: this file does not carry one)
PACKAGES = ("cache", "optimizer", "control_tables", "heartbeat", "sql_ext", "experiments", "tests")


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    ruff = Path(sys.executable).parent / "ruff"
    assert ruff.exists(), f"{ruff} is missing: install the project with its dev extra"
    return subprocess.run(
        [str(ruff), *args, *PACKAGES], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_the_code_is_formatted() -> None:
    result = _ruff("format", "--check")
    assert result.returncode == 0, f"run `make format`:\n{result.stdout}{result.stderr}"


def test_the_code_passes_the_linter() -> None:
    result = _ruff("check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_nothing_is_exempt_from_the_formatter() -> None:
    marked = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if any(f"fmt: {word}" in line for word in _EXEMPTIONS)
    ]
    assert marked == [], marked
