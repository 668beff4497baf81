"""The Spark refresh engine: pulls run as Spark tasks, each in its own backend session
joined to the coordinator's exported snapshot, so every task reads the same database state.

A large pull is split into block ranges of the backend table's heap (``ctid`` ranges: a TID
range scan each, PostgreSQL 14+), the last range open-ended so rows on pages added since the
statistics were taken are still read. Each task writes its rows as an Arrow IPC file in a
staging directory and returns the path; the driver maps the files and hands them to DuckDB
through Arrow. With a non-local master the staging directory must be shared (a network file
system) and the backend reachable from the executors.

One Spark session per process, created on first use and reused by every refresh. Spark is
driven from a thread of its own (`_interruptible`): py4j blocks its caller in a socket read,
which Ctrl-C cannot interrupt cleanly (Spark's own SIGINT handler then calls into the JVM
from inside that read). The caller waits instead, so Ctrl-C reaches it at once: the jobs are
cancelled (or the JVM still starting is stopped) and KeyboardInterrupt goes on up, before
anything was written to the cache.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import typing as t
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pyarrow as pa
from psycopg import sql

from cache.backend.copy_arrow import copy_to_arrow
from cache.maintenance import faults
from cache.maintenance.engines import Coordinator, PullQuery
from sql_ext.errors import OperationalError

DEFAULT_MASTER = "local[*]"
LOG_CONFIG = Path(__file__).with_name("spark-log4j2.properties")

_sessions: dict[str, object] = {}
_lock = threading.Lock()


T = t.TypeVar("T")


def spark_session(master: str = DEFAULT_MASTER) -> object:
    """The process's Spark session for a master URL (created once, then reused)."""
    return _interruptible(lambda: _session(master), _stop_starting_jvm)


def _session(master: str) -> object:
    with _lock:
        session = _sessions.get(master)
        if session is None:
            # Executors run this interpreter, so they import the same mtcache and libraries.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            from pyspark.sql import SparkSession

            session = (
                SparkSession.builder.master(master)
                .appName("mtcache-refresh")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                # Local mode stays on the loopback interface.
                .config("spark.driver.host", "127.0.0.1")
                .config("spark.driver.bindAddress", "127.0.0.1")
                .config("spark.driver.extraJavaOptions", f"-Dlog4j.configurationFile={LOG_CONFIG}")
                .getOrCreate()
            )
            _sessions[master] = session
        return session


def stop_sessions() -> None:
    with _lock:
        for session in _sessions.values():
            session.stop()  # type: ignore[attr-defined]
        _sessions.clear()


@dataclass(frozen=True)
class TaskSpec:
    dsn: str
    snapshot: str
    query: str
    columns: tuple[tuple[str, str], ...]
    output: str
    faults: frozenset[str]


