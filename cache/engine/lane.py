"""A lane: one session's cached point lookup answered again with only what could have changed
checked (the server's hit path).

A cached read answered at hand (`Session.read_locally` without waiting) from a lookup index
went through planning, the guards and the local run, and each step kept its work - the plan
cache, the decision memo, the compiled statement, the index - and checks on every execution
that what it kept still holds. For the next executions of the same statement with other
values of the same types, a lane checks all of that at once:

- the cache file is unchanged since (`CacheStore.unchanged_since`: its rows, regions, schema
  and measured delays, everything a plan, a decision and an index were made from);
- time has not outlived the decision (`cache.execution.decisions.expiry`, on the backend's
  clock as the guards read it);
- nothing observes decisions (`Engine.on_decision`);
- the session is unchanged, which its caller guarantees: a lane is used only while the
  session runs nothing but cached reads at hand (the server drops its lanes at any other
  statement of the session). A lane is made only for a plan whose guards read no parameter
  (no presence guard: any key's decision is the one made) and a session with no timeline and
  no provenance NOTICE to keep.

Then the index gives the rows, converted as the local run converts them, and the session
counts and notes the answer as the full path does (hits, memo hits, the provenance EXPLAIN
LAST STATEMENT shows, with the moment of this read). Anything else - a key of another type,
an index rebuilt, a commit in progress - is None: the full path answers.

A client of the server runs a prepared statement by a Bind, Execute and Sync whose bytes
differ from the last run's only in the parameter values: its `WireLane` reads the values off
those bytes, asks the lane for the rows and gives the whole answer's bytes (`wire_answer`).
"""

from __future__ import annotations

import datetime as dt
import typing as t
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cache.engine.engine import Engine
from cache.engine.state import SessionState
from cache.execution.convert import Row
from cache.execution.lookup import LookupIndexes, LookupShape
from cache.execution.provenance import Provenance
from cache.store.bound_asks import Asks
from cache.store.cache_file import CacheStore
from cache.wire import protocol, values
from optimizer.rules.evaluate_guards import Decision
from sql_ext.params import Key, values_for
from sql_ext.placeholders import Converted


class Owner(t.Protocol):
    """What a lane reads of its session (`cache.engine.session.Session`)."""

    closed: bool
    engine: Engine
    store: CacheStore
    state: SessionState

    def answered_from_lane(self, decision: Decision, lineage: Callable[[], Provenance]) -> None: ...


@dataclass(frozen=True, slots=True, eq=False)
class Lane:
    """One statement's lane in one session (`Session.read_with_lane`)."""

    session: Owner
    version: int  # the cache file's version the lane was made at
    decision: Decision  # all local
    expires: dt.datetime | None  # when the decision stops holding (None: not by time)
    keys: Sequence[Key]  # the local statement's parameters
    positional: bool  # all given by position: a sequence of values is taken as it is
    types: tuple[type, ...]  # the type of each parameter value the lane takes
    shape: LookupShape
    lookups: LookupIndexes
    token: tuple[int, ...]  # the views' change token (unchanged with the version)
    convert: Callable[[list[Row]], list[Row]]  # DuckDB's values as PostgreSQL's types
    asks: Asks  # the plan's bounds asked of its views, counted at each answer (`Plan.asks`)

    def rows(self, params: Sequence[t.Any]) -> list[Row] | None:
        """The statement's rows for these parameter values, counted and noted as the session's
        last answer; None: the lane does not hold (nothing was done)."""
        keys = self.keys
        if len(params) != len(keys):
            return None
        values = params if self.positional and type(params) is list else values_for(keys, params)
        if tuple(map(type, values)) != self.types:
            return None
        return self.key_rows(self.shape.key(values))

    @property
    def one_key(self) -> bool:
        """Whether the statement's one parameter, given by position, is its lookup's one key:
        then `key_rows` takes the parameter's value as it is (the server's usual point
        lookup)."""
        return self.positional and len(self.keys) == 1 and self.shape.params == (0,)

    def key_rows(self, key: t.Any) -> list[Row] | None:
        """`rows` of the lookup's key: its one key's value, or the tuple of its keys' values,
        each of the lane's `types` (which the caller checked)."""
        session = self.session
        if (
            session.closed
            or session.engine.on_decision is not None
            or not session.store.unchanged_since(self.version)
        ):
            return None
        now = session.state.now_at_hand()
        if now is None:
            return None
        expires = self.expires
        if expires is not None and now > expires:
            return None
        found = self.lookups.key_rows(self.shape, self.token, key)
        if found is None:
            return None
        decision = self.decision
        if self.asks:
            session.store.asks.asked(self.asks)
        session.answered_from_lane(decision, lambda: Provenance.of(decision._replace(now=now)))
        return self.convert(found)


@dataclass(frozen=True, slots=True, eq=False)
class WireLane:
    """A lane as a client's runs of a prepared statement take it, in one shape (the server's
    hit path, `cache.engine.conversation.at_once.AtOnce.lane`): a run's bytes in, its whole
    answer's bytes out."""

    epoch: int  # the conversation's, when it was made
    run: protocol.RunShape
    # a run's whole answer (`wire_answer`), or None: the full path answers it
    answer: Callable[[bytes], bytes | None]


def wire_answer(
    run: protocol.RunShape,
    decoders: Sequence[values.Decoder],
    converted: Converted,
    made: Lane,
    encoders: Sequence[values.Encoder],
    head: bytes,
) -> Callable[[bytes], bytes | None]:
    """How a lane answers a run of its shape (``data``: its bytes): the parameter values read
    (``decoders``, as the conversation reads a Bind's), the engine's lane asked for the rows,
    and the bytes of the answer after ``head``; None when the lane does not hold or a value
    is not one it takes (the full path answers, or says why not). The usual point lookup, one
    parameter that is the lookup's key, is read with nothing in between (`Lane.key_rows`)."""
    if run.params == 1 and converted.order == (0,) and made.one_key:
        value_of, decode, key_type, key_rows = run.value, decoders[0], made.types[0], made.key_rows

        def one_key(data: bytes) -> bytes | None:
            value = value_of(data)
            if value is None:
                return None
            try:
                key = decode(value)
            except Exception:  # a value it cannot read: the full path says why
                return None
            if type(key) is not key_type:
                return None
            rows = key_rows(key)
            return None if rows is None else _rows_answer(head, encoders, rows)

        return one_key

    def any_run(data: bytes) -> bytes | None:
        found = run.values(data)
        if found is None:
            return None
        try:
            decoded = [None if v is None else d(v) for d, v in zip(decoders, found, strict=True)]
        except Exception:  # a value it cannot read: the full path says why
            return None
        rows = made.rows(converted.params(decoded))
        return None if rows is None else _rows_answer(head, encoders, rows)

    return any_run


_READY_IDLE = protocol.ready_for_query(b"I")
_ONE_SELECTED = protocol.select_complete(1) + _READY_IDLE


def _rows_answer(
    head: bytes, encoders: Sequence[values.Encoder], rows: Sequence[Sequence[t.Any]]
) -> bytes:
    """A lane's answer: ``head``, the rows, SELECT n and ReadyForQuery (idle)."""
    if len(rows) == 1:  # (the usual point lookup's)
        return b"".join((head, protocol.data_row(rows[0], encoders), _ONE_SELECTED))
    return b"".join(
        (
            head,
            *(protocol.data_row(row, encoders) for row in rows),
            protocol.select_complete(len(rows)),
            _READY_IDLE,
        )
    )
