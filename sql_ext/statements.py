"""Typed parse results and the entry points `parse` / `parse_one`.

Every statement a user can send is one of: `Query` (any SQL for the backend, with the currency
clauses found in it), `Timeline` (BEGIN/END TIMEORDERED), `SessionBound` (SET / RESET / SHOW
CURRENCY BOUND), or a cache DDL statement
(`CreateControlTable`, `CreateCachedView`, `DropCacheObject`). Errors are `SqlSyntaxError`
(a `ProgrammingError`) carrying the line and column of the offending token.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
import typing as t
from dataclasses import dataclass, field

from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from sql_ext.blocks import Block, BlockAnalysis, analyze
from sql_ext.dialect import MTCache, MTCachePlain, plain_tokens
from sql_ext.errors import SqlSyntaxError, offset_position, too_deep
from sql_ext.grammar.base import BODY_START, SPAN
from sql_ext.grammar.cache_ddl import is_derived
from sql_ext.long_lists import ListToken
from sql_ext.nodes import (
    CachedViewDef,
    ConsistencyClause,
    ConstantList,
    ControlTableDef,
    CurrencyClause,
    CurrencySpec,
    Duration,
    ExplainStatement,
    strip_extensions,
)
from sql_ext.nodes import CacheSetting as CacheSettingNode
from sql_ext.nodes import DropCacheObject as DropNode
from sql_ext.nodes import Inspect as InspectNode
from sql_ext.nodes import RefreshCached as RefreshNode
from sql_ext.nodes import SessionBound as SessionBoundNode
from sql_ext.nodes import Timeline as TimelineNode
from sql_ext.quoting import folded
from sql_ext.quoting import qualifier as column_qualifier

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


@dataclass(frozen=True)
class Inspect:
    """EXPLAIN LAST STATEMENT, SHOW CACHED VIEWS or SHOW CACHE STATUS: a session asks the
    cache about itself."""

    text: str
    what: t.Literal["last statement", "cached views", "cache status", "cache stats"]

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


@dataclass(frozen=True)
class ControlColumn:
    name: str
    type: str  # PostgreSQL type as written, normalized by sqlglot


@dataclass(frozen=True)
class CreateControlTable:
    text: str
    name: str
    columns: tuple[ControlColumn, ...]
    # (line, column) of the first character of ``text`` in its script (1-based)
    position: tuple[int, int] = field(default=(1, 1), compare=False)

    kind: t.ClassVar[str] = "ddl"

    def to_sql(self, dialect: str = "postgres") -> str:
        cols = ", ".join(f"{c.name} {c.type}" for c in self.columns)
        return f"CREATE TABLE {self.name} ({cols})"

    def to_json(self) -> dict[str, t.Any]:
        return {
            "kind": self.kind,
            "sql": self.to_sql(),
            "clauses": [],
            "ddl": {
                "statement": "create control table",
                "name": self.name,
                "columns": [{"name": c.name, "type": c.type} for c in self.columns],
            },
        }


@dataclass(frozen=True)
class Presence:
    columns: tuple[str, ...]  # the view's presence-controlled key K'
    control: str  # control table or cached view
    control_columns: tuple[str, ...]  # its control key K (defaults to the same names)


@dataclass(frozen=True)
class Consistency:
    kind: t.Literal["all", "on", "root"]
    columns: tuple[str, ...] = ()
    control: str | None = None  # None with kind "on" = full guarantee for every value


@dataclass(frozen=True)
class Completeness:
    columns: tuple[str, ...]
    control: str | None  # None = full completeness for every value


@dataclass(frozen=True)
class DerivedSource:
    """A table a derived cached view reads (`Derivation`)."""

    table: str
    schema: str | None
    alias: str  # as written, else the table's name: what the view's columns are qualified by


@dataclass(frozen=True)
class DerivedOutput:
    """A column of a derived cached view: a column of its rows, or an aggregate of them."""

    name: str
    expression: exp.Expr | None = field(compare=False)  # the column, the aggregate's argument
    aggregate: t.Literal["count", "sum", "avg", "min", "max"] | None = None  # None: a column

    @property
    def count_star(self) -> bool:
        return self.aggregate == "count" and self.expression is None


@dataclass(frozen=True)
class Derivation:
    """What a derived cached view's SELECT says (`sql_ext.grammar.cache_ddl.is_derived`): tables
    joined by column equalities, grouped by columns, its columns and aggregates; names are
    resolved against the catalog with the schema (`control_tables.derived`)."""

    sources: tuple[DerivedSource, ...]
    joins: tuple[tuple[exp.Column, exp.Column], ...] = field(compare=False)
    group: tuple[exp.Column, ...] = field(compare=False)
    outputs: tuple[DerivedOutput, ...]

    @property
    def aggregates(self) -> bool:
        """One row per group (GROUP BY, or aggregates over all rows: one group)."""
        return bool(self.group) or any(o.aggregate for o in self.outputs)


@dataclass(frozen=True)
class CreateCachedView:
    text: str
    name: str
    table: str  # the backend table (a derived view's: the first it reads)
    schema: str | None
    columns: tuple[str, ...] | None  # None = every column (SELECT *)
    select: exp.Select = field(repr=False, compare=False)
    presence: tuple[Presence, ...]
    consistency: Consistency | None
    completeness: Completeness | None
    refresh_seconds: float | None
    position: tuple[int, int] = field(default=(1, 1), compare=False)
    continuous: bool = False  # REFRESH CONTINUOUSLY: kept current from the backend's WAL
    derivation: Derivation | None = None  # a derived view's joins, groups and aggregates
    # WITH DATA (the default, as PostgreSQL's CREATE MATERIALIZED VIEW): a fully materialized
    # view is filled by the statement that creates it; WITH NO DATA: by its first refresh
    with_data: bool = True

    kind: t.ClassVar[str] = "ddl"

    @property
    def where(self) -> exp.Expr | None:
        where = self.select.args.get("where")
        return where.this if where is not None else None

    def to_sql(self, dialect: str = "postgres") -> str:
        """The view's defining query."""
        return self.select.sql(dialect=dialect)

    def to_json(self) -> dict[str, t.Any]:
        consistency = None
        if self.consistency is not None:
            consistency = {
                "kind": self.consistency.kind,
                "columns": list(self.consistency.columns),
                "control": self.consistency.control,
            }
        completeness = None
        if self.completeness is not None:
            completeness = {
                "columns": list(self.completeness.columns),
                "control": self.completeness.control,
            }
        return {
            "kind": self.kind,
            "sql": self.to_sql(),
            "clauses": [],
            "ddl": {
                "statement": "create cached view",
                "name": self.name,
                "table": self.table,
                "columns": list(self.columns) if self.columns is not None else None,
                "presence": [
                    {
                        "columns": list(p.columns),
                        "control": p.control,
                        "control_columns": list(p.control_columns),
                    }
                    for p in self.presence
                ],
                "consistency": consistency,
                "completeness": completeness,
                "refresh_seconds": self.refresh_seconds,
                "continuous": self.continuous,
            },
        }


