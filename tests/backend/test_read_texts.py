"""PostgreSQL's text values typed by Arrow's casts (cache.backend.copy_arrow.read_texts, what
the stream's changes go through) exactly as the pull's CSV reader types them (read_csv): the
same values and Arrow types, and the same refusals, for every kind of cached column."""

from __future__ import annotations

import decimal
import typing as t
import uuid

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.backend.copy_arrow import read_csv, read_texts


def format_fixed(value: decimal.Decimal) -> str:
    return format(value, "f")  # (PostgreSQL writes numeric without an exponent)


text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20)
KINDS: dict[str, st.SearchStrategy[str]] = {
    "SMALLINT": st.integers(-(2**15), 2**15 - 1).map(str),
    "INTEGER": st.integers(-(2**31), 2**31 - 1).map(str),
    "BIGINT": st.integers(-(2**63), 2**63 - 1).map(str),
    "DECIMAL(12,2)": st.decimals(-(10**10) + 1, 10**10 - 1, places=2).map(str),
    "DECIMAL(38,10)": st.decimals(-(10**28) + 1, 10**28 - 1, places=10).map(format_fixed),
    "VARCHAR": st.one_of(text, st.sampled_from(['"', '""', "a,b", "x\ny", "", " ", "NA"])),
    "BPCHAR": text,
    "UUID": st.uuids().map(str),
    "DATE": st.integers(-(2**31) + 1, 2**31 - 1).map(str),  # days, as a pull sends them
    "TIMESTAMP": st.integers(-(2**62), 2**62).map(str),  # microseconds
    "TIMESTAMPTZ": st.integers(-(2**62), 2**62).map(str),
    "TIME": st.integers(0, 86_400_000_000).map(str),
    "DOUBLE": st.one_of(
        st.floats(allow_nan=False).map(repr),
        st.sampled_from(["Infinity", "-Infinity", "NaN", "1e+30", "-0"]),
    ),
    "FLOAT": st.floats(width=32, allow_nan=False).map(repr),
    "BOOLEAN": st.sampled_from(["t", "f"]),
}


def csv_of(rows: list[tuple[str | None, ...]]) -> bytes:
    """The CSV a pull reads: NULL unquoted and empty, every other value quoted."""
    return "".join(
        ",".join("" if v is None else '"' + v.replace('"', '""') + '"' for v in row) + "\n"
        for row in rows
    ).encode()


def texts(rows: list[tuple[str | None, ...]], names: list[str]) -> pa.Table:
    return pa.table(
        {n: pa.array([r[i] for r in rows], pa.large_string()) for i, n in enumerate(names)}
    )


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_typed_as_the_pull_s_reader_types_them(data: st.DataObject) -> None:
    kinds = data.draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=4))
    columns = [(f"c{i}", kind) for i, kind in enumerate(kinds)]
    rows = data.draw(
        st.lists(
            st.tuples(*[st.one_of(st.none(), KINDS[k]) for k in kinds]), min_size=1, max_size=8
        )
    )
    expected = read_csv(csv_of(rows), columns)
    got = read_texts(texts(rows, [n for n, _ in columns]), columns)
    assert got.schema == expected.schema
    assert [exact(c) for c in got.columns] == [exact(c) for c in expected.columns]


def exact(column: pa.ChunkedArray) -> list[t.Any]:
    """A column's values bit for bit (NaN as its bits; dates and times as their numbers,
    some beyond Python's datetime)."""
    array = column.combine_chunks()
    kind = array.type
    if pa.types.is_floating(kind) or pa.types.is_temporal(kind) or pa.types.is_integer(kind):
        return array.view(getattr(pa, f"int{kind.bit_width}")()).to_pylist()
    return array.to_pylist()


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("INTEGER", "2147483648"),
        ("SMALLINT", "40000"),
        ("INTEGER", "1.5"),
        ("BIGINT", "x"),
        ("DECIMAL(12,2)", "0.001"),
        ("DECIMAL(4,2)", "123.45"),
        ("DATE", "2026-11-28"),
    ],
)
def test_refused_as_the_pull_s_reader_refuses(kind: str, value: str) -> None:
    columns = [("c", kind)]
    with pytest.raises(pa.ArrowInvalid):
        read_csv(csv_of([(value,)]), columns)
    with pytest.raises(pa.ArrowInvalid):
        read_texts(texts([(value,)], ["c"]), columns)


def test_the_exact_values() -> None:
    columns = [("i", "INTEGER"), ("d", "DECIMAL(12,2)"), ("u", "UUID"), ("s", "VARCHAR")]
    rows: list[tuple[t.Any, ...]] = [
        ("-5", "1.5", str(uuid.UUID(int=7)), 'say "hi"'),
        (None, "-0.00", None, ""),
    ]
    got = read_texts(texts(rows, [n for n, _ in columns]), columns).to_pylist()
    assert got == [
        {"i": -5, "d": decimal.Decimal("1.50"), "u": str(uuid.UUID(int=7)), "s": 'say "hi"'},
        {"i": None, "d": decimal.Decimal("0.00"), "u": None, "s": ""},
    ]
