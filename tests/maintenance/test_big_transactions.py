"""Big backend transactions on continuously maintained views (issue 30): streamed by the
backend while in progress (pgoutput protocol 2), spilled to disk in pieces, applied at their
commit in one DuckDB transaction - whole or not at all; a SIGKILL between two pieces loses
and repeats nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.reflect import fetch_catalog
from cache.maintenance import stream
from cache.maintenance.pipeline import Maintainer
from cache.store.cache_file import CacheStore
from sql_ext import parse

ROWS = 12_000
PIECE = 1_500  # changes per spilled piece (the default is 50,000)
SCHEMA = """
CREATE CACHED VIEW lotcopy AS SELECT * FROM lots REFRESH CONTINUOUSLY;
CREATE CACHED VIEW lotsums AS SELECT grp, count(*) AS n, sum(amount) AS total FROM lots
    GROUP BY grp REFRESH CONTINUOUSLY;
"""
BIG = f"""
BEGIN;
UPDATE lots SET amount = amount + 1, label = label || '+';
SAVEPOINT s;
UPDATE lots SET amount = -1 WHERE id <= 3000;
ROLLBACK TO SAVEPOINT s;
DELETE FROM lots WHERE id % 10 = 0;
INSERT INTO lots SELECT g, g % 7, 'new ' || g, g / 3.0 FROM generate_series({ROWS + 1},
    {ROWS + 2000}) g;
INSERT INTO lots VALUES (10, 3, 'deleted, back', 1.00);
UPDATE lots SET id = id + 100000 WHERE id BETWEEN 101 AND 150;
COMMIT;
"""
OWNER = """
import sys
from cache.maintenance import stream
from cache.store.cache_file import CacheStore

dsn, path, piece = sys.argv[1], sys.argv[2], int(sys.argv[3])
with CacheStore(path) as store, stream.Consumer(store, dsn, spill_changes=piece) as consumer:
    consumer.catch_up()
"""


@pytest.fixture
def lots(pg_cluster: EmbeddedPostgres, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    dsn = pg_cluster.create_database("big_transactions")
    with psycopg.connect(dsn, autocommit=True) as pg:
        # the backend streams a transaction once it decodes more than this (the minimum)
        pg.execute("ALTER DATABASE big_transactions SET logical_decoding_work_mem = '64kB'")
        pg.execute(
            "CREATE TABLE lots (id integer PRIMARY KEY, grp integer NOT NULL, "
            "label text NOT NULL, amount numeric(12,2) NOT NULL)"
        )
        pg.execute(
            f"INSERT INTO lots SELECT g, g % 7, 'lot ' || g, g / 3.0 FROM "
            f"generate_series(1, {ROWS}) g"
        )
    path = tmp_path / "cache.duckdb"
    with CacheStore(path) as store:
        stream.apply_ddl(store, dsn, parse(SCHEMA), fetch_catalog(dsn))
        maintainer = Maintainer(store, dsn)
        maintainer.refresh("lotcopy")
        maintainer.refresh("lotsums")
    try:
        yield dsn, path
    finally:
        with CacheStore(path) as store:
            stream.apply_ddl(
                store,
                dsn,
                parse("DROP CACHED VIEW lotcopy; DROP CACHED VIEW lotsums"),
                fetch_catalog(dsn),
            )


def _mirrors_backend(store: CacheStore, dsn: str) -> None:
    with psycopg.connect(dsn) as pg:
        rows = pg.execute("SELECT * FROM lots ORDER BY id").fetchall()
        sums = pg.execute(
            "SELECT grp, count(*), sum(amount) FROM lots GROUP BY grp ORDER BY grp"
        ).fetchall()
    assert store.con.execute("SELECT * FROM lotcopy ORDER BY id").fetchall() == rows
    assert store.con.execute("SELECT grp, n, total FROM lotsums ORDER BY grp").fetchall() == sums


def test_a_big_transaction_is_streamed_spilled_and_applied_whole(lots: tuple[str, Path]) -> None:
    dsn, path = lots
    with CacheStore(path) as store, stream.Consumer(store, dsn, spill_changes=PIECE) as consumer:
        consumer.catch_up()
        before = store.con.execute("SELECT applied_lsn FROM mtcache.stream").fetchall()
        with psycopg.connect(dsn, autocommit=True) as pg:
            pg.execute(BIG)
        consumer.catch_up()
        assert consumer.stream_blocks > 0  # the backend sent it while it was in progress
        assert consumer.spilled == 1  # applied from disk, piece by piece, in one transaction
        assert store.con.execute("SELECT applied_lsn FROM mtcache.stream").fetchall() != before
        _mirrors_backend(store, dsn)
        spill = path.with_name(path.name + ".spill")
        assert not [f for d in spill.iterdir() for f in d.iterdir()]  # (its pieces removed)


@pytest.mark.parametrize("point", ["stream_piece", "stream_apply"])
def test_a_sigkill_between_pieces_loses_and_repeats_nothing(
    lots: tuple[str, Path], tmp_path: Path, point: str
) -> None:
    """The owning process killed after a piece of the big transaction is applied (inside the
    DuckDB transaction, the rest not yet), or with all applied before the position is
    stored: reopened, the views equal the backend's rows and sums (a piece applied twice
    would count its rows twice in the sums)."""
    dsn, path = lots
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    run = [sys.executable, str(script), dsn, str(path), str(PIECE)]
    assert subprocess.run(run, timeout=300, check=False).returncode == 0  # caught up
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute(BIG)
    killed = subprocess.run(
        run,
        env={**os.environ, "MTCACHE_FAULTS": f"{point}:kill"},
        timeout=300,
        capture_output=True,
        text=True,
        check=False,
    )
    assert killed.returncode == -9, killed.stderr
    with CacheStore(path) as store:  # nothing of it landed
        assert store.con.execute(f"SELECT count(*) FROM lotcopy WHERE id > {ROWS}").fetchall() == [
            (0,)
        ]
    again = subprocess.run(run, timeout=300, capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stderr
    with CacheStore(path) as store:
        _mirrors_backend(store, dsn)
