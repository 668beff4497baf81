"""The typed statements a session sends, and the statements of a text.

Every statement a user can send is one of: `Query` (any SQL for the backend, with the currency
clauses found in it), `Timeline` (BEGIN/END TIMEORDERED), `SessionBound` (SET / RESET / SHOW
CURRENCY BOUND), `Inspect`, `CacheSetting`, `RefreshCachedView`, or a cache DDL statement
(`sql_ext.ddl`: `CreateControlTable`, `CreateCachedView`, `DropCacheObject`). `Statement` is
their union; `sql_ext.parsing` makes them from text (`parse`, `parse_one`). Here too: a text's
statements without parsing them (`split_statements`, `is_empty`) and where a node stands in its
text (`position_of`).
"""

from __future__ import annotations

import dataclasses
import functools
import typing as t
from dataclasses import dataclass, field

from sqlglot import exp
from sqlglot.errors import TokenError
from sqlglot.tokens import Token

from sql_ext.blocks import BlockAnalysis
from sql_ext.ddl import CreateCachedView, CreateControlTable, DropCacheObject
from sql_ext.dialect import MTCache, MTCachePlain
from sql_ext.nodes import CurrencySpec, Duration, strip_extensions

DIALECT = MTCache()


# -- typed results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One spec of a currency clause (one consistency class before normalization)."""

    bound_seconds: float
    on: tuple[str, ...] | None  # input names as written, lower case; None = every input
    by: tuple[str, ...]  # grouping columns as written, lower case; () = one snapshot
    node: CurrencySpec = field(compare=False, repr=False)

    def to_json(self) -> dict[str, t.Any]:
        return {
            "bound_seconds": self.bound_seconds,
            "on": list(self.on) if self.on is not None else None,
            "by": list(self.by),
        }


@dataclass(frozen=True)
class BlockClause:
    """The currency clause of one SELECT block."""

    block: int
    specs: tuple[Spec, ...]

    def to_json(self) -> dict[str, t.Any]:
        return {"block": self.block, "specs": [s.to_json() for s in self.specs]}


@dataclass(frozen=True)
class Query:
    """Any SQL statement for the backend, with its currency clauses (none for writes)."""

    text: str
    tree: exp.Expr = field(repr=False)
    clauses: tuple[BlockClause, ...]
    analysis: BlockAnalysis = field(repr=False, compare=False)
    explain: str | None = None  # EXPLAIN's options ("" for plain EXPLAIN); None = not EXPLAIN
    # (start, end) character offsets in ``text`` of the currency clauses, which the backend
    # never sees, and where the explained statement begins (EXPLAIN)
    cuts: tuple[tuple[int, int], ...] = field(default=(), repr=False, compare=False)
    body_start: int = field(default=0, repr=False, compare=False)

    kind: t.ClassVar[str] = "query"

    @property
    def has_currency_clause(self) -> bool:
        return bool(self.clauses)

    @property
    def is_select(self) -> bool:
        return isinstance(self.tree, exp.Query)

    def to_sql(self, dialect: str = "postgres") -> str:
        """The statement without extensions, regenerated in PostgreSQL or DuckDB syntax
        (`parse --json`; the backend is sent `backend_sql`, the text as written)."""
        if isinstance(self.tree, exp.Command):
            return self._with_explain(self.tree.sql(dialect=dialect))
        if dialect == "postgres":  # printed from the tree itself, its clauses left out
            return self._with_explain(self.tree.sql(dialect=MTCachePlain, copy=False))
        return self._with_explain(strip_extensions(self.tree).sql(dialect=dialect, copy=False))

    def without_explain(self) -> Query:
        """The explained statement itself."""
        return dataclasses.replace(self, explain=None)

    @functools.cached_property
    def shape(self) -> str:
        """The statement as written (without EXPLAIN, clauses included): the key its plan is
        cached under, the same for a statement and its EXPLAIN. Two texts sqlglot reads
        alike may differ to PostgreSQL (``mod(a, b)`` names its column, ``a % b`` does not),
        so the text itself is the key."""
        return self.text[self.body_start :].strip().rstrip(";")

    @functools.cached_property
    def normalized(self) -> str:
        """The statement with each constant a placeholder (its currency clauses' durations
        kept), in mtcache's dialect: the shape its calls are counted under when the backend
        answers them (`cache.store.remote_reads`), as pg_stat_statements counts a query's."""
        tree = self.tree.copy()
        for parameter in list(tree.find_all(exp.Parameter)):  # ($1: as pg_stat_statements has it)
            parameter.replace(exp.Placeholder())
        for literal in list(tree.find_all(exp.Literal)):
            if literal.find_ancestor(Duration) is None:
                literal.replace(exp.Placeholder())
        return tree.sql(dialect=DIALECT)

    @functools.cached_property
    def backend_sql(self) -> str:
        """What the backend runs when the statement goes remote whole: the application's own
        text with only the currency clauses cut out, never a regeneration."""
        start = self.body_start if self.explain is None else 0
        return cut_out(self.text, self.cuts, start)

    def to_extended_sql(self) -> str:
        """The statement in mtcache's dialect, clauses included (parses back to the same)."""
        return self._with_explain(self.tree.sql(dialect=DIALECT))

    def _with_explain(self, sql: str) -> str:
        if self.explain is None:
            return sql
        return " ".join(p for p in ("EXPLAIN", self.explain, sql) if p)

    def to_json(self) -> dict[str, t.Any]:
        return {
            "kind": self.kind,
            "sql": self.to_sql("postgres"),
            "clauses": [c.to_json() for c in self.clauses],
        }