@dataclass(frozen=True)
class DropCacheObject:
    text: str
    object_kind: t.Literal["cached view", "control table"]
    name: str
    if_exists: bool
    position: tuple[int, int] = field(default=(1, 1), compare=False)

    kind: t.ClassVar[str] = "ddl"

    def to_sql(self, dialect: str = "postgres") -> str:
        return f"DROP TABLE {'IF EXISTS ' if self.if_exists else ''}{self.name}"

    def to_json(self) -> dict[str, t.Any]:
        return {
            "kind": self.kind,
            "sql": self.to_sql(),
            "clauses": [],
            "ddl": {"statement": f"drop {self.object_kind}", "name": self.name},
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


# -- entry points -------------------------------------------------------------------------------


def parse(text: str, percent: bool = False) -> list[Statement]:
    """Parse a script of one or more statements separated by semicolons. ``percent``: the
    text comes with parameters, so ``%%`` is a ``%`` (psycopg's rule: the backend is sent the
    text as written and psycopg reads it so)."""
    try:
        tokens = _percent_tokens(DIALECT.tokenize(text)) if percent else DIALECT.tokenize(text)
        parsed = DIALECT.parser().parse(tokens, text)
        if not _lists_in_place(tokens, parsed):
            # a long list read where no IN list stands: read it one constant at a time
            tokens = _percent_tokens(plain_tokens(text)) if percent else plain_tokens(text)
            parsed = DIALECT.parser().parse(tokens, text)
    except ParseError as exc:
        raise _syntax_error(exc, text) from None
    except TokenError as exc:
        raise _token_error(exc, text) from None
    except RecursionError:
        raise too_deep() from None
    # empty statements (";;", or only a comment, which sqlglot keeps as a Semicolon): nothing
    trees = [tree for tree in parsed if tree is not None and not isinstance(tree, exp.Semicolon)]
    if not trees and not is_empty(text):
        # sqlglot read tokens as nothing at all (a lone ELSE): refuse them at the first
        first = DIALECT.tokenize(text)[0]
        raise SqlSyntaxError(
            f"unexpected {first.text!r}: a statement cannot start with it",
            *offset_position(text, first.start),
        )
    chunks = _statement_texts(text, tokens, len(trees))
    statements = [
        _placed(_typed(tree, chunk, start), text, start)
        for tree, (chunk, start) in zip(trees, chunks, strict=True)
    ]
    if not statements:
        raise SqlSyntaxError("empty statement: there is no SQL to run", 1, 1)
    return statements


def _lists_in_place(tokens: list[Token], trees: list[exp.Expr | None]) -> bool:
    """Did every long list of the tokens become the `ConstantList` of an IN list?"""
    lists = {id(token.node.constants) for token in tokens if isinstance(token, ListToken)}
    if not lists:
        return True
    nodes = {
        id(node.constants)
        for tree in trees
        if tree is not None
        for node in tree.find_all(ConstantList)
    }
    return lists <= nodes


def _percent_tokens(tokens: list[Token]) -> list[Token]:
    """Tokens of a text with parameters as psycopg reads it: ``%%`` (two adjacent % tokens) is
    one %, also inside strings and quoted names; positions stay the text's."""
    found: list[Token] = []
    for token in tokens:
        previous = found[-1] if found else None
        if (
            token.token_type == TokenType.MOD
            and previous is not None
            and previous.token_type == TokenType.MOD
            and previous.text == "%"
            and previous.end + 1 == token.start
            and not previous.comments
        ):
            found[-1] = Token(
                TokenType.MOD,
                "%%",
                previous.line,
                previous.col,
                previous.start,
                token.end,
                previous.comments,
            )
            continue
        if isinstance(token, ListToken):
            found.append(
                token
                if not token.node.is_string
                else ListToken(
                    ConstantList(
                        constants=tuple(c.replace("%%", "%") for c in token.node.constants),
                        is_string=True,
                    ),
                    token.line,
                    token.col,
                    token.start,
                    token.end,
                )
            )
        elif "%%" in token.text and token.token_type in _QUOTED:
            found.append(
                Token(
                    token.token_type,
                    token.text.replace("%%", "%"),
                    token.line,
                    token.col,
                    token.start,
                    token.end,
                    token.comments,
                )
            )
        else:
            found.append(token)
    return found


_QUOTED = frozenset(
    {
        TokenType.STRING,
        TokenType.IDENTIFIER,
        TokenType.NATIONAL_STRING,
        TokenType.BIT_STRING,
        TokenType.HEX_STRING,
        TokenType.RAW_STRING,
    }
)


def is_empty(text: str) -> bool:
    """No statement at all: only whitespace, comments and semicolons (PostgreSQL accepts
    such a text as an empty query)."""
    try:
        tokens = DIALECT.tokenize(text)
    except TokenError:
        return False
    return all(token.token_type.name == "SEMICOLON" for token in tokens)


def parse_one(text: str, percent: bool = False) -> Statement:
    """Parse exactly one statement (a trailing semicolon is fine; ``percent``: as `parse`)."""
    statements = parse(text, percent)
    if len(statements) != 1:
        raise SqlSyntaxError(
            f"expected one statement, found {len(statements)}: send them one at a time "
            "(cursor.execute) or as a DDL script (mtcache ddl FILE)",
            *_second_statement_start(text),
        )
    return statements[0]


def _second_statement_start(text: str) -> tuple[int | None, int | None]:
    tokens = DIALECT.tokenize(text)
    for token, following in itertools.pairwise(tokens):
        if token.token_type.name == "SEMICOLON" and following.token_type.name != "SEMICOLON":
            return following.line, following.col - len(following.text) + 1
    return None, None


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
    return [piece for piece, _ in _pieces(text, tokens)]


def _pieces(text: str, tokens: list[Token]) -> list[tuple[str, int]]:
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


def _statement_texts(text: str, tokens: list[Token], count: int) -> list[tuple[str, int]]:
    """Each statement's text and its offset in the script (``count`` statements: the trees
    sqlglot made, empty ones left out). The typed results keep their own text (for commands
    sqlglot keeps verbatim); a script split is only needed for multi-statement input."""
    if count <= 1:
        return [(text, 0)] * count
    pieces = _pieces(text, tokens)
    if len(pieces) != count:
        raise SqlSyntaxError(
            f"cannot split the script into its {count} statements: send them one at a time", 1, 1
        )
    return pieces


def _placed(statement: Statement, script: str, start: int) -> Statement:
    """A DDL statement with the script position of its text (for errors found later, when
    the script is checked as a whole)."""
    if not isinstance(statement, CreateControlTable | CreateCachedView | DropCacheObject):
        return statement
    return dataclasses.replace(statement, position=offset_position(script, start))


def position_in_script(
    statement: CreateControlTable | CreateCachedView | DropCacheObject, offset: int
) -> tuple[int, int]:
    """(line, column) in the script of an offset into the statement's own text."""
    line, col = statement.position
    before = statement.text[:offset]
    if "\n" not in before:
        return line, col + offset
    return line + before.count("\n"), offset - before.rfind("\n")


def _token_error(exc: TokenError, text: str) -> SqlSyntaxError:
    # sqlglot says "Missing ' from <line>:<offset of the opening quote>" in the cause.
    cause = str(exc.__cause__ or exc)
    match = re.match(r"Missing (.+) from (\d+):(\d+)", cause)
    if match is None:
        return SqlSyntaxError(f"cannot read the statement: {cause}")
    delimiter, line, offset = match.group(1), int(match.group(2)), int(match.group(3))
    col = offset - text.rfind("\n", 0, offset)
    what = {"'": "string", '"': "quoted identifier"}.get(delimiter, "quoted text")
    return SqlSyntaxError(f"unterminated {what}: add the closing {delimiter}", line, col)


def _syntax_error(exc: ParseError, text: str) -> SqlSyntaxError:
    misspelled = _unknown_statement_start(text)
    if misspelled is not None:
        return misspelled
    info = exc.errors[0] if exc.errors else {}
    description = str(info.get("description") or exc).strip()
    highlight = str(info.get("highlight") or "").strip()
    if description.startswith("Invalid expression / Unexpected token"):
        description = (
            f"unexpected {highlight!r}: the statement should have ended before it"
            if highlight
            else "unexpected end of statement"
        )
    elif description.startswith("Required keyword") or description.startswith("Expecting"):
        near = f" near {highlight!r}" if highlight else ""
        description = f"incomplete statement{near}: {description}"
    line, col = info.get("line"), info.get("col")
    if col is not None and highlight and "\n" not in highlight:
        # sqlglot reports where the token ends; people look for where it starts.
        col = max(1, int(col) - len(str(info.get("highlight"))) + 1)
    return SqlSyntaxError(description, line, col)


# the words PostgreSQL statements begin with (its SQL command reference)
_STATEMENT_WORDS = frozenset(
    {
        "ABORT",
        "ALTER",
        "ANALYZE",
        "BEGIN",
        "CALL",
        "CHECKPOINT",
        "CLOSE",
        "CLUSTER",
        "COMMENT",
        "COMMIT",
        "COPY",
        "CREATE",
        "DEALLOCATE",
        "DECLARE",
        "DELETE",
        "DISCARD",
        "DO",
        "DROP",
        "END",
        "EXECUTE",
        "EXPLAIN",
        "FETCH",
        "GRANT",
        "IMPORT",
        "INSERT",
        "LISTEN",
        "LOAD",
        "LOCK",
        "MERGE",
        "MOVE",
        "NOTIFY",
        "PREPARE",
        "REASSIGN",
        "REFRESH",
        "REINDEX",
        "RELEASE",
        "RESET",
        "REVOKE",
        "ROLLBACK",
        "SAVEPOINT",
        "SECURITY",
        "SELECT",
        "SET",
        "SHOW",
        "START",
        "TABLE",
        "TRUNCATE",
        "UNLISTEN",
        "UPDATE",
        "VACUUM",
        "VALUES",
        "WITH",
    }
)


def _unknown_statement_start(text: str) -> SqlSyntaxError | None:
    """A statement that begins with a word that is no keyword (``SELCT name FROM t``): the
    parser would stumble later (at FROM); the typo is where the statement begins."""
    try:
        tokens = DIALECT.tokenize(text)
    except TokenError:
        return None
    starts = [
        b
        for a, b in itertools.pairwise([None, *tokens])
        if a is None or a.token_type.name == "SEMICOLON"
    ]
    for token in starts:
        if (
            token is not None
            and token.token_type.name == "VAR"
            and token.text.upper() not in _STATEMENT_WORDS
        ):
            line, col = offset_position(text, token.start)
            return SqlSyntaxError(
                f"{token.text!r} does not begin a statement: expected SELECT, WITH, VALUES, "
                "INSERT, UPDATE, DELETE, CREATE, ... (a misspelled keyword?)",
                line,
                col,
            )
    return None


def _typed(tree: exp.Expr, text: str, offset: int = 0) -> Statement:
    """The typed statement of a tree; ``text``: its own text, which begins at ``offset`` of
    the parsed script (the tree's positions are the script's)."""
    if isinstance(tree, TimelineNode):
        return Timeline(text=text, begin=tree.name == "BEGIN")
    if isinstance(tree, SessionBoundNode):
        duration = tree.args.get("expression")
        action = t.cast(t.Literal["set", "reset", "show"], tree.name.lower())
        return SessionBound(text, action, duration.seconds if duration is not None else None)
    if isinstance(tree, InspectNode):
        return Inspect(text, t.cast(t.Any, tree.name))
    if isinstance(tree, CacheSettingNode):
        action = t.cast(t.Literal["set", "reset", "show"], tree.name.lower())
        return CacheSetting(text, action, tree.text("name"), tree.args.get("value"))
    if isinstance(tree, RefreshNode):
        keys = tree.args.get("keys")
        view = tree.args.get("this")
        return RefreshCachedView(text, view, tuple(keys) if keys is not None else None)
    if isinstance(tree, ControlTableDef):
        for column in tree.expressions:
            kind = column.args["kind"]
            if kind.this == exp.DataType.Type.USERDEFINED:
                raise SqlSyntaxError(
                    f"unknown type {kind.sql(dialect='postgres')!r} for control column "
                    f"{column.name}: use a built-in type such as INTEGER, BIGINT, TEXT, "
                    "NUMERIC(p, s) or DATE (user-defined types cannot be cached)",
                    *position_of(column),
                )
        return CreateControlTable(
            text=text,
            name=folded(tree.this),
            columns=tuple(
                ControlColumn(name=folded(c.this), type=c.args["kind"].sql(dialect="postgres"))
                for c in tree.expressions
            ),
        )
    if isinstance(tree, CachedViewDef):
        return _typed_cached_view(tree, text)
    if isinstance(tree, DropNode):
        return DropCacheObject(
            text=text,
            object_kind="cached view" if tree.text("kind") == "CACHED VIEW" else "control table",
            name=folded(tree.this),
            if_exists=bool(tree.args.get("exists")),
        )
    explain, body_start = None, 0
    if isinstance(tree, ExplainStatement):
        explain = tree.text("options")
        body_start = tree.meta[BODY_START] - offset
        tree = tree.this
    analysis = analyze(tree)
    clauses = tuple(_check_clause(block, text) for block in analysis.blocks if block.clause)
    cuts = tuple(
        (b - offset, e - offset)
        for b, e in (node.meta[SPAN] for node in tree.find_all(CurrencyClause))
    )
    return Query(
        text=text,
        tree=tree,
        clauses=clauses,
        analysis=analysis,
        explain=explain,
        cuts=cuts,
        body_start=body_start,
    )


def _names(nodes: list[exp.Expr] | None) -> tuple[str, ...]:
    return tuple(folded(n) for n in nodes or [])


def _typed_cached_view(tree: CachedViewDef, text: str) -> CreateCachedView:
    select: exp.Select = tree.expression
    table: exp.Table = select.args["from_"].this
    columns: tuple[str, ...] | None = None
    if not any(isinstance(p, exp.Star) for p in select.expressions):
        columns = tuple(
            folded(p.args["alias"]) if isinstance(p, exp.Alias) else folded(p)
            for p in select.expressions
        )
    presence = tuple(
        Presence(
            columns=_names(p.expressions),
            control=folded(p.this),
            control_columns=_names(p.args.get("control_columns") or p.expressions),
        )
        for p in tree.args.get("presence") or []
    )
    consistency = None
    node: ConsistencyClause | None = tree.args.get("consistency")
    if node is not None:
        kind = t.cast(t.Literal["all", "on", "root"], node.text("kind").lower())
        control = node.args.get("this")
        consistency = Consistency(
            kind=kind,
            columns=_names(node.expressions),
            control=folded(control) if control is not None else None,
        )
    completeness = None
    if tree.args.get("completeness") is not None:
        cnode = tree.args["completeness"]
        control = cnode.args.get("this")
        completeness = Completeness(
            columns=_names(cnode.expressions),
            control=folded(control) if control is not None else None,
        )
    refresh: Duration | exp.Var | None = tree.args.get("refresh")
    continuous = isinstance(refresh, exp.Var)
    derivation = _derivation(select) if is_derived(select) else None
    if derivation is not None:
        columns = tuple(o.name for o in derivation.outputs)
    return CreateCachedView(
        text=text,
        name=folded(tree.this),
        table=folded(table),
        schema=folded(table.args["db"]) if table.args.get("db") else None,
        columns=columns,
        select=select,
        presence=presence,
        consistency=consistency,
        completeness=completeness,
        refresh_seconds=refresh.seconds if isinstance(refresh, Duration) else None,
        continuous=continuous,
        derivation=derivation,
        with_data=tree.args.get("data") is None or tree.args["data"].this is True,
    )


_AGGREGATE_NAMES: dict[type[exp.Expr], t.Literal["count", "sum", "avg", "min", "max"]] = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Avg: "avg",
    exp.Min: "min",
    exp.Max: "max",
}


