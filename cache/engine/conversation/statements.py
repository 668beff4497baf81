"""The statements and portals a client prepared and bound in its conversation, and what is
read off them: how the engine routes a statement, what the backend is sent for it, how its
rows are described and its values read and written."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
import typing as t
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from psycopg import pq

from cache.engine.conversation.reported import Description
from cache.engine.lane import WireLane
from cache.engine.link import relay
from cache.engine.read import Suspended
from cache.engine.result import Result
from cache.engine.route import CachedRead, Passthrough, Route, Write
from cache.wire import protocol, values
from cache.wire.oids import OID
from cache.wire.protocol import Field
from sql_ext.placeholders import Converted, to_backend

Out = Callable[[bytes], None]

# settings that shape PostgreSQL's text output without being reported in ParameterStatus
OUTPUT_SETTINGS = ("EXTRA_FLOAT_DIGITS", "BYTEA_OUTPUT", "RESET ALL", "DISCARD")
# pg_type.typlen of the types the cache's own results have (-1: variable length)
_SIZES = {OID.bool: 1, OID.int8: 8, OID.float8: 8, OID.timestamptz: 8}
_COPY = re.compile(r"\s*COPY\b", re.IGNORECASE)


@dataclass
class Statement:
    """A statement the client prepared (Parse)."""

    sql: bytes  # as the client sent it
    text: str
    param_types: tuple[int, ...]  # as the client gave them (0: unspecified)
    converted: Converted  # the engine's text: $n as %s
    route: Route
    backend_name: bytes | None = None  # its name at the backend once parsed there
    described: Description | None = None  # once described
    # its RowDescription by the result format codes of a Bind (`row_description`)
    row_descriptions: dict[tuple[int, ...], bytes] = dataclasses.field(default_factory=dict)
    lane: WireLane | None = None  # its runs' hit path in the session (`AtOnce.lane`)
    # its runs passed through raw (`RawRuns.lane`): their shape, the backend's Bind head for
    # them, and the conversation's `handled` count when the last was
    raw_shape: protocol.RunShape | None = None
    raw_head: bytes = b""
    raw_handled: int = -1
    answered_at: int = -1  # the session's epoch at its last run answered at hand without one

    @property
    def passthrough(self) -> bool:
        return isinstance(self.route, Passthrough | Write)

    @functools.cached_property
    def copies(self) -> bool:
        """Whether it is a COPY (its data passes outside libpq's pipeline mode)."""
        return _COPY.match(self.text) is not None

    @property
    def returns_rows(self) -> bool:
        """Whether it is a query: its rows are described even when it has no column
        (``SELECT``: a RowDescription of no field, where other statements have NoData)."""
        routed = self.route
        return isinstance(routed, CachedRead) or (
            isinstance(routed, Passthrough) and routed.reads is not None
        )

    def rows_described(self, found: Description) -> Description:
        """A description from libpq, which gives no field alike for NoData and for rows of
        no column: the latter for a query."""
        params, fields = found
        return (params, []) if fields is None and self.returns_rows else found

    @functools.cached_property
    def relayed_as_is(self) -> bool:
        """Whether passing it through needs no more than relaying the backend's answer (no
        effect `Conversation.forwarded` notes)."""
        return not any(effects(self.text))

    @functools.cached_property
    def raw(self) -> bool:
        """Whether its runs may pass through byte for byte (`RawRuns.run`): a plain read or
        write of rows, which leaves the backend session as its answer shows (no transaction
        control, DDL, SET, LISTEN or output setting, no set_config by name)."""
        routed = self.route
        plain = (isinstance(routed, Passthrough) and routed.reads is not None) or (
            isinstance(routed, Write) and routed.tables is not None and not routed.changes_catalog
        )
        return plain and self.relayed_as_is and "SET_CONFIG" not in self.text.upper()

    @functools.cached_property
    def encodable(self) -> bool:
        """Whether the server encodes every column of its description (once described)."""
        assert self.described is not None and self.described[1] is not None
        return values.encodable(f.type_oid for f in self.described[1])

    @property
    def engine_sql(self) -> str:
        """The text the engine routes and plans (``%s`` marks for ``$n`` ones)."""
        converted = self.converted
        return converted.sql if converted.order else self.text

    @property
    def backend_text(self) -> str:
        """What the backend is sent for the statement: a cached read's clauses cut out."""
        routed = self.route
        if not isinstance(routed, CachedRead):
            return self.text
        order = self.converted.order
        return to_backend(routed.query.backend_sql, order) if order else routed.query.backend_sql

    def pooled_name(self) -> bytes:
        """Its name on pooled connections, which the sessions share: its text's and parameter
        types'."""
        digest = hashlib.blake2b(self.sql, digest_size=12)
        digest.update(b"".join(oid.to_bytes(4, "big") for oid in self.param_types))
        return b"mtcache_" + digest.hexdigest().encode()


@dataclass
class Portal:
    statement: Statement
    bind: protocol.Bind
    # rows made and not yet sent (a row-limited Execute), and the tag at their end
    rows: deque[bytes] | None = None
    tag: bytes = b""

    def row_description(self) -> bytes:
        """The RowDescription of a portal of a described statement that returns rows, in
        its result formats (made once per statement and formats)."""
        statement = self.statement
        codes = self.bind.result_formats
        found = statement.row_descriptions.get(codes)
        if found is None:
            assert statement.described is not None and statement.described[1] is not None
            fields = statement.described[1]
            formats = relay.result_formats(codes, len(fields))
            found = protocol.row_description(
                [f._replace(format=c) for f, c in zip(fields, formats, strict=True)]
            )
            statement.row_descriptions[codes] = found
        return found

    def bound(self, describe: bool) -> bytes:
        """BindComplete, then the portal's description if asked (a run taken whole)."""
        if not describe:
            return protocol.BIND_COMPLETE
        assert self.statement.described is not None
        return protocol.BIND_COMPLETE + (
            protocol.NO_DATA if self.statement.described[1] is None else self.row_description()
        )

    def holder(self) -> Out:
        """Where a row-limited Execute's messages wait: the rows in the portal, the
        CommandComplete's tag apart."""
        self.rows = deque()
        rows = self.rows

        def hold(data: bytes) -> None:
            if data[:1] == b"C":
                self.tag = data[5:-1]
            else:
                rows.append(data)

        return hold

    def next_rows(self, max_rows: int) -> bytes:
        """The next rows of a row-limited portal, then PortalSuspended when a full batch
        went out (as PostgreSQL, which cannot tell that nothing is left), else the tag, a
        SELECT's counting the rows of this batch as PostgreSQL's does."""
        rows = self.rows
        assert rows is not None
        taken: list[bytes] = []
        while rows and (max_rows <= 0 or len(taken) < max_rows):
            taken.append(rows.popleft())
        if max_rows > 0 and len(taken) == max_rows:
            return b"".join(taken) + protocol.PORTAL_SUSPENDED
        tag = self.tag
        if tag.startswith(b"SELECT "):
            tag = b"SELECT %d" % len(taken)
        return b"".join(taken) + protocol.command_complete(tag)


@dataclass(frozen=True, slots=True)
class SuspendedRead:
    """A cached read of a run of ``statement`` bound by ``bind``, begun at hand and suspended
    where it would wait (`cache.engine.read`): nothing it did counted yet."""

    statement: Statement
    bind: protocol.Bind
    read: Suspended

    def of(self, portal: Portal) -> bool:
        """Whether it is the read of this portal's run (bound alike)."""
        return portal.statement is self.statement and portal.bind == self.bind


class Refusal(Exception):
    """The server refuses a message: an ErrorResponse with this SQLSTATE."""

    def __init__(self, sqlstate: str, text: str) -> None:
        super().__init__(text)
        self.sqlstate = sqlstate


class Unreadable(Refusal):
    """A parameter value of a type the cache does not decode."""


def effects(sql: str) -> tuple[bool, bool]:
    """Whether a statement may change a setting local answers are encoded by
    (`OUTPUT_SETTINGS`), and whether it may LISTEN."""
    upper = sql.upper()
    return any(name in upper for name in OUTPUT_SETTINGS), "LISTEN" in upper


def encodes(result: Result) -> bool:
    """Whether the server encodes every column of an engine's result."""
    return values.encodable(c.type_oid or 0 for c in result.columns or ())


def decoders(bind: protocol.Bind, types: t.Sequence[int]) -> list[values.Decoder | None]:
    """How each parameter of a Bind is read, by its type and format (None: a type the cache
    cannot read)."""
    return [values.decoder(oid, bind.param_format(i) == 1) for i, oid in enumerate(types)]


def bind_formats(bind: protocol.Bind) -> tuple[list[int] | None, int, list[int] | None]:
    """(parameter formats, the one result format libpq asks for, the client's per-column
    formats when they differ: those columns are converted)."""
    params = [bind.param_format(i) for i in range(len(bind.params))] or None
    formats = list(bind.result_formats)
    if len(set(formats)) > 1:
        return params, 0, formats
    return params, formats[0] if formats else 0, None


def result_formats(result: pq.abc.PGresult) -> list[int]:
    return [result.fformat(i) for i in range(result.nfields)]


def named(name: bytes) -> str:
    return name.decode(errors="replace")


def result_fields(result: Result, formats: list[int]) -> list[Field]:
    """A result's RowDescription: PostgreSQL's own description of the statement where the
    engine has it (table and column numbers included), else name and type."""
    described = result.described
    if described is not None:
        return relay.fields_of(described, formats)
    columns = result.columns or ()
    return [
        field(c.name, c.type_oid or OID.text, c.type_modifier, f)
        for c, f in zip(columns, formats, strict=True)
    ]


def field(name: str, oid: int, type_modifier: int, format: int) -> Field:
    """A RowDescription field of a column no table holds."""
    return Field(name.encode(), 0, 0, oid, _SIZES.get(oid, -1), type_modifier, format)


__all__ = [
    "Out",
    "Portal",
    "Refusal",
    "Statement",
    "SuspendedRead",
    "Unreadable",
    "bind_formats",
    "decoders",
    "effects",
    "encodes",
    "field",
    "named",
    "result_fields",
]
