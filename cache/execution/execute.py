"""Run a guarded plan as its guards decided: the decision's DuckDB statement
(`optimizer.rules.local_statement`, compiled once per decision and kept with the plan), after the
remote leaves it reads are fetched from PostgreSQL through Arrow and registered under their
names. An all-local decision is the hit path: one prepared DuckDB statement, no SQL work.

A decision that sends the statement remote whole is run by the DB-API on the session's own
backend connection (`cache.dbapi.cursor`), with the plan's SQL.
"""

from __future__ import annotations

import datetime as dt
import functools
import typing as t
import zoneinfo
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa

from cache.execution.convert import (
    LocalUnfit,
    Row,
    at_edges,
    converter,
    infinite_among,
    infinite_kinds,
)
from cache.execution.lookup import LookupIndexes, LookupShape, lookup_shape
from cache.execution.memo import ResultMemo
from cache.execution.planning import Prepared
from cache.execution.provenance import Executed
from cache.store.cache_file import CacheStore
from optimizer.plan import LocalStatement
from optimizer.postgres.allowlist import ZONE_PARAMETER, reads_alike
from optimizer.rules.evaluate_guards import Decision
from optimizer.rules.local_statement import local_statement
from sql_ext.errors import first_line
from sql_ext.params import Params, values_for

# the leaves to fetch, each (SQL, its (column, DuckDB type)s, the parameters its placeholders
# name) -> their Arrow tables, in order
Fetch = Callable[[list[tuple[str, list[tuple[str, str]], dict[str, t.Any] | None]]], list[pa.Table]]


Description = list[tuple[t.Any, ...]]


class AnswerShape(t.NamedTuple):
    """What a compiled statement's answers share for one time zone and parameter-type
    signature (DuckDB's result types are fixed by it)."""

    description: Description
    convert: Callable[[list[Row]], list[Row]]  # DuckDB's rows into PostgreSQL's values
    dated: tuple[int, ...]  # the columns whose DuckDB type may hold infinity


@dataclass
class Compiled:
    """A decision's statement, compiled by DuckDB once."""

    statement: LocalStatement
    executed: Executed  # what running it sends where
    views: tuple[str, ...] = ()  # the views it reads
    # the prefix of its answers' memo keys when they may be kept (all local, repeatable)
    memo_key: tuple[str, str] | None = None
    lookup: LookupShape | None = None  # a point lookup a lookup index may answer
    prepared: t.Any = None  # DuckDB's parse of statement.sql: executions skip the parser
    # per time zone and parameter-type signature: what its answers share
    results: dict[tuple[object, ...], AnswerShape] = field(default_factory=dict)


class Zone(t.NamedTuple):
    """The session's time zone: its name, as the TimeZone setting gives it, and the tzinfo
    psycopg gives timestamps with time zone in."""

    name: str
    info: dt.tzinfo


UTC = Zone("UTC", dt.UTC)


def zone_named(name: str) -> Zone:
    """The zone of a TimeZone setting, as psycopg reads it (UTC when Python has no such
    zone)."""
    try:
        return Zone(name, zoneinfo.ZoneInfo(name))
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return UTC


@functools.lru_cache(maxsize=1)
def _zone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


class Result(t.NamedTuple):
    description: list[tuple[t.Any, ...]]
    rows: list[tuple[t.Any, ...]]
    executed: Executed
    memo: bool | None = None  # reused from the memo (True), kept there (False), neither (None)


class Memo(t.NamedTuple):
    """Where local answers are kept (`cache.execution.memo`, `cache.execution.lookup`) and
    how to tell whether the views an answer read changed since (`CacheStore.change_token`)."""

    results: ResultMemo
    change_token: Callable[[t.Sequence[str]], tuple[int, ...]]
    change_token_at_hand: Callable[[t.Sequence[str]], tuple[int, ...] | None]
    lookups: LookupIndexes | None = None
    handle: Callable[[], CacheStore] | None = None  # a DuckDB handle for building an index


def compiled_for(prepared: Prepared, decision: Decision) -> Compiled:
    """The decision's statement, made and compiled on first use."""
    signature = decision.signature
    compiled = prepared.compiled.get(signature)
    if compiled is None:
        choice = decision.choice()
        plan = prepared.plan
        first = plan.first if _same_choice(choice, plan.first_choice()) else None
        statement = first or local_statement(plan, choice)
        leaves = tuple(leaf.sql for _, leaf in statement.leaves)
        views = tuple(sorted({v for v in choice.values() if v is not None}))
        analysis = prepared.plan.analysis
        memo_key = (
            (analysis.query.shape, statement.sql)
            if analysis.repeatable and not statement.leaves
            else None
        )
        lookup = (
            lookup_shape(statement.sql, statement.names)
            if memo_key is not None and not statement.lists and not statement.zone
            else None
        )
        compiled = Compiled(
            statement, Executed(duckdb_sql=statement.sql, leaves=leaves), views, memo_key, lookup
        )
        prepared.compiled[signature] = compiled
    return compiled


def _same_choice(a: Mapping[int, str | None], b: Mapping[int, str | None]) -> bool:
    """Whether two choices read the same (an access missing from one reads its leaf)."""
    return {k: v for k, v in a.items() if v is not None} == {
        k: v for k, v in b.items() if v is not None
    }


def answer_at_hand(
    prepared: Prepared, decision: Decision, params: Params, memo: Memo | None, zone: Zone = UTC
) -> Result | None:
    """The answer of an all-local decision that the memo or a lookup index holds, with no
    DuckDB statement and no lock another thread holds (None: `run_local` makes it; nothing
    was run, kept or counted)."""
    compiled = compiled_for(prepared, decision)
    if memo is None or compiled.memo_key is None:
        return None
    token = memo.change_token_at_hand(compiled.views)
    if token is None:
        return None
    values = _values(compiled, params)
    return _kept(compiled, values, memo, token, zone, count_miss=False)[0]


def run_local(
    prepared: Prepared,
    decision: Decision,
    params: Params,
    duck: duckdb.DuckDBPyConnection,
    fetcher: Callable[[], Fetch] | None = None,
    memo: Memo | None = None,
    zone: Zone = UTC,
) -> Result:
    """Run a local or mixed decision: fetch its leaves (all at once, so they may come in
    parallel, through the fetch ``fetcher`` gives), register them, run the statement. An
    all-local answer is taken from ``memo`` when the views it read are unchanged, and kept
    there otherwise, or from a lookup index of the memo's when the statement is a point
    lookup (`cache.execution.lookup`). ``zone``: the session's time zone as psycopg gives it
    (timestamps with time zone are given in it)."""
    compiled = compiled_for(prepared, decision)
    values = _values(compiled, params)
    key: t.Hashable = None
    shape: LookupShape | None = None
    lookups: LookupIndexes | None = None
    if memo is not None and compiled.memo_key is not None:
        # taken before DuckDB reads: a change committed meanwhile makes the answers stale
        token = memo.change_token(compiled.views)
        shape, lookups = compiled.lookup, memo.lookups
        found, key = _kept(compiled, values, memo, token, zone, count_miss=True)
        if found is not None:
            return found
    result = _run(prepared, compiled, values, duck, fetcher, zone)
    if memo is None:
        return result
    if shape is not None and lookups is not None and memo.handle is not None:
        lookups.ran(shape, token, duck, values, memo.handle)
    if key is not None:
        memo.results.put(key, token, result.description, result.rows)
        return result._replace(memo=False)
    return result


def _values(compiled: Compiled, params: Params) -> list[t.Any]:
    """The statement's parameter values, checked as PostgreSQL would read them."""
    statement = compiled.statement
    values = values_for(statement.keys, params) if statement.keys else []
    if statement.typed_parameters:
        _check_parameters(statement, values)
    return values


def _kept(
    compiled: Compiled,
    values: list[t.Any],
    memo: Memo,
    token: tuple[int, ...],
    zone: Zone,
    count_miss: bool,
) -> tuple[Result | None, t.Hashable]:
    """The answer a lookup index or the result memo holds for these values at ``token``,
    and the memo's key for them (None: values the memo does not keep)."""
    shape, lookups = compiled.lookup, memo.lookups
    if shape is not None and lookups is not None:
        looked_up = _looked_up(compiled, shape, lookups, token, values, zone)
        if looked_up is not None:
            return looked_up, None
    # typed: 1, 1.0 and True are equal keys in Python, not equal parameters in DuckDB
    key: t.Hashable = (*(compiled.memo_key or ()), zone, *((type(v), v) for v in values))
    try:
        hash(key)
    except TypeError:  # a list or dict parameter: not kept
        return None, None
    found = memo.results.get(key, token, count_miss=count_miss)
    if found is not None:
        return Result(found[0], found[1], compiled.executed, memo=True), key
    return None, key


def _looked_up(
    compiled: Compiled,
    shape: LookupShape,
    lookups: LookupIndexes,
    token: tuple[int, ...],
    values: list[t.Any],
    zone: Zone,
) -> Result | None:
    """The answer of a lookup index, when it has one and DuckDB's answer to these parameter
    types was converted before (the conversion is made from DuckDB's result columns)."""
    result_shape = compiled.results.get((zone, *map(type, values)))
    if result_shape is None:
        return None
    rows = lookups.rows(shape, token, values)
    if rows is None:
        return None
    return Result(
        result_shape.description, result_shape.convert(rows), compiled.executed, memo=True
    )


def checks_values(statement: LocalStatement, types: Sequence[type]) -> bool:
    """Whether `_check_parameters` may refuse some values of these types (in the order of
    ``statement.keys``): a string read as a typed value, any timestamp with time zone."""
    typed = dict(zip(statement.keys, types, strict=True))
    return any(
        kind == "timestamptz" or issubclass(typed.get(key, type(None)), str)
        for key, kind in statement.typed_parameters
    )


def _check_parameters(statement: LocalStatement, values: list[t.Any]) -> None:
    """A string PostgreSQL reads as a number, a date, ... must read alike in DuckDB."""
    by_key = dict(zip(statement.keys, values, strict=True))
    for key, kind in statement.typed_parameters:
        value = by_key.get(key)
        if kind == "timestamptz" and not (
            isinstance(value, dt.datetime) and value.tzinfo is not None
        ):
            # PostgreSQL places anything else in the session's zone, DuckDB in its own
            raise LocalUnfit("a parameter meets a timestamp with time zone without one")
        if isinstance(value, str) and not reads_alike(kind, value):
            raise LocalUnfit(
                f"the parameter {value[:30]!r} is read as {kind} differently by DuckDB"
            )


def _run(
    prepared: Prepared,
    compiled: Compiled,
    values: list[t.Any],
    duck: duckdb.DuckDBPyConnection,
    fetcher: Callable[[], Fetch] | None,
    zone: Zone,
) -> Result:
    statement = compiled.statement
    named = statement.bound(dict(zip(statement.names, values, strict=True)))
    if statement.zone:
        if zone.name not in _zone_names():  # a POSIX zone string: DuckDB reads no such name
            raise LocalUnfit(f"the session's time zone {zone.name!r} is not one DuckDB knows")
        named[ZONE_PARAMETER] = zone.name
    if compiled.prepared is None:
        (compiled.prepared,) = duck.extract_statements(statement.sql)
    tables: list[pa.Table] = []
    if statement.leaves:
        assert fetcher is not None
        fetch = fetcher()
        leaf_params = named or None  # a statement without placeholders: its leaves have none
        tables = fetch(
            [(leaf.sql, list(leaf.columns), leaf_params) for _, leaf in statement.leaves]
        )
        duck.complete()  # a result some fetchone() left open would block register() (DuckDB 2)
    registered: list[str] = []
    try:
        for (name, _), table in zip(statement.leaves, tables, strict=True):
            duck.register(name, table)
            registered.append(name)
        try:
            cursor = (
                duck.execute(compiled.prepared, named) if named else duck.execute(compiled.prepared)
            )
            rows = cursor.fetchall()
            types = (zone, *map(type, values))
            shape = compiled.results.get(types)
            if shape is None:
                shape = compiled.results[types] = _result_shape(
                    prepared, compiled, cursor.description or [], zone.info
                )
            dated = shape.dated
            if dated and at_edges(rows, dated):
                # 0001-01-01 or infinity? DuckDB's Arrow answer (of the same state of the
                # file: a commit meanwhile makes the caller decide again) tells them apart
                again = duck.sql(compiled.prepared, params=named or None).to_arrow_table()
                if infinite_among(again, dated):
                    raise LocalUnfit("an infinite date or time, which psycopg does not load")
        except (
            duckdb.OutOfRangeException,
            duckdb.ConversionException,
            duckdb.InvalidInputException,
        ) as exc:
            # PostgreSQL raises its own error (or, for an overflow DuckDB's types have and
            # PostgreSQL's numerics do not, answers): the backend answers, as it would
            raise LocalUnfit(f"DuckDB: {first_line(exc)}") from exc
    finally:
        for name in registered:
            duck.unregister(name)
    return Result(shape.description, shape.convert(rows), compiled.executed)


def _result_shape(
    prepared: Prepared,
    compiled: Compiled,
    duck_columns: Sequence[tuple[t.Any, ...]],
    zone: dt.tzinfo = dt.UTC,
) -> AnswerShape:
    """The description and row conversion of a local answer: PostgreSQL's description of
    the statement (the backend's, or worked out here while it is down), DuckDB's values
    converted to it."""
    duck_types = [str(d[1]) for d in duck_columns]
    if prepared.result is None or prepared.description is None:
        raise LocalUnfit("PostgreSQL's description of its result is not known")
    names = [d[0] for d in prepared.description]
    analysis = prepared.plan.analysis
    convert = converter(
        prepared.result.types,
        names,
        duck_types,
        compiled.statement.outputs,
        analysis.semantics.output_widths,
        analysis.semantics.output_scales,
        zone,
    )
    if isinstance(convert, str):
        raise LocalUnfit(convert)
    return AnswerShape(prepared.description, convert, infinite_kinds(duck_types))
