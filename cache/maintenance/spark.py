"""The Spark refresh engine: pulls run as Spark tasks, each in its own backend session
joined to the coordinator's exported snapshot, so every task reads the same database state
however many executors read it.

The master is ``local[*]`` (the default: Spark in this process's own JVM), a standalone
cluster's ``spark://HOST:PORT``, or a Spark Connect server's ``sc://HOST:PORT``. One code path
serves all three: a DataFrame of task numbers (``range``, one per partition) mapped by an Arrow
UDF (`mapInArrow`) whose task pulls its part in the snapshot and returns the rows as
LZ4-compressed Arrow IPC streams (a binary column, about `CHUNK_BYTES` each); the driver
collects them with ``toArrow()`` (Arrow batches over the connection, no shared filesystem) and
decodes each part as the very table an inline pull builds (`copy_to_arrow`), so the types are
the inline pull's exactly. See docs/decisions/spark-pulls.md.

A large pull is split into block ranges of the backend table's heap (``ctid`` ranges: a TID
range scan each, PostgreSQL 14+), the last range open-ended so rows on pages added since the
statistics were taken are still read. A task that fails or whose executor is lost is run
again by Spark (on a cluster, up to ``spark.task.maxFailures`` times; in local mode once), in
the same exported snapshot, and only a finished attempt's rows reach the driver; a pull whose
task fails for good fails whole, before anything was written to the cache. The executors need
the ``mtcache[spark]`` extra and must reach the backend; a cluster's need to reach the driver
(a master on a loopback address keeps the driver there too).

One Spark session per process (one classic, one per Connect server), created on first use and
reused by every refresh; asking for another classic master stops the one before.
Spark is driven from a thread of its own (`_interruptible`): py4j blocks its caller in a socket
read, which Ctrl-C cannot interrupt cleanly (Spark's own SIGINT handler then calls into the JVM
from inside that read). The caller waits instead, so Ctrl-C reaches it at once: the jobs are
interrupted (or the JVM still starting is stopped) and KeyboardInterrupt goes on up, before
anything was written to the cache.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import signal
import socket
import sys
import threading
import typing as t
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from cache.backend.copy_arrow import copy_to_arrow
from cache.maintenance import faults
from cache.maintenance.engines import Coordinator, PullQuery
from sql_ext.errors import OperationalError, ProgrammingError

DEFAULT_MASTER = "local[*]"
LOG_CONFIG = Path(__file__).with_name("spark-log4j2.properties")
CHUNK_BYTES = 8 << 20  # at most this much of a task's rows (uncompressed) per IPC stream
RESULT_SCHEMA = "part int, seq int, payload binary"
MAX_TASKS = 4096  # a pull is split in at most this many tasks
TASK_PAGES = 2048  # and in tasks of at most this many heap pages (16 MiB), when it can be
CONNECT_PARALLELISM = 8  # what a Spark Connect server is taken to run at once (it does not say)

_sessions: dict[str, object] = {}
_pulling: dict[str, int] = {}  # pulls under way per master (a classic one is not switched then)
_lock = threading.Lock()


T = t.TypeVar("T")


def spark_session(master: str = DEFAULT_MASTER) -> object:
    """The process's Spark session for a master URL (created once, then reused)."""
    check_master(master)
    return _interruptible(lambda: _session(master), _stop_starting_jvm)


CONNECT_PORT = 15002  # a Spark Connect server's port when sc://HOST gives none


def check_master_url(master: str) -> None:
    """A master URL mtcache pulls on (a ProgrammingError that says which ones if not)."""
    if master == "local" or re.fullmatch(r"local\[(\*|\d+)(,\s*\d+)?\]", master):
        return
    if not _addresses(master):
        raise ProgrammingError(
            f"unknown Spark master {master!r}: use local[*], spark://HOST:PORT[,HOST:PORT...] "
            "(a standalone cluster, with its standby masters) or sc://HOST[:PORT] (a Spark "
            "Connect server)"
        )


def _addresses(master: str) -> list[tuple[str, int]]:
    """The (host, port)s of a cluster's master URL (none: not such a URL)."""
    scheme, _, rest = master.partition("://")
    if scheme == "sc":
        rest = rest.split("/", 1)[0].split(";", 1)[0]  # (sc://HOST:PORT/;token=...)
        hosts = [rest]
    elif scheme == "spark":
        hosts = rest.split(",")
    else:
        return []
    found = []
    for host in hosts:
        name, colon, port = host.rpartition(":")
        if not colon and scheme == "sc":
            name, port = host, str(CONNECT_PORT)
        if not name or not port.isdigit():
            return []
        found.append((name.strip("[]"), int(port)))
    return found