def cut_out(text: str, cuts: t.Iterable[tuple[int, int]], start: int = 0) -> str:
    """``text[start:]`` without the character spans ``cuts``: each cut leaves one blank between
    the tokens it separated, none at the end (a cut never touches a comment or a string: it
    spans whole tokens)."""
    parts, at = [], start
    for begin, end in sorted(cuts):
        if begin < start:
            continue
        before, after = text[at:begin], text[end:]
        if not after or after[0].isspace() or after[0] in "),;":
            before = before.rstrip(" \t")
        elif before and not before[-1].isspace():
            before += " "
        parts.append(before)
        at = end
    return "".join(parts) + text[at:]


@dataclass(frozen=True)
class Timeline:
    """BEGIN TIMEORDERED (begin=True) or END TIMEORDERED (§2.3)."""

    text: str
    begin: bool

    kind: t.ClassVar[str] = "timeline"

    def to_json(self) -> dict[str, t.Any]:
        return {
            "kind": self.kind,
            "sql": None,
            "clauses": [],
            "timeline": "begin" if self.begin else "end",
        }


@dataclass(frozen=True)
class SessionBound:
    """SET / RESET / SHOW CURRENCY BOUND: the session's default bound for every SELECT block
    without a clause of its own."""

    text: str
    action: t.Literal["set", "reset", "show"]
    bound_seconds: float | None  # for SET

    kind: t.ClassVar[str] = "session"

    def to_json(self) -> dict[str, t.Any]:
        return {
            "kind": self.kind,
            "sql": None,
            "clauses": [],
            "session": {"currency_bound": self.action, "bound_seconds": self.bound_seconds},
        }


# what a session can ask the cache about itself (`Inspect`)
Inspected = t.Literal[
    "last statement", "cached views", "cache status", "cache stats", "cache advice", "cache seed"
]


@dataclass(frozen=True)
class Inspect:
    """EXPLAIN LAST STATEMENT, SHOW CACHED VIEWS or SHOW CACHE STATUS: a session asks the
    cache about itself."""

    text: str
    what: Inspected
    views: tuple[str, ...] = ()  # SHOW CACHE STATUS FOR VIEW: whose regions are listed

    kind: t.ClassVar[str] = "inspect"

    def to_json(self) -> dict[str, t.Any]:
        return {"kind": self.kind, "sql": None, "clauses": [], "inspect": self.what}


@dataclass(frozen=True)
class CacheSetting:
    """SET / RESET / SHOW of one of the cache's session settings (``mtcache.name``)."""

    text: str
    action: t.Literal["set", "reset", "show"]
    name: str  # the full name, lower case: mtcache.provenance
    value: str | None  # for SET (None: SET ... TO DEFAULT, a reset)

    kind: t.ClassVar[str] = "setting"

    def to_json(self) -> dict[str, t.Any]:
        return {
            "kind": self.kind,
            "sql": None,
            "clauses": [],
            "setting": {"action": self.action, "name": self.name, "value": self.value},
        }


@dataclass(frozen=True)
class RefreshCachedView:
    """REFRESH CACHED VIEW name [KEY (...), ...] (view None: REFRESH CACHED VIEWS, every
    white view): refresh regions by their affected closure now."""

    text: str
    view: str | None
    keys: tuple[tuple[str, ...], ...] | None  # presence keys, the values' texts

    kind: t.ClassVar[str] = "refresh"

    def to_json(self) -> dict[str, t.Any]:
        keys = [list(k) for k in self.keys] if self.keys is not None else None
        return {
            "kind": self.kind,
            "sql": None,
            "clauses": [],
            "refresh": {"view": self.view, "keys": keys},
        }


Statement = (
    Query
    | Timeline
    | SessionBound
    | Inspect
    | CacheSetting
    | RefreshCachedView
    | CreateControlTable
    | CreateCachedView
    | DropCacheObject
)


def is_empty(text: str) -> bool:
    """No statement at all: only whitespace, comments and semicolons (PostgreSQL accepts
    such a text as an empty query)."""
    try:
        tokens = DIALECT.tokenize(text)
    except TokenError:
        return False
    return all(token.token_type.name == "SEMICOLON" for token in tokens)


def split_statements(text: str) -> list[str]:
    """The statements of a text of several separated by semicolons (PostgreSQL's simple query
    protocol sends them so), empty ones left out; text the tokenizer cannot read is one
    statement (the backend judges it)."""
    if ";" not in text.rstrip().rstrip(";"):
        return [] if is_empty(text) else [text]
    try:
        tokens = DIALECT.tokenize(text)
    except TokenError:
        return [text]
    return [piece for piece, _ in script_pieces(text, tokens)]


def script_pieces(text: str, tokens: list[Token]) -> list[tuple[str, int]]:
    """Each statement of a script (its tokens) with its offset, empty ones left out."""
    pieces: list[tuple[str, int]] = []
    start, has_tokens = 0, False
    for token in tokens:
        if token.token_type.name == "SEMICOLON":
            if has_tokens:
                pieces.append((text[start : token.start], start))
            start, has_tokens = token.end + 1, False
        else:
            has_tokens = True
    if has_tokens:
        pieces.append((text[start:], start))
    return pieces


def position_of(node: exp.Expr) -> tuple[int | None, int | None]:
    """Line and start column of the first positioned token of a node."""
    for child in node.walk():
        meta = child.meta if isinstance(child, exp.Expr) else {}
        if meta.get("line"):
            width = int(meta.get("end", 0)) - int(meta.get("start", 0))
            return int(meta["line"]), max(1, int(meta["col"]) - width)
    return None, None
