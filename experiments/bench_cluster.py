"""Pulls beyond one machine: TPC-H lineitem pulled into a new cache file inline, on Spark in
the process (``local[*]``) and on a real standalone cluster on loopback with one and then two
workers; then a new cache server made by seeding from a running one against pulling every
view from the backend.

    python -m experiments.bench_cluster [--sf 1] [--backend DSN]

Each pull runs in a process of its own (the driver), whose peak memory is read from the
kernel (VmHWM of the Python process and of its Spark JVM); the Spark session is started
before the timed refresh, whose rows/s are one backend snapshot pulled, applied and
committed. The seeding part serves the inline pull's file with ``mtcache serve`` and times a
new file made by `mtcache clone` against one filled from the backend (the ``auto`` engine a
new server's scheduler uses); the rows the backend sent are pg_stat_statements' rows of the
pulls' COPY statements. Everything is measured in this one run, side by side (the machine has
two cores: the cluster's executors share them with the driver and the backend).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import typing as t
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

from cache.backend.reflect import fetch_catalog
from cache.maintenance.engines import Engine, InlineEngine
from cache.maintenance.pipeline import Maintainer, SizedEngine
from cache.store.cache_file import CacheStore
from experiments import tpch
from experiments.provenance import append_rows
from experiments.spark_cluster import StandaloneCluster
from sql_ext import parse

VIEW = "CREATE CACHED VIEW lineitem_copy AS SELECT * FROM lineitem REFRESH EVERY 1 HOUR"


def fresh_store(path: Path, dsn: str) -> CacheStore:
    for leftover in path.parent.glob(f"{path.name}*"):
        leftover.unlink()
    store = CacheStore(path)
    store.save_catalog(fetch_catalog(dsn))
    store.apply_ddl(parse(VIEW), store.load_catalog())
    return store


def _hwm_kib(pid: int | str) -> int:
    """A process's peak resident memory (VmHWM), KiB."""
    found = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(found.group(1)) if found else 0


def pull(master: str, dsn: str, path: Path) -> dict[str, t.Any]:
    """One refresh of lineitem_copy into a new file at ``path`` (``master``: inline, or a
    Spark master); its figures. Runs in the driver process of its own."""
    from cache.maintenance.spark import SparkEngine, child_processes, spark_session

    engine: Engine
    session_seconds = 0.0
    if master == "inline":
        engine = InlineEngine()
    else:
        began = time.perf_counter()
        spark_session(master)
        session_seconds = time.perf_counter() - began
        engine = SparkEngine(master)
    store = fresh_store(path, dsn)
    began = time.perf_counter()
    report = Maintainer(store, dsn, engine).refresh("lineitem_copy")
    seconds = time.perf_counter() - began
    row = store.con.execute("SELECT count(*) FROM lineitem_copy").fetchone()
    store.close()
    jvm = [p for p, command in child_processes(os.getpid()) if "SparkSubmit" in command]
    return {
        "rows": int(row[0]) if row else 0,
        "seconds": seconds,
        "session_seconds": session_seconds,
        "engine": report.engine,
        "python_peak_mib": _hwm_kib("self") / 1024,
        "jvm_peak_mib": sum(_hwm_kib(p) for p in jvm) / 1024,
    }


def in_driver(master: str, dsn: str, path: Path) -> dict[str, t.Any]:
    """`pull` in a new process (its own driver: its own peak memory)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.bench_cluster",
            "--pull",
            master,
            "--backend",
            dsn,
            "--file",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the pull on {master} failed:\n{done.stderr[-3000:]}")
    return t.cast(dict[str, t.Any], json.loads(done.stdout.strip().splitlines()[-1]))


def copy_rows(dsn: str) -> int:
    """Rows the backend sent in COPY statements (every pull is one) since the last reset."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(rows), 0) FROM pg_stat_statements WHERE query ILIKE 'COPY%'"
        ).fetchone()
    return int(row[0]) if row else 0


