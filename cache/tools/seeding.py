"""A new cache file seeded from a running cache server (`mtcache clone`, ``mtcache serve
--seed-from``): the peer's consistent copy (`SHOW CACHE SEED`, `cache.store.seed`) instead of
every view pulled from the backend again.

1. The peer's status says whether it keeps views from the change stream. If it does, the new
   file gets a replication slot and a publication of its own first (the peer's tables), at a
   WAL position L; a heartbeat beat commits after L, and the copy is taken once the peer has
   applied it, so the copy's stream position P is past L: the new slot holds every
   transaction after P (its consumer skips those up to P, which the copy holds).
2. ``SHOW CACHE SEED`` over the peer's protocol, as binary rows: the copy's bytes.
3. The file is written beside the target, checked (the backend must be the database the peer
   fronts: its cached tables with the same columns), given its own slot and counters of zero,
   and renamed into place: the target is the whole copy or absent.

The copy's regions keep their stamps, the backend moments their rows are from, so every guard
judges them as the peer would; the new server's scheduler refreshes them when due and its
consumer applies the stream from P on. The backend sends it no view's rows. Anything failing
leaves no file and drops the slot and publication made for it.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
import typing as t
from dataclasses import dataclass
from pathlib import Path

import psycopg

from cache.backend.pgoutput.messages import lsn_text, lsn_value
from cache.backend.reflect import connect_backend, fetch_catalog
from cache.backend.replication import create_publication, create_slot, drop_publication, drop_slot
from cache.dbapi.remote import server_conninfo
from cache.engine.inspect import status_document
from cache.maintenance.stream.position import SLOT_PREFIX
from cache.store.cache_file import CacheStore
from cache.store.seed import FORMAT
from heartbeat.beat import beat
from sql_ext.errors import OperationalError, ProgrammingError, translate

CATCH_UP_SECONDS = 60.0  # how long the peer's stream may take to apply the clone's beat


@dataclass(frozen=True)
class Seeded:
    path: Path
    bytes: int
    views: int
    seconds: float
    position: str | None  # the stream position of the copy (None: no stream)


def clone(server: str, cache_path: Path, backend: str) -> Seeded:
    """A new cache file at ``cache_path`` from the cache server at ``server`` (HOST:PORT, a
    conninfo or URL), which fronts ``backend`` (the database and role this file will use)."""
    if cache_path.exists():
        raise ProgrammingError(
            f"{cache_path} exists: a seed makes a new cache file (give another --cache, or "
            "remove that one)"
        )
    began = time.monotonic()
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    staged = cache_path.with_name(cache_path.name + ".seeding")
    with contextlib.suppress(FileNotFoundError):
        staged.unlink()
    try:
        peer = psycopg.connect(server_conninfo(server, backend), autocommit=True)
    except psycopg.Error as exc:
        raise OperationalError(
            f"cannot reach the cache server at {server} to seed from: {exc}".strip()
        ) from exc
    own: _Stream | None = None
    try:
        with peer:
            stream = _status(peer).get("stream")
            if stream is not None:
                own = _own_stream(backend, stream["slot"])
                _wait_for(peer, own.start, backend)
            info, size = _receive(peer, staged)
        if own is not None:
            applied = int(info["stream"]["applied_lsn"])
            if applied < own.start:  # (the peer's stream went back: a bug, or another slot)
                raise OperationalError(
                    f"the peer's copy is at stream position {lsn_text(applied)}, before this "
                    f"file's slot starts ({lsn_text(own.start)}): seed again"
                )
        views = _settle(staged, backend, own)
        staged.replace(cache_path)
    except BaseException:
        with contextlib.suppress(OSError):
            staged.unlink()
        with contextlib.suppress(OSError):
            staged.with_name(staged.name + ".wal").unlink()
        if own is not None:
            with contextlib.suppress(psycopg.Error, OperationalError):
                drop_slot(backend, own.name)
                drop_publication(backend, own.name)
        raise
    position = lsn_text(int(info["stream"]["applied_lsn"])) if info["stream"] else None
    return Seeded(cache_path, size, views, time.monotonic() - began, position)


def _status(peer: psycopg.Connection[t.Any]) -> dict[str, t.Any]:
    try:
        rows = peer.execute("SHOW CACHE STATUS").fetchall()
    except psycopg.Error as exc:
        raise translate(exc, "reading the peer's status (SHOW CACHE STATUS)") from exc
    return status_document(rows)


@dataclass(frozen=True)
class _Stream:
    name: str  # the slot's and the publication's
    start: int  # the slot's consistent point: every transaction committed after is in it


def _own_stream(backend: str, peer_publication: str) -> _Stream:
    """A publication of the peer's tables and a slot, both this file's."""
    with connect_backend(backend, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s "
            "ORDER BY 1, 2",
            (peer_publication,),
        ).fetchall()
    if not tables:
        raise ProgrammingError(
            f"the peer's publication {peer_publication} is not in this backend: seed from a "
            "cache server in front of the same database (--backend)"
        )
    name = SLOT_PREFIX + secrets.token_hex(8)
    create_publication(backend, name, [(s, n) for s, n in tables])
    try:
        with create_slot(backend, name) as start:
            return _Stream(name, start.consistent_lsn)
    except BaseException:
        with contextlib.suppress(psycopg.Error, OperationalError):
            drop_publication(backend, name)
        raise


def _wait_for(peer: psycopg.Connection[t.Any], position: int, backend: str) -> None:
    """Until the peer has applied a transaction committed after ``position``: a heartbeat
    beat of its own, which the peer's stream carries."""
    with connect_backend(backend, autocommit=True) as conn:
        beat(conn, source="mtcache clone")
    deadline = time.monotonic() + CATCH_UP_SECONDS
    while True:
        stream = _status(peer).get("stream") or {}
        applied = stream.get("applied_lsn")
        if applied is not None and lsn_value(applied) > position:
            return
        if time.monotonic() > deadline:
            raise OperationalError(
                f"the peer's stream has not applied position {lsn_text(position)} within "
                f"{CATCH_UP_SECONDS:.0f} s (it is at {applied}; problem: "
                f"{stream.get('problem')}): seed again once it runs"
            )
        time.sleep(0.2)


