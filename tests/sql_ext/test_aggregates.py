"""The table of the aggregates derived cached views keep (sql_ext/aggregates.py), without a
database: each entry classified as its states behave, and every aggregate the cache DDL
accepts an entry of the table (the grammar, the typed statement, the stored states, the
deltas and the matcher all read it)."""

from __future__ import annotations

import inspect

import pytest
from sqlglot import exp

from sql_ext import CreateCachedView, parse_one
from sql_ext.aggregates import AGGREGATES, COUNT_SUFFIX, NODES, SUM_SUFFIX, aggregate_of, listed
from sql_ext.errors import SqlSyntaxError

VIEW = "CREATE CACHED VIEW v AS SELECT b.authorid, {} AS a FROM books b GROUP BY b.authorid"


def test_each_aggregate_is_classified_as_its_states_behave() -> None:
    assert {n: a.classification for n, a in AGGREGATES.items()} == {
        "count": "accumulable",
        "sum": "accumulable",
        "avg": "accumulable",
        "min": "hierarchical",
        "max": "hierarchical",
    }
    for name, aggregate in AGGREGATES.items():
        assert aggregate.name == name and aggregate.node.key == name
        deltas = {s.delta for s in aggregate.states}
        if aggregate.hierarchical:
            # an extreme: merged by its own function, computed again when it may be lost
            assert aggregate.recompute is not None and deltas == {"extreme"}
            assert all(s.merge is s.function is aggregate.node for s in aggregate.states)
        else:
            # added up, deletions as well as insertions
            assert aggregate.recompute is None and deltas <= {"count", "sum"}
            assert all(s.merge is exp.Sum for s in aggregate.states)
        if "sum" in deltas:  # (a sum of no values left is NULL: its count tells)
            assert "count" in deltas
        suffixes = [s.suffix for s in aggregate.states]
        assert len(set(suffixes)) == len(suffixes)
    assert AGGREGATES["min"].recompute == "<=" and AGGREGATES["max"].recompute == ">="


def test_each_aggregate_s_states_and_value() -> None:
    layout = {
        n: [(s.suffix, s.function, s.stored_as, s.continuous_only) for s in a.states]
        for n, a in AGGREGATES.items()
    }
    assert layout == {
        "count": [("", exp.Count, "bigint", False)],
        "sum": [("", exp.Sum, "sum", False), (COUNT_SUFFIX, exp.Count, "bigint", True)],
        "avg": [
            (SUM_SUFFIX, exp.Sum, "numeric sum", False),
            (COUNT_SUFFIX, exp.Count, "bigint", False),
        ],
        "min": [("", exp.Min, "value", False)],
        "max": [("", exp.Max, "value", False)],
    }
    for aggregate in AGGREGATES.values():
        # read as its one state, or as PostgreSQL's avg divides its sum by its count
        assert len(aggregate.stored) == (2 if aggregate.final == "avg" else 1)
    assert [n for n, a in AGGREGATES.items() if a.final == "avg"] == ["avg"]
    assert [n for n, a in AGGREGATES.items() if a.star] == ["count"]
    assert [n for n, a in AGGREGATES.items() if a.zero_when_empty] == ["count"]


def _accepted(function: str) -> CreateCachedView | None:
    try:
        statement = parse_one(VIEW.format(function))
    except SqlSyntaxError:
        return None
    assert isinstance(statement, CreateCachedView)
    return statement


def test_every_aggregate_the_ddl_accepts_has_an_entry() -> None:
    """Every aggregate function sqlglot knows, and PostgreSQL's, written into a derived view:
    those the dialect accepts are exactly the table's, each typed as its entry's name."""
    known = {
        node.sql_names()[0].lower()
        for node in vars(exp).values()
        if inspect.isclass(node) and issubclass(node, exp.AggFunc) and node.sql_names()
    }
    assert len(known) > 20
    calls = {f"{name}(b.price)": name for name in known} | {
        f"{name}(b.price)": name
        for name in ("bit_and", "bool_and", "every", "json_agg", "stddev", "variance")
    }
    calls["string_agg(b.title, ',')"] = "string_agg"
    accepted = {}
    for call, name in sorted(calls.items()):
        statement = _accepted(call)
        if statement is not None:
            assert statement.derivation is not None
            accepted[name] = statement.derivation.outputs[1].aggregate
    assert accepted == {name: name for name in AGGREGATES}
    assert tuple(a.node for a in AGGREGATES.values()) == NODES
    for name, aggregate in AGGREGATES.items():
        assert aggregate_of(aggregate.node(this=exp.column("x"))) is aggregate, name
    assert aggregate_of(exp.Stddev(this=exp.column("x"))) is None


@pytest.mark.parametrize(
    ("function", "star"), [("count(*)", True), ("count(b.price)", False), ("sum(b.price)", False)]
)
def test_count_star_is_an_aggregate_of_the_rows(function: str, star: bool) -> None:
    statement = _accepted(function)
    assert statement is not None and statement.derivation is not None
    assert statement.derivation.outputs[1].count_star is star


def test_the_refusal_lists_the_table_s_names() -> None:
    assert listed() == "count, sum, avg, min and max"
    with pytest.raises(SqlSyntaxError, match="the aggregates count, sum, avg, min and max"):
        parse_one(VIEW.format("stddev(b.price)"))
