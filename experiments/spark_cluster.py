"""A real Spark cluster on this machine's loopback, from pyspark's own launcher: a standalone
master and its workers (``spark-class org.apache.spark.deploy.master.Master`` / ``...Worker``,
each a JVM of its own) and a Spark Connect server (``sbin/start-connect-server.sh``) whose
executors run on those workers. The cluster tests and ``make bench-cluster`` pull on it.

Every process listens on 127.0.0.1 only, on ports the processes chose (read from their logs),
and is stopped by `stop` (a worker's executors with it). Each application gets at most
`APP_CORES` cores (the master's ``spark.deploy.defaultCores``): the workers offer more than
the machine has, so the suite's driver, the Connect server and a command's own refresh each
get executors on both workers at once instead of waiting for one another.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

LOOPBACK = ("--host", "127.0.0.1", "--port", "0", "--webui-port", "0")  # (ports they choose)
APP_CORES = 2  # per application: one executor (of one core) on each of two workers
WORKER_CORES = 8  # what a worker offers (cores the applications may take, not the machine's)
WORKER_MEMORY = "6g"
START_SECONDS = 180.0  # how long a JVM may take to come up on a loaded machine


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _env(root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "PYSPARK_PYTHON": sys.executable,  # the executors' Python: this virtualenv's
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(root / "logs"),
        "SPARK_PID_DIR": str(root / "pids"),
        "SPARK_MASTER_OPTS": f"-Dspark.deploy.defaultCores={APP_CORES}",
    }


def _wait_for(log: Path, pattern: str, process: subprocess.Popen[bytes] | None) -> re.Match[str]:
    """The first match of ``pattern`` in a process's log, once it is written (an error with
    the log's end if the process ends first or it never comes)."""
    deadline = time.monotonic() + START_SECONDS
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        found = re.search(pattern, text)
        if found:
            return found
        if (process is not None and process.poll() is not None) or time.monotonic() > deadline:
            tail = "\n".join(text.splitlines()[-20:])
            raise RuntimeError(
                f"{log.name}: no {pattern!r} (exit {process and process.poll()}):\n{tail}"
            )
        time.sleep(0.2)


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and everything below it (a worker's executors and their Pythons)."""
    from cache.maintenance.spark import descendants

    for each in [pid, *(child for child, _ in descendants(pid))]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


@dataclass
class Worker:
    number: int
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class StandaloneCluster:
    """A master and ``workers`` workers on loopback (`start`, `stop`, `kill_worker`)."""

    root: Path
    workers: int = 2
    url: str = ""
    master: subprocess.Popen[bytes] | None = None
    running: dict[int, Worker] = field(default_factory=dict)
    registered: int = 0  # worker registrations the master has logged

    def start(self, wait: bool = True) -> StandaloneCluster:
        """Start the master, then the workers; with ``wait``, return once the master has
        registered them all (else call `wait_for_workers`: a Connect server can start
        meanwhile)."""
        for sub in ("logs", "pids"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        log = self.root / "logs" / "master.log"
        self.master = self._launch(
            log,
            "org.apache.spark.deploy.master.Master",
            *LOOPBACK,
        )
        port = _wait_for(
            log, r"Successfully started service 'sparkMaster' on port (\d+)", self.master
        )
        self.url = f"spark://127.0.0.1:{port.group(1)}"
        for number in range(self.workers):
            self.start_worker(number, wait=False)
        if wait:
            self.wait_for_workers()
        return self

    def wait_for_workers(self) -> None:
        _wait_for(
            self.root / "logs" / "master.log",
            r"(?s)" + r"Registering worker.*" * self.registered,
            self.master,
        )

    def _launch(self, log: Path, main: str, *args: str) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), main, *args],
                env=_env(self.root),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # (Ctrl-C in a terminal reaches the test run, not it)
            )

    def start_worker(self, number: int, wait: bool = True) -> None:
        """Start worker ``number`` (again, after `kill_worker`); with ``wait``, return once
        the master has registered it."""
        log = self.root / "logs" / f"worker-{number}.log"
        work = self.root / f"work-{number}"
        work.mkdir(exist_ok=True)
        process = self._launch(
            log,
            "org.apache.spark.deploy.worker.Worker",
            *LOOPBACK,
            "--cores",
            str(WORKER_CORES),
            "--memory",
            WORKER_MEMORY,
            "--work-dir",
            str(work),
            self.url,
        )
        self.running[number] = Worker(number, process, log)
        self.registered += 1
        if wait:
            self.wait_for_workers()

    def kill_worker(self, number: int) -> None:
        """SIGKILL worker ``number`` and its executors, as a machine lost would be."""
        worker = self.running.pop(number)
        _kill_tree(worker.process.pid)
        worker.process.wait()

    def worker_of(self, pid: int) -> int:
        """The worker a process (an executor's Python worker, say) runs under."""
        from cache.maintenance.spark import descendants

        for number, worker in self.running.items():
            if any(child == pid for child, _ in descendants(worker.process.pid)):
                return number
        raise LookupError(f"process {pid} runs under no worker of the cluster")

    def stop(self) -> None:
        for number in list(self.running):
            self.kill_worker(number)
        if self.master is not None:
            _kill_tree(self.master.pid)
            self.master.wait()
            self.master = None


@dataclass
class ConnectServer:
    """A Spark Connect server on loopback whose executors run on ``master``."""

    root: Path
    master: str
    url: str = ""

    def start(self) -> ConnectServer:
        for sub in ("logs", "pids"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        env = {**_env(self.root), "SPARK_IDENT_STRING": "mtcache"}
        subprocess.run(
            [
                str(spark_home() / "sbin" / "start-connect-server.sh"),
                "--master",
                self.master,
                "--conf",
                "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf",
                "spark.connect.grpc.binding.port=0",
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                f"spark.cores.max={APP_CORES}",
            ],
            env=env,
            check=True,
            capture_output=True,
        )
        logs = list((self.root / "logs").glob("*SparkConnectServer*.out"))
        assert len(logs) == 1, logs
        port = _wait_for(logs[0], r"Spark Connect server started at: [\d.]+:(\d+)", None)
        self.url = f"sc://127.0.0.1:{port.group(1)}"
        return self

    def stop(self) -> None:
        env = {**_env(self.root), "SPARK_IDENT_STRING": "mtcache"}
        pids = list((self.root / "pids").glob("*SparkConnectServer*.pid"))
        subprocess.run(
            [str(spark_home() / "sbin" / "stop-connect-server.sh")],
            env=env,
            check=False,
            capture_output=True,
        )
        for pid_file in pids:  # (and whatever it left behind)
            with contextlib.suppress(OSError, ValueError):
                _kill_tree(int(pid_file.read_text().strip()))
