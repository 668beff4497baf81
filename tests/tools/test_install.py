"""What installing the product brings (no database; pip resolves from the package index): the
cache, the DB-API, the CLI and the server, without Spark or the experiments' libraries, which
their extras bring."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.paths import ROOT


def _installs(target: str, tmp_path: Path) -> set[str]:
    """The distributions ``pip install target`` would install into an empty environment."""
    report = tmp_path / f"report-{len(list(tmp_path.iterdir()))}.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--disable-pip-version-check",
            "--report",
            str(report),
            target,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(report.read_text())["install"]
    return {item["metadata"]["name"].lower().replace("_", "-") for item in found}


def test_the_product_installs_without_spark_or_the_experiments_libraries(
    tmp_path: Path,
) -> None:
    product = _installs(str(ROOT), tmp_path)
    assert {"mtcache", "duckdb", "psycopg", "sqlglot", "sqlalchemy"} <= product
    assert not product & {"pyspark", "py4j", "matplotlib", "tpchgen-cli"}, product
    with_spark = _installs(f"{ROOT}[spark]", tmp_path)
    assert "pyspark" in with_spark and not with_spark & {"matplotlib", "tpchgen-cli"}
    with_experiments = _installs(f"{ROOT}[experiments]", tmp_path)
    assert {"matplotlib", "tpchgen-cli"} <= with_experiments and "pyspark" not in with_experiments
