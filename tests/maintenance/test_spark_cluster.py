"""Pulls on a real Spark cluster on this machine: a standalone master with two workers, and a
Spark Connect server whose executors run on them (`experiments.spark_cluster`). Every pull's
rows equal an inline pull of the same snapshot; a task that fails once is run again, one that
always fails fails the pull whole; a worker killed mid-pull costs a retry, not the pull; Ctrl-C
ends a pull on the cluster at once. Nothing is shared with the executors but the network: the
rows come back to the driver as Arrow."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from cache.maintenance.engines import Coordinator, InlineEngine, PullQuery
from cache.maintenance.pipeline import Maintainer
from cache.maintenance.pull import pull_query
from cache.maintenance.spark import SparkEngine, stop_sessions
from cache.store.cache_file import CacheStore
from experiments.spark_cluster import ConnectServer, StandaloneCluster
from sql_ext.errors import OperationalError
from tests.maintenance.conftest import restamping
from tests.maintenance.test_maintenance import local, pg
from tests.store.test_store import dump
from tests.tools.test_cli_errors import cli_environment, interrupt_a_spark_refresh

PAGES_PER_TASK = 64  # sales fill a few hundred pages: a pull of them is several tasks


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    root = tmp_path_factory.mktemp("spark-cluster")
    standalone = StandaloneCluster(root).start(wait=False)
    connect = ConnectServer(root, standalone.url)
    try:
        connect.start()
        standalone.wait_for_workers()
        standalone.connect = connect  # type: ignore[attr-defined]
        yield standalone
    finally:
        stop_sessions()
        connect.stop()
        standalone.stop()


@pytest.fixture(params=["standalone", "connect"])
def master(cluster: StandaloneCluster, request: pytest.FixtureRequest) -> str:
    """The URL a pull goes to: the standalone master, or the Connect server."""
    if request.param == "standalone":
        return cluster.url
    return str(cluster.connect.url)  # type: ignore[attr-defined]


def sales_query(store: CacheStore) -> PullQuery:
    """The pull of the whole sales copy, as a refresh builds it."""
    return pull_query(store.load_schema().views["salescopy"], "TRUE", store.load_catalog())


def rows_of(table: pa.Table) -> list[tuple[object, ...]]:
    return sorted(zip(*(column.to_pylist() for column in table.columns), strict=True))


def test_a_cluster_pull_equals_an_inline_pull_of_the_same_snapshot(
    sales_store: CacheStore, sales_dsn: str, master: str
) -> None:
    """A writer changes every sale in each transaction while the executors pull block ranges
    of the table: the cluster's rows are the inline pull's at the coordinator's snapshot,
    values and Arrow types, however many tasks read it."""
    query = sales_query(sales_store)
    assert query.pages // PAGES_PER_TASK >= 2, "the pull must be split"
    with restamping(sales_dsn, 20):
        coordinator = Coordinator(sales_dsn, frozenset())
        try:
            (on_cluster,) = SparkEngine(master, PAGES_PER_TASK).pull(coordinator, [query])
            (inline,) = InlineEngine().pull(coordinator, [query])
        finally:
            coordinator.close()
    assert on_cluster.schema == inline.schema
    assert on_cluster.num_rows == inline.num_rows == 60000
    assert rows_of(on_cluster) == rows_of(inline)
    assert len(set(on_cluster.column("qty").to_pylist())) == 1  # one committed state


def test_a_task_failed_once_is_run_again_and_one_failing_always_fails_the_pull(
    sales_store: CacheStore,
    sales_dsn: str,
    master: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first task's first attempt fails: Spark runs it again, in the same snapshot, and
    the refresh lands every row once, values and types PostgreSQL's. A task failing at every
    attempt fails the refresh whole: the cache as it was."""
    mark = tmp_path / "fired"
    monkeypatch.setenv("MTCACHE_FAULT_MARK", str(mark))  # (the driver's: the task carries it)
    engine = SparkEngine(master, PAGES_PER_TASK)
    Maintainer(sales_store, sales_dsn, engine, faults_enabled=["first_task"]).refresh("salescopy")
    assert [line.split()[0] for line in mark.read_text().splitlines()] == ["first_task"]
    want = pg(sales_dsn, "SELECT * FROM sales")
    got = local(sales_store, "SELECT * FROM salescopy")
    assert sorted(got) == sorted(want)
    assert {tuple(map(type, r)) for r in got} == {tuple(map(type, r)) for r in want}
    assert local(sales_store, "SELECT DISTINCT engine FROM mtcache.snapshots") == [("spark",)]

    pg(sales_dsn, "UPDATE sales SET qty = qty + 1")
    before = dump(sales_store)
    with pytest.raises(OperationalError, match=r"a Spark task failed.*InjectedFault"):
        Maintainer(sales_store, sales_dsn, engine, faults_enabled=["task"]).refresh("salescopy")
    assert dump(sales_store) == before


def test_a_worker_killed_mid_pull_costs_a_retry_not_the_pull(
    sales_store: CacheStore,
    sales_dsn: str,
    cluster: StandaloneCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first task stalls on its first attempt; the worker running it is killed (SIGKILL,
    its executor with it): Spark runs the task again on the other worker, in the same
    snapshot, and the refresh lands every row once."""
    mark = tmp_path / "stalled"
    monkeypatch.setenv("MTCACHE_FAULT_MARK", str(mark))  # (the driver's: the task carries it)
    engine = SparkEngine(cluster.url, PAGES_PER_TASK)
    failure: list[BaseException] = []

    def refresh() -> None:
        try:
            Maintainer(
                sales_store.for_thread(), sales_dsn, engine, faults_enabled=["first_task:stall"]
            ).refresh("salescopy")
        except BaseException as exc:  # handed to the test
            failure.append(exc)

    pulling = threading.Thread(target=refresh)
    try:
        pulling.start()
        deadline = time.monotonic() + 180
        while not mark.exists() or not mark.read_text().strip():
            assert time.monotonic() < deadline and pulling.is_alive(), failure
            time.sleep(0.1)
        stalled = int(mark.read_text().split()[1])
        lost = cluster.worker_of(stalled)
        cluster.kill_worker(lost)
        pulling.join(timeout=300)
        assert not pulling.is_alive() and not failure, failure
        assert len(mark.read_text().splitlines()) == 1  # the task run again did not stall
    finally:
        if len(cluster.running) < cluster.workers:
            cluster.start_worker(
                next(n for n in range(cluster.workers) if n not in cluster.running)
            )
    assert sorted(local(sales_store, "SELECT * FROM salescopy")) == sorted(
        pg(sales_dsn, "SELECT * FROM sales")
    )


def test_ctrl_c_during_a_pull_on_the_cluster(
    mtcache_bin: str, bookstore_dsn: str, cluster: StandaloneCluster, tmp_path: Path
) -> None:
    """The command's own driver on the standalone cluster: Ctrl-C while its task runs on an
    executor ends it at once (exit 130, one line), the cache as it was."""
    interrupt_a_spark_refresh(
        mtcache_bin,
        cli_environment(bookstore_dsn, tmp_path),
        "running a Spark task",
        "--spark-master",
        cluster.url,
    )
