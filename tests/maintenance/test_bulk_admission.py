"""Admitting and evicting many keys at once (issue 30): the regions' lists are written as text
at once, the closure and the status count rows set-based; the view holds exactly the
backend's rows of the keys admitted, and status counts each region's rows."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

import cache
from cache.backend.embedded_pg import EmbeddedPostgres

KEYS = 20_000


def test_twenty_thousand_keys_admitted_counted_and_evicted(
    pg_cluster: EmbeddedPostgres, tmp_path: Path
) -> None:
    dsn = pg_cluster.create_database("bulk_admission")
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute(
            "CREATE TABLE items (id integer PRIMARY KEY, grp integer NOT NULL, val text NOT NULL)"
        )
        pg.execute(
            f"INSERT INTO items SELECT g, g % 97, 'v''' || g FROM "
            f"generate_series(1, {KEYS + 5000}) g"
        )
        with cache.connect(
            dsn, tmp_path / "c.duckdb", background=False, admit_on_miss=False
        ) as conn:
            conn.admin.apply_ddl(
                "CREATE CONTROL TABLE ctl (grp integer, id integer); "
                "CREATE CACHED VIEW itemcopy AS SELECT * FROM items "
                "PRESENCE ON (grp, id) IN ctl"
            )
            keys = [(i % 97, i) for i in range(1, KEYS + 1)]
            conn.admin.admit("ctl", keys)
            store = conn.admin.store
            held = store.con.execute("SELECT * FROM itemcopy ORDER BY id").fetchall()
            assert (
                held
                == pg.execute("SELECT * FROM items WHERE id <= %s ORDER BY id", (KEYS,)).fetchall()
            )
            # more than REGIONS_LISTED regions: summed up, listed when asked
            [view] = conn.admin.status()["views"]
            assert view["regions"] is None and view["region_count"] == KEYS
            assert view["regions_never_refreshed"] == 0 and view["oldest_region_seconds"] >= 0
            [view] = conn.admin.status(["itemcopy"])["views"]
            regions = view["regions"]
            assert len(regions) == KEYS and all(r["rows"] == 1 for r in regions)
            assert {r["snapshot_id"] for r in regions} == {regions[0]["snapshot_id"]}
            conn.admin.refresh("itemcopy")  # (every region again, in one snapshot)
            gone = keys[: KEYS // 2]
            conn.admin.evict("ctl", gone)
            left = store.con.execute("SELECT min(id), count(*) FROM itemcopy").fetchone()
            assert left == (KEYS // 2 + 1, KEYS // 2)
            [view] = conn.admin.status(["itemcopy"])["views"]
            assert sum(r["rows"] for r in view["regions"]) == KEYS // 2


def test_the_duckdb_memory_limit_and_threads_are_options_status_shows(
    bookstore_dsn: str, tmp_path: Path
) -> None:
    """``memory_limit`` and ``threads`` (connect, a URL): DuckDB takes them, status shows them
    beside what is in use; a value DuckDB cannot take is a clear error, and nothing opened."""
    import sqlalchemy

    with cache.connect(
        bookstore_dsn, tmp_path / "c.duckdb", background=False, memory_limit="300MB", threads=1
    ) as conn:
        resources = conn.admin.status()["resources"]
        assert resources["memory_limit"] == "286.1 MiB" and resources["threads"] == 1
        assert resources["memory_in_use_bytes"] > 0 and resources["file_bytes"] >= 0
        assert resources["wal"] is not None
    for options, words in (
        ({"memory_limit": "lots"}, "DuckDB cannot take 'lots'"),
        ({"threads": 0}, "threads must be a positive number"),
    ):
        with pytest.raises(cache.ProgrammingError, match=words):
            cache.connect(bookstore_dsn, tmp_path / "d.duckdb", background=False, **options)
        assert not (tmp_path / "d.duckdb").exists()
    url = sqlalchemy.engine.make_url(bookstore_dsn).set(drivername="postgresql+mtcache")
    engine = sqlalchemy.create_engine(
        url.update_query_dict(
            {
                "cache_path": str(tmp_path / "e.duckdb"),
                "background": "false",
                "memory_limit": "200MB",
                "threads": "1",
                "cache_size_limit": "5MB",
                "doorkeeper_seconds": "30",
            }
        )
    )
    try:
        with engine.connect() as connection:
            raw = connection.connection.dbapi_connection
            status = raw.admin.status()  # type: ignore[union-attr]
            assert status["resources"]["threads"] == 1
            # the size budget and the doorkeeper (tests/store/test_budget.py) from a URL too
            assert status["resources"]["cache_size_limit"] == 5_000_000
            assert raw.engine.admissions.doorkeeper.seconds == 30.0  # type: ignore[union-attr]
    finally:
        engine.dispose()


def test_many_keys_are_admitted_in_pieces_whole_or_not_at_all(
    pg_cluster: EmbeddedPostgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ADMIT_PIECE keys an admission goes in pieces (bounded memory): one backend
    snapshot, one DuckDB transaction. Every region carries that one snapshot, the children
    come with their parents, and a key the backend lacks in the last piece leaves nothing
    admitted."""
    from cache.maintenance import pipeline

    monkeypatch.setattr(pipeline, "ADMIT_PIECE", 1000)
    dsn = pg_cluster.create_database("bulk_pieces")
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute("CREATE TABLE parts (id integer PRIMARY KEY, name text NOT NULL)")
        pg.execute(
            "CREATE TABLE uses (useid integer PRIMARY KEY, partid integer NOT NULL, "
            "qty integer NOT NULL)"
        )
        pg.execute("INSERT INTO parts SELECT g, 'part ' || g FROM generate_series(1, 4000) g")
        pg.execute("INSERT INTO uses SELECT g, 1 + g % 4000, g FROM generate_series(1, 9000) g")
        with cache.connect(
            dsn, tmp_path / "c.duckdb", background=False, admit_on_miss=False
        ) as conn:
            conn.admin.apply_ddl(
                "CREATE CONTROL TABLE part_pct (id integer); CREATE CACHED VIEW partcopy AS "
                "SELECT * FROM parts PRESENCE ON (id) IN part_pct; CREATE CACHED VIEW usecopy "
                "AS SELECT * FROM uses PRESENCE ON (partid) IN partcopy (id) CONSISTENCY ROOT"
            )
            con = conn.admin.store.con  # type: ignore[union-attr]
            lacking = [(k,) for k in range(1, 2501)] + [(99_999,)]
            with pytest.raises(cache.ProgrammingError, match=r"no rows for key \(99999,\)"):
                conn.admin.admit("part_pct", lacking)
            assert con.execute("SELECT count(*) FROM part_pct").fetchall() == [(0,)]
            assert con.execute("SELECT count(*) FROM usecopy").fetchall() == [(0,)]
            report = conn.admin.admit("part_pct", [(k,) for k in range(1, 2501)])
            assert len(report.regions) == 10  # (ten named, all counted: each part's
            assert report.region_count is not None and report.region_count >= 2500  # region)
            assert con.execute(
                "SELECT count(DISTINCT snapshot_id), count(*) FROM part_pct"
            ).fetchall() == [(1, 2500)]
            assert (
                con.execute("SELECT * FROM partcopy ORDER BY id").fetchall()
                == pg.execute("SELECT * FROM parts WHERE id <= 2500 ORDER BY id").fetchall()
            )
            assert (
                con.execute("SELECT * FROM usecopy ORDER BY useid").fetchall()
                == pg.execute("SELECT * FROM uses WHERE partid <= 2500 ORDER BY useid").fetchall()
            )
