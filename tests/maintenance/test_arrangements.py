"""The copies' arrangements in memory (cache.maintenance.stream.arrangements): after any
sequence of batches (rows leaving by key, rows arriving; runs merging), a probe finds
exactly the live rows a scan of the same rows finds. No database."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.maintenance.stream.arrangements import Arrangement, Arrangements, indexable

SCHEMA = pa.schema(
    [
        ("k1", pa.int32()),
        ("k2", pa.int64()),
        ("joined", pa.int64()),
        ("day", pa.date32()),
        ("label", pa.string()),
    ]
)


def table(rows: list[tuple[int, int, int | None, int, str]]) -> pa.Table:
    return pa.table(
        {
            "k1": pa.array([r[0] for r in rows], pa.int32()),
            "k2": pa.array([r[1] for r in rows], pa.int64()),
            "joined": pa.array([r[2] for r in rows], pa.int64()),
            "day": pa.array(
                [dt.date(2000, 1, 1) + dt.timedelta(days=r[3]) for r in rows], pa.date32()
            ),
            "label": pa.array([r[4] for r in rows], pa.string()),
        },
        schema=SCHEMA,
    )


ROW = st.tuples(
    st.integers(0, 6),
    st.integers(-2, 2),
    st.one_of(st.none(), st.integers(-3, 3)),
    st.integers(0, 5),
    st.text(alphabet="aé\x01 ", max_size=3),
)


@settings(max_examples=150, deadline=None)
@given(
    first=st.lists(ROW, max_size=30),
    batches=st.lists(
        st.tuples(st.lists(st.integers(0, 100)), st.lists(ROW, max_size=12)), max_size=12
    ),
    probes=st.lists(st.one_of(st.none(), st.integers(-4, 7)), max_size=10),
)
def test_a_probe_finds_the_live_rows_a_scan_finds(
    first: list[tuple[int, int, int | None, int, str]],
    batches: list[tuple[list[int], list[tuple[int, int, int | None, int, str]]]],
    probes: list[int | None],
) -> None:
    def keyed(rows: list[tuple[int, int, int | None, int, str]]) -> dict[tuple[int, int], tuple]:
        return {(r[0], r[1]): r for r in rows}

    model = keyed(first)
    arranged = Arrangement(
        ("spec",), ("k1", "k2"), ("k1", "joined", "day", "label"), table(list(model.values()))
    )
    for leaving, arriving in batches:
        # (a batch's keys: some the copy holds leave; its final rows arrive, one per key)
        keys = sorted(model)
        gone = sorted({keys[i % len(keys)] for i in leaving} if keys else set())
        final = keyed(arriving)
        gone = sorted(set(gone) | (set(final) & set(model)))
        assert arranged.remove(table([model[k] for k in gone]).select(["k1", "k2"]))
        for k in gone:
            del model[k]
        arranged.add(table(list(final.values())))
        model.update(final)
        assert sum(run.live for run in arranged.runs) == len(model)
    for column in ("k1", "joined"):
        values = pa.array(probes, pa.int64())
        which, found = arranged.probe(column, values)
        got = sorted(
            (probes[i], tuple(found.slice(n, 1).to_pylist()[0].values()))
            for n, i in enumerate(which)
        )
        index = 0 if column == "k1" else 2
        want = sorted(
            (p, tuple(table([r]).to_pylist()[0].values()))
            for p in probes
            if p is not None
            for r in model.values()
            if r[index] == p
        )
        assert got == want
    labels = pa.array(["", "a", None, "é"])
    which, found = arranged.probe("label", labels)
    assert sorted(found.column("label").to_pylist()) == sorted(
        r[4] for r in model.values() if r[4] in ("", "a", "é")
    )
    days = pa.array([dt.date(2000, 1, 1) + dt.timedelta(days=d) for d in (0, 3)], pa.date32())
    which, found = arranged.probe("day", days)
    assert sorted(found.column("day").to_pylist()) == sorted(
        dt.date(2000, 1, 1) + dt.timedelta(days=r[3]) for r in model.values() if r[3] in (0, 3)
    )


def test_values_of_another_kind_are_refused_not_compared() -> None:
    arranged = Arrangement(("spec",), ("k1", "k2"), ("k1", "day"), table([(1, 1, None, 0, "a")]))
    with pytest.raises(ValueError, match="probing"):
        arranged.probe("day", pa.array([10957], pa.int32()))  # (2000-01-01 as a number)
    with pytest.raises(ValueError, match="probing"):
        arranged.probe("k1", pa.array(["1"]))


def test_removing_a_row_the_arrangement_lacks_says_so() -> None:
    arranged = Arrangement(("spec",), ("k1", "k2"), ("k1",), table([(1, 1, None, 0, "a")]))
    assert not arranged.remove(table([(1, 2, None, 0, "a")]).select(["k1", "k2"]))


def test_integers_dates_and_texts_are_indexed() -> None:
    assert indexable(pa.int16()) and indexable(pa.int64()) and indexable(pa.date32())
    assert indexable(pa.string())
    assert not indexable(pa.decimal128(10, 2))
    assert not indexable(pa.float64())
    assert not indexable(pa.uint64())  # (past int64)


def test_an_arrangement_over_the_limit_is_not_made_and_not_tried_again() -> None:
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE c AS SELECT range AS k, range * 2 AS j FROM range(1000)")
    con.execute("CREATE TABLE f AS SELECT range AS k, range / 2 AS j FROM range(10)")
    floats = Arrangements()  # (a column it cannot index: not made)
    assert floats.arranged(con, "f", "f", ("k",), ("s",), ("k", "j"), ("k", "j")) is None
    small = Arrangements(limit=100)
    assert small.arranged(con, "t", "c", ("k",), ("s",), ("k", "j"), ("k", "j")) is None
    con.execute("DROP TABLE c")  # (not read again for the same spec)
    assert small.arranged(con, "t", "c", ("k",), ("s",), ("k", "j"), ("k", "j")) is None
    con.execute("CREATE TABLE c AS SELECT range AS k, range * 2 AS j FROM range(1000)")
    roomy = Arrangements()
    made = roomy.arranged(con, "t", "c", ("k",), ("s",), ("k", "j"), ("k", "j"))
    assert made is not None and roomy.kept("t", ("s",)) is made
    _, found = made.probe("j", pa.array([4, 5, 1998]))
    assert found.column("k").to_pylist() == [2, 999]
    assert roomy.kept("t", ("other",)) is None and roomy.kept("t", ("s",)) is None


def test_a_probe_by_a_text_longer_than_any_indexed_finds_none() -> None:
    arranged = Arrangement(("spec",), ("k1", "k2"), ("label",), table([(1, 1, None, 0, "a")]))
    which, found = arranged.probe("label", pa.array(["x" * 100_000, "a", None] * 1000))
    assert found.num_rows == 1000 and set(found.column("label").to_pylist()) == {"a"}
    assert {int(w) % 3 for w in which} == {1}  # (each "a", none of the long texts)


def test_texts_too_long_to_index_are_refused() -> None:
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE c AS SELECT range::VARCHAR AS k, range AS j FROM range(100)")
    roomy = Arrangements()
    made = roomy.arranged(con, "t", "c", ("k",), ("s",), ("k", "j"), ("k", "j"))
    assert made is not None
    long = pa.table({"k": ["x" * 65], "j": pa.array([1], pa.int64())})
    assert made.takes(long.cast(made.schema)) is False
    assert made.takes(pa.table({"k": ["x" * 64], "j": [1]}).cast(made.schema))
    roomy.forget("t", refuse=True)  # (as a batch bringing such a text does)
    assert roomy.arranged(con, "t", "c", ("k",), ("s",), ("k", "j"), ("k", "j")) is None
    con.execute("CREATE TABLE d AS SELECT repeat('y', 100) || range AS k, range AS j FROM range(9)")
    assert roomy.arranged(con, "d", "d", ("k",), ("s",), ("k", "j"), ("k", "j")) is None


def test_a_table_no_view_of_the_batch_arranges_is_forgotten() -> None:
    """An arrangement the batch would not keep (its views left, or wait for a pull) is not
    left to come back stale when they return."""
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE c AS SELECT range AS k, range * 10 AS j FROM range(5)")
    kept = Arrangements()
    for table in ("t", "u"):
        assert kept.arranged(con, table, "c", ("k",), ("s",), ("k", "j"), ("k", "j")) is not None
    kept.keep_only({"u"})
    assert set(kept.tables) == {"u"}