def _derivation(select: exp.Select) -> Derivation:
    """A derived view's SELECT as the dialect checked it
    (`CacheDDLParser._check_derived_select`)."""
    tables = [select.args["from_"].this, *(j.this for j in select.args.get("joins") or [])]
    sources = tuple(
        DerivedSource(
            folded(table),
            folded(table.args["db"]) if table.args.get("db") else None,
            folded(table.args["alias"].this) if table.args.get("alias") else folded(table),
        )
        for table in tables
    )
    joins: list[tuple[exp.Column, exp.Column]] = []
    for join in select.args.get("joins") or []:
        on = join.args["on"]
        for pair in on.flatten() if isinstance(on, exp.And) else [on]:
            joins.append((pair.this, pair.expression))
    group = select.args.get("group")
    outputs = []
    for projection in select.expressions:
        target = projection.this if isinstance(projection, exp.Alias) else projection
        name = (
            folded(projection.args["alias"])
            if isinstance(projection, exp.Alias)
            else folded(target)
        )
        if isinstance(target, exp.Column):
            outputs.append(DerivedOutput(name, target))
            continue
        value = target.this
        outputs.append(
            DerivedOutput(
                name, None if isinstance(value, exp.Star) else value, _AGGREGATE_NAMES[type(target)]
            )
        )
    return Derivation(
        sources, tuple(joins), tuple(group.expressions) if group is not None else (), tuple(outputs)
    )


