"""The architecture holds (STYLE 13): pyproject.toml's import-linter contracts - each layer
imports only the layers below it (sql_ext -> control_tables -> optimizer -> heartbeat ->
store/backend -> execution/maintenance -> DB-API -> tools -> experiments, which the cache never
imports: `mtcache experiment` is the experiments' entry point), and no package's modules or
subpackages import each other in a cycle."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    assert lint.exists(), f"{lint} is missing: install the project with its dev extra"
    result = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout
