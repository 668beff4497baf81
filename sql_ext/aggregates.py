"""The aggregates a derived cached view keeps (`sql_ext.ddl.DerivedOutput`), one entry each:
what every module that handles them reads instead of branching on their names.

Each aggregate is classified once, as Materialize classifies its reductions:
- *accumulable* (count, sum, avg): its states change by adding a change's weighted values, a
  deletion as well as an insertion, and merge by adding them up;
- *hierarchical* (min, max): its state takes a new value's extreme and merges by the extreme of
  extremes, but a deletion of the extreme cannot be undone from the state: the group is
  computed again (DBToaster's recompute of the affected groups);
- Materialize's *basic* reductions (string_agg, array_agg, ...), which need every value,
  keep no re-aggregable state: a derived view refuses them, and they have no entry.

An entry says, as data: its name and sqlglot node; the states a view stores for it (`State`:
each a column named by the view column's name and a suffix, what computes it over a group's
rows, its type, how a delta changes it, how the states of several groups merge); and how the
aggregate's value is read from its states (`Aggregate.final`). The modules that write SQL
interpret that data: the grammar and the typed statement (`sql_ext.grammar.cache_ddl`,
`sql_ext.typed`) the names and nodes, `optimizer.derived.states` the stored columns and their
types, `optimizer.derived.delta` the DuckDB delta and merge of each state,
`optimizer.derived.match` a query's aggregate merged from the view's states.

One table, here in `sql_ext`, the lowest layer: the grammar and the typed statement need the
names and nodes, and the rest is plain data (sqlglot node classes and words) that needs no
optimizer type, so every user imports it from here. The SQL each user writes from the data
(PostgreSQL's stored types, DuckDB's delta and merge text) stays with that user, beside the
rest of what it writes.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass

from sqlglot import exp

AggregateName = t.Literal["count", "sum", "avg", "min", "max"]
# how a delta changes a state (a change's items each carry a weight: +1 added, -1 removed):
# - "count": by the weights of the rows (count(*)) or of the argument's non-NULL values;
# - "sum": by the values signed by their weights (NULL when its count of values is 0);
# - "extreme": by the extreme of the added values; a group whose removed values reach its
#   extreme (`Aggregate.recompute`) is computed again from the view's tables
Delta = t.Literal["count", "sum", "extreme"]
# a state's type: "bigint" (a count); "value", the argument's own type (an extreme); "sum",
# the type PostgreSQL's sum of the argument returns; "numeric sum", the same for an argument
# made numeric if it is an integer (an average's sum, which PostgreSQL's avg divides exactly)
StoredAs = t.Literal["bigint", "value", "sum", "numeric sum"]
SUM_SUFFIX, COUNT_SUFFIX = "__sum", "__count"


@dataclass(frozen=True)
class State:
    """A column a derived view stores for an aggregate: a state of each group that the
    states of several groups are merged into (DBSP's and DBToaster's re-aggregable form)."""

    suffix: str  # its name: the view column's followed by this ("": the view column's own)
    function: type[exp.AggFunc]  # what computes it over a group's rows, of the argument
    stored_as: StoredAs
    delta: Delta
    merge: type[exp.AggFunc]  # what merges the states of groups into a coarser group's
    continuous_only: bool = False  # kept only by a view kept REFRESH CONTINUOUSLY


@dataclass(frozen=True)
class Aggregate:
    """An aggregate a derived view keeps (see the module)."""

    name: AggregateName
    node: type[exp.AggFunc]  # its sqlglot node (count(*): a Count of a Star)
    classification: t.Literal["accumulable", "hierarchical"]
    states: tuple[State, ...]
    # its value from its states: "state", its one state as it is; "avg", its first state over
    # its second, divided as PostgreSQL's avg divides (the converter's `Output` "avg": NULL
    # over none, a numeric at PostgreSQL's scale)
    final: t.Literal["state", "avg"]
    star: bool = False  # takes * (count(*): the group's rows counted)
    zero_when_empty: bool = False  # of no rows it is 0 (else NULL): merged over none, too
    # hierarchical: a group computes its state again when the extreme of the values a change
    # removes compares so with the state (it may have lost its extreme)
    recompute: t.Literal["<=", ">="] | None = None

    @property
    def hierarchical(self) -> bool:
        return self.classification == "hierarchical"

    @property
    def stored(self) -> tuple[State, ...]:
        """The states the view's column is read from (not a continuous view's extra ones)."""
        return tuple(s for s in self.states if not s.continuous_only)


# in the order the dialect lists them
AGGREGATES: dict[AggregateName, Aggregate] = {
    "count": Aggregate(
        name="count",
        node=exp.Count,
        classification="accumulable",
        states=(
            State(suffix="", function=exp.Count, stored_as="bigint", delta="count", merge=exp.Sum),
        ),
        final="state",
        star=True,
        zero_when_empty=True,
    ),
    "sum": Aggregate(
        name="sum",
        node=exp.Sum,
        classification="accumulable",
        states=(
            State(suffix="", function=exp.Sum, stored_as="sum", delta="sum", merge=exp.Sum),
            # (how many values it adds: a sum of none is NULL, which its deltas must tell)
            State(
                suffix=COUNT_SUFFIX,
                function=exp.Count,
                stored_as="bigint",
                delta="count",
                merge=exp.Sum,
                continuous_only=True,
            ),
        ),
        final="state",
    ),
    "avg": Aggregate(
        name="avg",
        node=exp.Avg,
        classification="accumulable",
        states=(
            State(
                suffix=SUM_SUFFIX,
                function=exp.Sum,
                stored_as="numeric sum",
                delta="sum",
                merge=exp.Sum,
            ),
            State(
                suffix=COUNT_SUFFIX,
                function=exp.Count,
                stored_as="bigint",
                delta="count",
                merge=exp.Sum,
            ),
        ),
        final="avg",
    ),
    "min": Aggregate(
        name="min",
        node=exp.Min,
        classification="hierarchical",
        states=(
            State(suffix="", function=exp.Min, stored_as="value", delta="extreme", merge=exp.Min),
        ),
        final="state",
        recompute="<=",
    ),
    "max": Aggregate(
        name="max",
        node=exp.Max,
        classification="hierarchical",
        states=(
            State(suffix="", function=exp.Max, stored_as="value", delta="extreme", merge=exp.Max),
        ),
        final="state",
        recompute=">=",
    ),
}
NODES: tuple[type[exp.AggFunc], ...] = tuple(a.node for a in AGGREGATES.values())
_BY_NODE: dict[type[exp.Expr], Aggregate] = {a.node: a for a in AGGREGATES.values()}


def aggregate_of(node: exp.Expr) -> Aggregate | None:
    """The entry of an aggregate's node (None: not one a derived view keeps)."""
    return _BY_NODE.get(type(node))


def listed() -> str:
    """The aggregates' names as a sentence lists them ("count, sum, avg, min and max")."""
    names = list(AGGREGATES)
    return f"{', '.join(names[:-1])} and {names[-1]}"


__all__ = [
    "AGGREGATES",
    "COUNT_SUFFIX",
    "NODES",
    "SUM_SUFFIX",
    "Aggregate",
    "AggregateName",
    "Delta",
    "State",
    "StoredAs",
    "aggregate_of",
    "listed",
]