def _column_name(column: exp.Column) -> str:
    """``table.column`` as PostgreSQL reads it (unquoted names folded), without quotes."""
    name = folded(column)
    return f"{column_qualifier(column)}.{name}" if column.table else name


def position_of(node: exp.Expr) -> tuple[int | None, int | None]:
    """Line and start column of the first positioned token of a node."""
    for child in node.walk():
        meta = child.meta if isinstance(child, exp.Expr) else {}
        if meta.get("line"):
            width = int(meta.get("end", 0)) - int(meta.get("start", 0))
            return int(meta["line"]), max(1, int(meta["col"]) - width)
    return None, None


def _check_clause(block: Block, text: str) -> BlockClause:
    """§2 scoping: ON names inputs visible from the block; BY columns lie inside the class."""
    clause = block.clause
    assert clause is not None
    specs = []
    own = {s.name for s in block.sources if s.name}
    for node in clause.expressions:
        on = node.args.get("on")
        if on is not None:
            for ident in on:
                if block.resolve(folded(ident)) is None:
                    visible = sorted({s.name for s in block.visible() if s.name})
                    raise SqlSyntaxError(
                        f"input {folded(ident)!r} is not visible from this block: name a "
                        f"table or alias of this block or an outer one ({', '.join(visible)})",
                        *position_of(ident),
                    )
        members = {folded(i) for i in on} if on is not None else own
        for column in node.args.get("by") or []:
            qualifier = column_qualifier(column)
            if qualifier and qualifier not in members:
                raise SqlSyntaxError(
                    f"BY column {_column_name(column)} is outside its consistency class: "
                    f"{qualifier!r} is not among the class's inputs ({', '.join(sorted(members))})",
                    *position_of(column),
                )
        duration: Duration = node.this
        specs.append(
            Spec(
                bound_seconds=duration.seconds,
                on=tuple(folded(i) for i in on) if on is not None else None,
                by=tuple(_column_name(c) for c in node.args.get("by") or []),
                node=node,
            )
        )
    return BlockClause(block=block.index, specs=tuple(specs))


def parse_duration(text: str) -> float:
    """Seconds of a duration written as in a currency clause (``10 min``, ``1.5 SECONDS``)."""
    try:
        statement = parse_one(f"SET CURRENCY BOUND {text}")
    except SqlSyntaxError as exc:
        raise SqlSyntaxError(f"{text!r} is not a duration: {exc.reason}") from None
    assert isinstance(statement, SessionBound) and statement.bound_seconds is not None
    return statement.bound_seconds