def check_master(master: str) -> None:
    """A master URL Spark can take, and, for a cluster or a Connect server, one that answers
    (a ProgrammingError or an OperationalError that says what to do, before any JVM starts)."""
    check_master_url(master)
    if master.startswith("local"):
        return
    if remote(master) and not connect_installed():
        raise ProgrammingError(
            "Spark Connect needs its client libraries: pip install 'mtcache[spark]'"
        )
    failures = []
    for host, port in _addresses(master):
        try:
            socket.create_connection((host, port), timeout=5).close()
            return  # (one master of a standalone cluster's answers: Spark finds the leader)
        except OSError as exc:
            failures.append(f"{host}:{port}: {exc.strerror or exc}")
    what = "Spark Connect server" if remote(master) else "Spark master"
    raise OperationalError(
        f"no {what} answers at {master} ({'; '.join(failures)}): start it, or give another "
        "--spark-master (local[*] runs Spark in this process)"
    )


def connect_installed() -> bool:
    """Whether Spark Connect's client libraries can be imported (the ``spark`` extra)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("grpc", "pandas", "zstandard"))


def remote(master: str) -> bool:
    return master.startswith("sc://")


def _loopback(master: str) -> bool:
    """Local mode, or a standalone cluster whose masters are all on this machine's loopback."""
    return all(host in ("127.0.0.1", "localhost", "::1") for host, _ in _addresses(master))


def _session(master: str) -> object:
    with _lock:
        session = _sessions.get(master)
        if session is not None and not _stopped(session):
            return session
        # Executors run this interpreter unless told otherwise, so they import the same
        # mtcache and libraries (on a cluster: `spark.pyspark.python` or PYSPARK_PYTHON)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        if remote(master):
            # (Connect's own class: the generic builder refuses a remote session beside a
            # classic one, and would switch the whole process to Connect's mode)
            from pyspark.sql.connect.session import SparkSession as RemoteSession

            session = RemoteSession.builder.remote(master).create()
        else:
            # one SparkContext per process: another classic master's session goes first, once
            # no pull runs on it
            busy = [m for m in _sessions if not remote(m) and m != master and _pulling.get(m)]
            if busy:
                raise OperationalError(
                    f"this process is pulling on Spark master {busy[0]}, and Spark runs one "
                    f"classic master per process: refresh on {busy[0]} (or a Spark Connect "
                    "server, sc://), or run this refresh in another process"
                )
            for other in [m for m in _sessions if not remote(m)]:
                with contextlib.suppress(Exception):
                    _sessions.pop(other).stop()  # type: ignore[attr-defined]
            builder = (
                SparkSession.builder.master(master)
                .appName("mtcache-refresh")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                # the parts come back whole to the driver: no cap on their total
                .config("spark.driver.maxResultSize", "0")
                .config("spark.driver.extraJavaOptions", f"-Dlog4j.configurationFile={LOG_CONFIG}")
            )
            if _loopback(master):  # local mode, or a cluster on this machine's loopback
                builder = builder.config("spark.driver.host", "127.0.0.1").config(
                    "spark.driver.bindAddress", "127.0.0.1"
                )
            session = builder.getOrCreate()
        _sessions[master] = session
        return session


def _stopped(session: object) -> bool:
    """A session stopped (a classic one's SparkContext too: its cluster went away)."""
    if getattr(session, "is_stopped", False):
        return True
    context = getattr(session, "_sc", None)
    try:
        return bool(context is not None and context._jsc.sc().isStopped())
    except Exception:  # the JVM itself is gone
        return True


@contextlib.contextmanager
def _pull_on(master: str) -> Iterator[None]:
    """A pull under way on ``master`` (its session is not switched meanwhile); a Connect
    session whose pull failed is made anew next time (a restarted server refuses the old)."""
    with _lock:
        _pulling[master] = _pulling.get(master, 0) + 1
    failed = True
    try:
        yield
        failed = False
    finally:
        with _lock:
            _pulling[master] -= 1
            if failed and remote(master) and not _pulling[master]:
                session = _sessions.pop(master, None)
                if session is not None:
                    with contextlib.suppress(Exception):
                        session.stop()  # type: ignore[attr-defined]


def stop_sessions() -> None:
    with _lock:
        for session in _sessions.values():
            with contextlib.suppress(Exception):  # a Connect server already gone
                session.stop()  # type: ignore[attr-defined]
        _sessions.clear()


@dataclass(frozen=True)
class TaskSpec:
    part: int  # the task's number in its operation (0: the first)
    dsn: str
    snapshot: str
    query: str
    columns: tuple[tuple[str, str], ...]
    faults: frozenset[str]
    mark: str | None = None  # MTCACHE_FAULT_MARK of the driver (executors may not share it)


def pull_task(spec: TaskSpec, attempt: int = 0) -> pa.Table:
    """One pull inside the exported snapshot; runs in an executor's Python worker."""
    faults.hit("task", spec.faults, spec.mark)
    if spec.part == 0 and attempt == 0:
        faults.hit("first_task", spec.faults, spec.mark)
    with psycopg.connect(spec.dsn, autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(spec.snapshot)))
        table = copy_to_arrow(conn, spec.query, list(spec.columns))
        conn.rollback()
    return table


