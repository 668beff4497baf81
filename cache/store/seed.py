"""A seed: a consistent copy of a cache file, for a new cache server to start from instead of
pulling every view from the backend (`SHOW CACHE SEED` on the serving side, `mtcache clone` and
``mtcache serve --seed-from`` on the new one: `cache.maintenance.seeding`).

The copy is DuckDB's ``COPY FROM DATABASE`` into a new file, inside one read transaction of
the cache file: every view, control table and region, with their stamps (the backend moments
their rows are from) and the stream's applied position, at one DuckDB snapshot. Writers go on
meanwhile. The new file's bytes travel as the rows of the statement's result: first a
``seed`` row (JSON: what the copy is), then the file in chunks of `CHUNK_BYTES`.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import tempfile
import typing as t
from pathlib import Path

import duckdb

from cache.store.cache_file import CacheStore

CHUNK_BYTES = 1 << 20
FORMAT = 1  # the seed's layout (a new cache server refuses another)


def take_seed(store: CacheStore) -> list[tuple[str, bytes]]:
    """The rows of `SHOW CACHE SEED` for the file of ``store``: ("seed", JSON), then
    ("file", bytes) chunks of a copy of every table at one snapshot."""
    name = f"mtcache_seed_{secrets.token_hex(6)}"
    con = store.con.cursor()
    try:
        with tempfile.TemporaryDirectory(prefix="mtcache-seed-") as directory:
            path = str(Path(directory) / "seed.duckdb").replace("'", "''")
            con.execute("BEGIN TRANSACTION")
            try:
                source = str(_one(con, "SELECT current_database()")).replace('"', '""')
                stream = con.execute(
                    "SELECT slot, publication, applied_lsn FROM mtcache.stream"
                ).fetchall()
                con.execute(f"ATTACH '{path}' AS {name}")
                con.execute(f'COPY FROM DATABASE "{source}" TO {name}')
                con.execute("COMMIT")
            except BaseException:
                _rollback(con)
                raise
            finally:
                with contextlib.suppress(duckdb.Error):  # (gone with a rolled back ATTACH)
                    con.execute(f"DETACH DATABASE IF EXISTS {name}")
            data = Path(directory, "seed.duckdb").read_bytes()
    finally:
        con.close()
    info: dict[str, t.Any] = {
        "format": FORMAT,
        "duckdb": duckdb.__version__,
        "bytes": len(data),
        "stream": (
            {"slot": stream[0][0], "publication": stream[0][1], "applied_lsn": int(stream[0][2])}
            if stream
            else None
        ),
    }
    rows = [("seed", json.dumps(info).encode())]
    rows += [("file", data[at : at + CHUNK_BYTES]) for at in range(0, len(data), CHUNK_BYTES)]
    return rows


def _one(con: duckdb.DuckDBPyConnection, query: str) -> t.Any:
    row = con.execute(query).fetchone()
    assert row is not None
    return row[0]


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    with contextlib.suppress(duckdb.Error):  # (no transaction left to roll back)
        con.execute("ROLLBACK")