def _receive(peer: psycopg.Connection[t.Any], staged: Path) -> tuple[dict[str, t.Any], int]:
    """The peer's copy written to ``staged``; what the seed row says, and the bytes."""
    try:
        with peer.cursor(binary=True) as cur:
            cur.execute("SHOW CACHE SEED")
            first = cur.fetchone()
            if first is None or first[0] != "seed":
                raise OperationalError("the peer sent no seed: is it an mtcache server?")
            info = json.loads(bytes(first[1]))
            if info.get("format") != FORMAT:
                raise ProgrammingError(
                    f"the peer's seed is of format {info.get('format')}, this mtcache reads "
                    f"{FORMAT}: run the same mtcache version on both"
                )
            size = 0
            with staged.open("wb") as out:
                for part, data in cur:
                    assert part == "file"
                    out.write(data)
                    size += len(data)
    except psycopg.Error as exc:
        raise translate(exc, "taking the peer's seed (SHOW CACHE SEED)") from exc
    if size != info["bytes"]:
        raise OperationalError(f"the peer's seed ended at {size} of {info['bytes']} bytes")
    return info, size


def _settle(staged: Path, backend: str, own: _Stream | None) -> int:
    """Check the copy against the backend and make it this file's: its own slot, its own
    counters. The number of views it holds."""
    store = CacheStore(staged)
    try:
        schema = store.load_schema()
        _same_backend(store, backend, [v.table for v in schema.views.values() if v.table])
        with store.transaction() as con:
            if own is not None:
                con.execute(
                    "UPDATE mtcache.stream SET slot = ?, publication = ?", [own.name, own.name]
                )
            con.execute("UPDATE mtcache.counters SET value = 0")
    finally:
        store.close()
    return len(schema.views)


def _same_backend(store: CacheStore, backend: str, tables: list[str]) -> None:
    """The copy's tables as this backend has them (the same columns and types): else it
    fronts another database."""
    theirs, ours = store.load_catalog(), fetch_catalog(backend)
    for name in sorted(set(tables)):
        mine, copied = ours.table(name), theirs.table(name)
        if copied is None:
            continue
        shape = [(c.name, c.type) for c in copied.columns]
        if mine is None or [(c.name, c.type) for c in mine.columns] != shape:
            raise ProgrammingError(
                f"the peer's table {name} is not this backend's: seed from a cache server in "
                "front of the same database (--backend)"
            )