def encoded(table: pa.Table) -> Iterator[bytes]:
    """A table as LZ4-compressed Arrow IPC streams of about `CHUNK_BYTES` each before
    compression (one with no rows for an empty table: the schema still travels)."""
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    rows = max(1, table.num_rows * CHUNK_BYTES // max(table.nbytes, 1))
    batches = table.to_batches(max_chunksize=rows) or [None]
    for batch in batches:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
            if batch is not None:
                writer.write_batch(batch)
        yield sink.getvalue().to_pybytes()


def _tasks(specs: list[TaskSpec]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The Arrow UDF of a pull: each input row names a task; its output rows are the task's
    encoded parts (shipped to the executors with the specs)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        attempt = context.attemptNumber() if context is not None else 0
        for batch in batches:
            for part in batch.column(0).to_pylist():
                for seq, blob in enumerate(encoded(pull_task(specs[part], attempt))):
                    yield pa.record_batch(
                        [
                            pa.array([part], pa.int32()),
                            pa.array([seq], pa.int32()),
                            pa.array([blob], pa.binary()),
                        ],
                        names=["part", "seq", "payload"],
                    )

    return run


def decoded(collected: pa.Table, parts: int) -> list[pa.Table]:
    """The tables of parts 0..parts-1 out of the collected encoded chunks."""
    order = pc.sort_indices(collected, [("part", "ascending"), ("seq", "ascending")])
    rows = collected.take(order)
    tables: list[list[pa.Table]] = [[] for _ in range(parts)]
    payloads = rows.column("payload")
    for index, part in enumerate(rows.column("part").to_pylist()):
        blob = payloads[index].as_buffer()
        tables[part].append(pa.ipc.open_stream(blob).read_all())
    missing = [number for number, found in enumerate(tables) if not found]
    if missing:  # (Spark returns every partition of a finished job: a bug if not)
        raise OperationalError(f"Spark returned no rows for task {missing[0]}: pull again")
    return [pa.concat_tables(found) for found in tables]


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

    def __init__(self, master: str = DEFAULT_MASTER, min_pages_per_task: int = 2048) -> None:
        self.master = master
        self.min_pages_per_task = min_pages_per_task

    def pull(self, coordinator: Coordinator, queries: list[PullQuery]) -> list[pa.Table]:
        with _pull_on(self.master):
            return self._pull(coordinator, queries)

    def _pull(self, coordinator: Coordinator, queries: list[PullQuery]) -> list[pa.Table]:
        session = spark_session(self.master)
        parallelism = CONNECT_PARALLELISM if remote(self.master) else _parallelism(session)
        specs: list[TaskSpec] = []
        owners: list[int] = []
        mark = os.environ.get("MTCACHE_FAULT_MARK")
        for index, query in enumerate(queries):
            # twice the parallelism, but tasks of at most TASK_PAGES: a task's rows pass
            # through the JVM of its executor and of the driver (in local mode one JVM, its
            # heap 1 GiB by default) in one piece; and none of fewer than min_pages_per_task
            enough = max(parallelism * 2, -(-query.pages // TASK_PAGES))
            parts = max(1, min(MAX_TASKS, enough, query.pages // self.min_pages_per_task))
            for block in block_ranges(query.pages, parts):
                specs.append(
                    TaskSpec(
                        part=len(specs),
                        dsn=coordinator.dsn,
                        snapshot=coordinator.snapshot.exported,
                        query=query.sql(block),
                        columns=query.columns,
                        faults=coordinator.faults,
                        mark=mark,
                    )
                )
                owners.append(index)

        def collect() -> pa.Table:
            frame = session.range(0, len(specs), 1, len(specs))  # type: ignore[attr-defined]
            return frame.mapInArrow(_tasks(specs), RESULT_SCHEMA).toArrow()

        try:
            collected = _interruptible(collect, lambda: _cancel(session))
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # Py4JJavaError / PythonException from the executors
            raise OperationalError(
                f"a Spark task failed, the cache is unchanged: {_task_error(exc)}"
            ) from exc
        tables: list[list[pa.Table]] = [[] for _ in queries]
        for owner, table in zip(owners, decoded(collected, len(specs)), strict=True):
            tables[owner].append(table)
        return [pa.concat_tables(found) for found in tables]


def _parallelism(session: object) -> int:
    return int(session.sparkContext.defaultParallelism)  # type: ignore[attr-defined]


def _cancel(session: object) -> None:
    """Interrupt the session's running jobs (classic: every job of its SparkContext too)."""
    with contextlib.suppress(Exception):
        session.interruptAll()  # type: ignore[attr-defined]
    context = getattr(session, "_sc", None)
    if context is not None:
        context.cancelAllJobs()


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


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process below ``pid`` (`child_processes`, down)."""
    found, pending = [], [pid]
    while pending:
        for child in child_processes(pending.pop()):
            found.append(child)
            pending.append(child[0])
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
