"""A writer committing on the backend while a test's block runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


@contextmanager
def committing(dsn: str, statement: str, numbers: range) -> Iterator[None]:
    """``statement`` with each of ``numbers`` as its one parameter, one transaction each, in a
    thread, until the numbers run out or the block ends."""
    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for n in numbers:
                if stop.is_set():
                    return
                conn.execute(statement, (n,))  # type: ignore[arg-type]

    writer = threading.Thread(target=write)
    writer.start()
    try:
        yield
    finally:
        stop.set()
        writer.join()
