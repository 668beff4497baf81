"""Provenance of a benchmark run and tidy CSV output (one row per measurement)."""

from __future__ import annotations

import csv
import datetime as dt
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def provenance() -> dict[str, str]:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except OSError:
        sha = ""
    versions = {}
    for package in ("duckdb", "psycopg", "pyarrow", "pyspark", "sqlglot"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = ""
    return {
        "run_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git_sha": sha or "unknown",
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "python": platform.python_version(),
        **{f"{k}_version": v for k, v in versions.items()},
    }


def append_rows(name: str, rows: list[dict[str, Any]]) -> Path:
    """Append rows (each merged with the run's provenance) to results/<name>.csv."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.csv"
    stamp = provenance()
    records = [{**row, **stamp} for row in rows]
    fields: list[str] = []  # (rows of several kinds: every field any of them has)
    kept: list[dict[str, str]] = []
    if path.exists():
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            fields = list(reader.fieldnames or [])
            kept = list(reader)
    known = list(fields)
    for record in records:
        fields += [f for f in record if f not in fields]
    if fields != known:  # fields the file lacks: it is written again, widened
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields, restval="")
            writer.writeheader()
            writer.writerows(kept)
    with path.open("a", newline="") as handle:
        csv.DictWriter(handle, fieldnames=fields, restval="").writerows(records)
    return path
