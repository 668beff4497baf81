"""`mtcache serve` in a process of its own, for the demo and the benchmarks: started on a free
loopback port, known to listen once it has published where (`cache.store.served`), stopped by
SIGTERM as an operator would stop it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import typing as t
from collections.abc import Iterator
from pathlib import Path

from cache.store.served import ServedAt, served_at
from sql_ext.errors import OperationalError

START_SECONDS = 120.0


def mtcache_executable() -> str:
    """The `mtcache` command installed beside this interpreter."""
    return str(Path(sys.executable).parent / "mtcache")


def client_environment(
    host: str, port: int, database: str, user: str = "postgres", options: str | None = None
) -> dict[str, str]:
    """The environment of a libpq client program (psql, pgbench) pointed at a server: this
    process's, with PGOPTIONS set to ``options`` (none of the caller's own)."""
    env = dict(os.environ, PGHOST=host, PGPORT=str(port), PGUSER=user, PGDATABASE=database)
    env.pop("PGOPTIONS", None)
    if options:
        env["PGOPTIONS"] = options
    return env


@contextlib.contextmanager
def serving_process(
    backend: str, cache_path: Path, *options: str, log: t.IO[bytes] | None = None
) -> Iterator[ServedAt]:
    """Run ``mtcache serve --listen 127.0.0.1:0 [options]`` over ``cache_path`` (its log to
    ``log``, else discarded) while the block runs; yields where it listens."""
    argv = [
        mtcache_executable(),
        "--backend",
        backend,
        "--cache",
        str(cache_path),
        "serve",
        "--listen",
        "127.0.0.1:0",
        *options,
    ]
    sink = log if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink)
    try:
        deadline = time.monotonic() + START_SECONDS
        while (served := served_at(cache_path)) is None or served.pid != proc.pid:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise OperationalError(
                    f"mtcache serve over {cache_path} did not start (exit "
                    f"{proc.poll()}): run it by hand to see why"
                )
            time.sleep(0.05)
        yield served
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


__all__ = ["client_environment", "mtcache_executable", "serving_process"]