def reset_statements(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")


def seeding(dsn: str, peer_file: Path, work: Path) -> list[dict[str, t.Any]]:
    """A new server's file by seeding from a server of ``peer_file`` against from the
    backend: time to ready and the rows the backend sent, each."""
    from cache.tools.seeding import clone

    serve = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mtcache"),
            "--backend",
            dsn,
            "--cache",
            str(peer_file),
            "serve",
            "--listen",
            "127.0.0.1:0",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert serve.stderr is not None
    try:
        port = None
        for line in serve.stderr:
            found = re.search(r"listening on \S+:(\d+) ", line)
            if found:
                port = int(found.group(1))
                break
        if port is None:
            raise RuntimeError("the peer server did not start")
        results = []
        reset_statements(dsn)
        began = time.perf_counter()
        clone(f"127.0.0.1:{port}", work / "seeded.duckdb", dsn)
        results.append(
            {
                "how": "seeded from a running server",
                "seconds": time.perf_counter() - began,
                "backend_rows": copy_rows(dsn),
            }
        )
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
    reset_statements(dsn)
    began = time.perf_counter()
    store = fresh_store(work / "pulled.duckdb", dsn)
    engine = SizedEngine()  # what a new server's scheduler pulls with
    Maintainer(store, dsn, engine).refresh("lineitem_copy")
    store.close()
    results.append(
        {
            "how": f"pulled from the backend ({engine.name})",
            "seconds": time.perf_counter() - began,
            "backend_rows": copy_rows(dsn),
        }
    )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sf", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    parser.add_argument("--backend", help="PostgreSQL DSN (default: the embedded cluster)")
    parser.add_argument("--pull", help=argparse.SUPPRESS)  # (a driver process's one pull)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pull:
        print(json.dumps(pull(args.pull, args.backend, Path(args.file))))
        return 0
    console = Console()
    dsn = tpch.backend(args.backend)
    console.print(f"loading TPC-H lineitem at SF {args.sf} ...")
    rows = tpch.load(dsn, args.sf, ["lineitem"])["lineitem"]
    work = Path(tempfile.mkdtemp(prefix="mtcache-bench-cluster-"))
    cluster = StandaloneCluster(work / "spark", workers=1)
    figures: list[tuple[str, dict[str, t.Any]]] = []
    try:
        console.print(f"{rows:,} rows; pulling inline and on local[*] ...")
        figures.append(("inline", in_driver("inline", dsn, work / "inline.duckdb")))
        figures.append(("Spark local[*]", in_driver("local[*]", dsn, work / "local.duckdb")))
        cluster.start()
        console.print(f"standalone cluster at {cluster.url}, one worker ...")
        figures.append(("standalone, 1 worker", in_driver(cluster.url, dsn, work / "one.duckdb")))
        cluster.start_worker(1)
        cluster.workers = 2
        console.print("... two workers")
        figures.append(("standalone, 2 workers", in_driver(cluster.url, dsn, work / "two.duckdb")))
    finally:
        cluster.stop()
    table = Table(title=f"A pull of TPC-H lineitem SF {args.sf} ({rows:,} rows), one run each")
    for column in (
        "where",
        "s",
        "rows/s",
        "vs inline",
        "session start s",
        "driver peak MiB (Python + JVM)",
    ):
        table.add_column(column)
    base = figures[0][1]["seconds"]
    records = []
    for name, f in figures:
        assert f["rows"] == rows, f"{name} pulled {f['rows']} of {rows} rows"
        table.add_row(
            name,
            f"{f['seconds']:.1f}",
            f"{rows / f['seconds']:,.0f}",
            f"{f['seconds'] / base:.2f}x",
            f"{f['session_seconds']:.1f}",
            f"{f['python_peak_mib']:,.0f} + {f['jvm_peak_mib']:,.0f}",
        )
        records.append(
            {
                "experiment": "bench_cluster",
                "scale_factor": args.sf,
                "rows": rows,
                "method": name,
                **{k: round(v, 3) if isinstance(v, float) else v for k, v in f.items()},
            }
        )
    console.print(table)
    console.print("adding a server: seeding from a running one vs pulling from the backend ...")
    added = seeding(dsn, work / "inline.duckdb", work)
    second = Table(title="A new cache server with lineitem_copy ready")
    for column in ("how", "time to ready s", "rows the backend sent", "vs backend pull"):
        second.add_column(column)
    pulled = added[-1]["seconds"]
    for entry in added:
        second.add_row(
            entry["how"],
            f"{entry['seconds']:.1f}",
            f"{entry['backend_rows']:,}",
            f"{entry['seconds'] / pulled:.2f}x",
        )
        records.append(
            {
                "experiment": "bench_cluster",
                "scale_factor": args.sf,
                "rows": rows,
                "method": entry["how"],
                "seconds": round(entry["seconds"], 3),
                "backend_rows": entry["backend_rows"],
            }
        )
    console.print(second)
    console.print(f"results appended to {append_rows('bench_cluster', records)}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
