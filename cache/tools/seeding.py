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
import logging
import os
import secrets
import tempfile
import time
import typing as t
from dataclasses import dataclass
from pathlib import Path

import psycopg

from cache.backend.pgoutput.messages import lsn_text, lsn_value
from cache.backend.reflect import connect_backend, fetch_catalog
from cache.backend.replication import (
    create_publication,
    create_slot,
    drop_publication,
    drop_slot,
    publication_tables,
)
from cache.dbapi.remote import server_conninfo
from cache.engine.inspect import status_document
from cache.maintenance.stream.position import SLOT_PREFIX
from cache.store.cache_file import CacheStore
from cache.store.seed import FORMAT
from heartbeat.beat import beat
from sql_ext.errors import OperationalError, ProgrammingError, translate

log = logging.getLogger("mtcache.seeding")

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
    for existing in (cache_path, cache_path.with_name(cache_path.name + ".wal")):
        if existing.exists():
            raise ProgrammingError(
                f"{existing} exists: a seed makes a new cache file (give another --cache, or "
                "remove that one)"
            )
    began = time.monotonic()
    try:
        peer = psycopg.connect(server_conninfo(server, backend), autocommit=True)
    except psycopg.Error as exc:
        raise OperationalError(
            f"cannot reach the cache server at {server} to seed from: {exc}".strip()
        ) from exc
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(
        prefix=f"{cache_path.name}.", suffix=".seeding", dir=cache_path.parent
    )
    os.close(handle)
    staged = Path(name)
    own: _Stream | None = None
    try:
        with peer:
            stream = _status(peer).get("stream")
            if stream is not None:
                own = _own_stream(backend, stream["slot"])
                _wait_for(peer, own.start, backend)
            info, size = _receive(peer, staged)
        _check_stream(info["stream"], own, backend)
        views = _settle(staged, backend, own)
        try:
            os.link(staged, cache_path)  # (never over a file made meanwhile)
        except FileExistsError as exc:
            raise ProgrammingError(
                f"{cache_path} was made while seeding: a seed makes a new cache file"
            ) from exc
    except BaseException:
        if own is not None:
            _drop_stream(backend, own.name)
        raise
    finally:
        for leftover in (staged, staged.with_name(staged.name + ".wal")):
            with contextlib.suppress(OSError):
                leftover.unlink()
    position = lsn_text(int(info["stream"]["applied_lsn"])) if info["stream"] else None
    return Seeded(cache_path, size, views, time.monotonic() - began, position)


def _check_stream(copied: dict[str, t.Any] | None, own: _Stream | None, backend: str) -> None:
    """The copy's stream is the one this file's slot was made for: the peer made or dropped
    no continuous view meanwhile, its publication has the same tables, and the copy is past
    the slot's start."""
    if (copied is None) != (own is None) or (
        own is not None
        and copied is not None
        and publication_tables(backend, copied["publication"]) != own.tables
    ):
        raise OperationalError(
            "the peer's continuously maintained views changed while seeding: seed again"
        )
    if own is not None and copied is not None and int(copied["applied_lsn"]) < own.start:
        raise OperationalError(  # (the peer's stream went back: a bug, or another slot)
            f"the peer's copy is at stream position {lsn_text(int(copied['applied_lsn']))}, "
            f"before this file's slot starts ({lsn_text(own.start)}): seed again"
        )


def _drop_stream(backend: str, name: str) -> None:
    """The slot and publication made for a seed that failed (each dropped on its own; one
    left behind is logged with its name, for an operator to drop)."""
    for what, drop in (("replication slot", drop_slot), ("publication", drop_publication)):
        try:
            drop(backend, name)
        except (psycopg.Error, OperationalError) as exc:
            log.error("could not drop the %s %s a failed seed made: %s", what, name, exc)


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
    tables: tuple[tuple[str, str], ...]  # what the publication carries


def _own_stream(backend: str, peer_publication: str) -> _Stream:
    """A publication of the peer's tables and a slot, both this file's."""
    tables = publication_tables(backend, peer_publication)
    if not tables:
        raise ProgrammingError(
            f"the peer's publication {peer_publication} is not in this backend: seed from a "
            "cache server in front of the same database (--backend)"
        )
    name = SLOT_PREFIX + secrets.token_hex(8)
    create_publication(backend, name, list(tables))
    try:
        with create_slot(backend, name) as start:
            return _Stream(name, start.consistent_lsn, tables)
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
