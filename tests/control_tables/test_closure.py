"""AC(U) and MaxAC(U): the general algorithm (any schema) and the one-pass algorithm for safe
schemas agree on the Fig 3.2 cache; the general one also handles an unsafe schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.reflect import fetch_catalog
from cache.maintenance.pipeline import Maintainer
from cache.store.cache_file import CacheStore
from cache.tools import bookstore
from control_tables.closure import (
    affected_closure,
    affected_closure_safe,
    max_affected_closure,
    max_affected_closure_safe,
)
from control_tables.kinds import RegionKind
from control_tables.regions import Region
from control_tables.schema import CachedView, CacheSchema
from sql_ext import Completeness, Consistency, Presence, parse
from tests.store.test_store import SCHEMA_FILE


@pytest.fixture(scope="module")
def populated(
    pg_cluster: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CacheStore]:
    dsn = pg_cluster.create_database("closure_fig32")
    bookstore.load_into(dsn)
    store = CacheStore(tmp_path_factory.mktemp("closure") / "cache.duckdb")
    store.save_catalog(fetch_catalog(dsn))
    store.apply_ddl(parse(SCHEMA_FILE.read_text()), store.load_catalog())
    maintainer = Maintainer(store, dsn)
    maintainer.admit("citylist_csct", [("Madison",), ("Seattle",)])
    maintainer.admit("citylist_cpct", [("Chicago",)])
    maintainer.admit("authorlist_pct", [(4,), (8,), (6,), (5,), (3,)])
    maintainer.admit("reviewerlist_pct", [(2,)])
    yield store
    store.close()


SEEDS = [
    Region("authorcopy", RegionKind.PRESENCE, ("authorid",), (4,), "authorlist_pct"),
    Region("authorcopy", RegionKind.PRESENCE, ("authorid",), (5,), "authorlist_pct"),
    Region("authorcopy", RegionKind.PRESENCE, ("authorid",), (3,), "authorlist_pct"),
    Region("authorcopy", RegionKind.CONSISTENCY, ("city",), ("Seattle",), "citylist_csct"),
    Region("authorcopy", RegionKind.COMPLETENESS, ("city",), ("Chicago",), "citylist_cpct"),
    Region("reviewercopy", RegionKind.PRESENCE, ("reviewerid",), (2,), "reviewerlist_pct"),
    Region("reviewcopy", RegionKind.VIEW),
]


@pytest.mark.parametrize("seed", SEEDS, ids=str)
def test_one_pass_closure_equals_the_general_one_on_a_safe_schema(
    populated: CacheStore, seed: Region
) -> None:
    schema = populated.load_schema()
    general, regions = affected_closure(populated.con, schema, [seed])
    safe = affected_closure_safe(populated.con, schema, [seed])
    assert safe == general
    assert max_affected_closure_safe(populated.con, schema, safe) == max_affected_closure(
        general, regions
    )


def test_closure_of_a_madison_author(populated: CacheStore) -> None:
    schema = populated.load_schema()
    seed = Region("authorcopy", RegionKind.PRESENCE, ("authorid",), (4,), "authorlist_pct")
    closure = affected_closure_safe(populated.con, schema, [seed])
    assert {str(r) for r in closure} == {
        "authorcopy presence(authorid=4)",
        "authorcopy presence(authorid=8)",
        "authorcopy consistency(city='Madison')",
        "bookcopy presence(authorid=4)",
        "bookcopy presence(authorid=8)",
    }
    assert {str(r) for r in max_affected_closure_safe(populated.con, schema, closure)} == {
        "authorcopy consistency(city='Madison')",
        "bookcopy presence(authorid=4)",
        "bookcopy presence(authorid=8)",
    }


def test_general_closure_follows_overlapping_regions_of_an_unsafe_view(tmp_path: Path) -> None:
    """The paper's Rule 5 counter-example: reviewers consistent by gender and by city; x, y
    from WI, z from WA; x, z male, y female. Regions {x, y} (WI) and {x, z} (male) overlap, so
    refreshing y affects z: only the general algorithm can see it (the DDL refuses such a
    schema, so it is built directly here)."""
    con = duckdb.connect(str(tmp_path / "unsafe.duckdb"))
    con.execute("CREATE TABLE rv (id INTEGER PRIMARY KEY, gender VARCHAR, state VARCHAR)")
    con.execute(
        "INSERT INTO rv VALUES (1, 'M', 'WI'), (2, 'F', 'WI'), (3, 'M', 'WA'), (4, 'F', 'CA')"
    )
    con.execute("CREATE TABLE pct (id INTEGER, refreshed_at TIMESTAMPTZ, snapshot_id BIGINT)")
    con.execute("INSERT INTO pct (id) VALUES (1), (2), (3), (4)")
    view = CachedView(
        name="rv",
        table="reviewers",
        columns=("id", "gender", "state"),
        key=("id",),
        where=None,
        presence=(Presence(("id",), "pct", ("id",)),),
        consistency=Consistency("on", ("gender",), None),
        completeness=Completeness(("state",), None),
        refresh_seconds=None,
        statement="",
    )
    schema = CacheSchema(control_tables={}, views={"rv": view})
    seed = Region("rv", RegionKind.PRESENCE, ("id",), (2,), "pct")  # y
    closure, regions = affected_closure(con, schema, [seed])
    assert Region("rv", "completeness", ("state",), ("WI",)) in closure
    assert Region("rv", "consistency", ("gender",), ("M",)) in closure  # via x
    assert Region("rv", "presence", ("id",), (3,), "pct") in closure  # z
    assert Region("rv", "consistency", ("gender",), ("F",)) in closure  # y's own gender
    assert Region("rv", "presence", ("id",), (4,), "pct") in closure  # via the F region
    chosen = max_affected_closure(closure, regions)
    assert Region("rv", "completeness", ("state",), ("WI",)) in chosen
    assert not any(r.kind == "presence" and r.values in {(1,), (2,), (3,)} for r in chosen)
    con.close()


@pytest.mark.parametrize(
    "rows",
    [
        [(i,) for i in range(-5, 300)],
        [(f"k'{i}\\%",) for i in range(200)],
        [(i, f"o'{i}") for i in range(100)],
    ],
)
def test_a_long_key_list_written_as_text_selects_what_the_literal_list_selects(
    rows: list[tuple[object, ...]],
) -> None:
    """A region list of integers and strings at least FAST_LIST long is written as text at
    once: DuckDB selects with it exactly the rows the list of literals selects (quotes and
    backslashes included); a list of one column prints alike for PostgreSQL."""
    from sqlglot import exp

    from control_tables.regions import FAST_LIST, in_list

    assert len(rows) >= FAST_LIST
    columns = ["a", "b"][: len(rows[0])]
    fast = in_list(columns, rows)
    assert isinstance(fast, exp.Var)
    slow = exp.In(
        this=exp.Tuple(expressions=[exp.column(c, quoted=True) for c in columns]),
        expressions=[exp.Tuple(expressions=[exp.convert(v) for v in r]) for r in rows],
    )
    if len(columns) == 1:
        slow = exp.In(
            this=exp.column("a", quoted=True), expressions=[exp.convert(r[0]) for r in rows]
        )
    if len(columns) == 1:  # (composite keys: a VALUES list, which PostgreSQL joins)
        assert fast.sql("postgres") == slow.sql("postgres")
    con = duckdb.connect()
    kinds = ", ".join(
        f"{c} {'INTEGER' if isinstance(rows[0][i], int) else 'VARCHAR'}"
        for i, c in enumerate(columns)
    )
    con.execute(f"CREATE TABLE t ({kinds})")
    con.executemany(
        f"INSERT INTO t VALUES ({', '.join('?' for _ in columns)})",
        [*rows, *[tuple(v * 2 if isinstance(v, int) else v + "x" for v in r) for r in rows]],
    )
    got = con.execute(f"SELECT * FROM t WHERE {fast.sql('duckdb')} ORDER BY ALL").fetchall()
    want = con.execute(f"SELECT * FROM t WHERE {slow.sql('duckdb')} ORDER BY ALL").fetchall()
    assert got == want and len(got) >= len(rows)