def run_task(spec: TaskSpec) -> tuple[str, int]:
    """One pull inside the exported snapshot; runs in an executor's Python worker."""
    faults.hit("task", spec.faults)
    with psycopg.connect(spec.dsn, autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(spec.snapshot)))
        table = copy_to_arrow(conn, spec.query, list(spec.columns))
        conn.rollback()
    with pa.OSFile(spec.output, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return spec.output, table.num_rows


def block_ranges(pages: int, parts: int) -> list[str | None]:
    """ctid predicates splitting a heap of ``pages`` pages into ``parts`` ranges (the last one
    open-ended); [None] when there is nothing to split."""
    if parts <= 1 or pages < parts:
        return [None]
    bounds = [pages * i // parts for i in range(1, parts)]
    predicates: list[str | None] = []
    lower = 0
    for upper in bounds:
        predicates.append(f"ctid >= '({lower},0)'::tid AND ctid < '({upper},0)'::tid")
        lower = upper
    predicates.append(f"ctid >= '({lower},0)'::tid")
    return predicates


class SparkEngine:
    name = "spark"
    reason = "asked for"

    def __init__(
        self,
        master: str = DEFAULT_MASTER,
        staging_dir: str | None = None,
        min_pages_per_task: int = 2048,
    ) -> None:
        self.master = master
        self.staging_dir = staging_dir
        self.min_pages_per_task = min_pages_per_task

    def pull(self, coordinator: Coordinator, queries: list[PullQuery]) -> list[pa.Table]:
        session = spark_session(self.master)
        context = session.sparkContext  # type: ignore[attr-defined]
        staging = Path(tempfile.mkdtemp(prefix="mtcache-spark-", dir=self.staging_dir))
        try:
            specs: list[TaskSpec] = []
            owners: list[int] = []
            for index, query in enumerate(queries):
                parts = max(
                    1, min(context.defaultParallelism * 2, query.pages // self.min_pages_per_task)
                )
                for number, block in enumerate(block_ranges(query.pages, parts)):
                    specs.append(
                        TaskSpec(
                            dsn=coordinator.dsn,
                            snapshot=coordinator.snapshot.exported,
                            query=query.sql(block),
                            columns=query.columns,
                            output=str(staging / f"q{index}-p{number}.arrow"),
                            faults=coordinator.faults,
                        )
                    )
                    owners.append(index)
            try:
                results = _interruptible(
                    lambda: context.parallelize(specs, len(specs)).map(run_task).collect(),
                    context.cancelAllJobs,
                )
            except Exception as exc:  # Py4JJavaError / PythonException from the executors
                raise OperationalError(
                    f"a Spark task failed, the cache is unchanged: {_task_error(exc)}"
                ) from exc
            tables: list[list[pa.Table]] = [[] for _ in queries]
            for owner, (path, _rows) in zip(owners, results, strict=True):
                # Zero-copy: the table's buffers keep the mapping alive after the file is
                # unlinked below, so the map is not closed here.
                tables[owner].append(pa.ipc.open_file(pa.memory_map(path)).read_all())
            return [pa.concat_tables(parts) if parts else pa.table({}) for parts in tables]
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _interruptible(action: Callable[[], T], cancel: Callable[[], object]) -> T:
    """``action()`` run in a thread of its own while the caller waits; on KeyboardInterrupt,
    ``cancel()`` (given a few seconds) and the interrupt goes on."""
    outcome: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            outcome.set_result(action())
        except BaseException as exc:  # handed to the waiting caller
            outcome.set_exception(exc)

    threading.Thread(target=run, name="mtcache-spark", daemon=True).start()
    try:
        return outcome.result()
    except KeyboardInterrupt:
        canceller = threading.Thread(
            target=_quietly(cancel), name="mtcache-spark-cancel", daemon=True
        )
        canceller.start()
        canceller.join(CANCEL_SECONDS)
        raise


CANCEL_SECONDS = 5.0


def _quietly(action: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        with contextlib.suppress(Exception):  # best effort: the caller hears of the interrupt
            action()

    return run


def _stop_starting_jvm() -> None:
    """Kill the Spark JVM this process is starting (it ignores SIGINT, and would otherwise
    outlive an interrupted start-up and print its failure to connect back)."""
    for pid, command in child_processes(os.getpid()):
        if "org.apache.spark.deploy.SparkSubmit" in command:
            os.kill(pid, signal.SIGKILL)


def child_processes(parent: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is ``parent``, from /proc (Linux;
    elsewhere none: the JVM then ends with its stdin)."""
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append((int(entry.name), command.decode(errors="replace")))
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
    return found


_PYTHON_ERROR = re.compile(r"^([\w.]+(?:Error|Exception|Fault)): (.+)$")


def _task_error(exc: BaseException) -> str:
    """The Python error a task raised, out of Spark's wrapping (its last traceback line)."""
    found = [
        m.group(0) for line in str(exc).splitlines() if (m := _PYTHON_ERROR.match(line.strip()))
    ]
    if found:
        return found[-1]
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
