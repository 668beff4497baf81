"""Which server owns a cache file: `mtcache serve` writes where it listens beside the file
(``cache.duckdb.server``, private to its user) and removes it when it stops, so a command or
an application that finds the file served goes through the server instead of opening the file
(DuckDB lets one process open it). A note left by a server that died (its process is gone) is
ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import typing as t
from collections.abc import Iterator
from pathlib import Path

from cache.private_files import make_private


class ServedAt(t.NamedTuple):
    host: str
    port: int
    pid: int
    user: str | None = None  # the role and database of the server's backend, which its
    database: str | None = None  # clients name at startup unless they give their own

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """Where a client connects, whole: its role and database too (a ``HOST:PORT`` alone
        would ask for the database named after the operating system's user)."""
        from urllib.parse import quote

        who = f"{quote(self.user, safe='')}@" if self.user else ""
        database = f"/{quote(self.database, safe='')}" if self.database else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"postgresql://{who}{host}:{self.port}{database}"


def note_path(cache_path: Path) -> Path:
    return cache_path.with_name(cache_path.name + ".server")


@contextlib.contextmanager
def published(
    cache_path: Path, host: str, port: int, user: str | None, database: str | None
) -> Iterator[ServedAt]:
    """Say that this process serves ``cache_path`` at host:port (in front of ``database`` as
    ``user``) while the block runs."""
    note = note_path(cache_path)
    served = ServedAt(host, port, os.getpid(), user, database)
    partial = note.with_name(note.name + ".tmp")
    partial.write_text(json.dumps(served._asdict()))
    make_private(partial)
    partial.replace(note)
    try:
        yield served
    finally:
        with contextlib.suppress(OSError):
            if served_at(cache_path) == served:
                note.unlink()


def served_at(cache_path: Path) -> ServedAt | None:
    """The server that owns ``cache_path`` now (None: no server, or one that died)."""
    try:
        found = ServedAt(**json.loads(note_path(cache_path).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    try:
        os.kill(found.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    return found
