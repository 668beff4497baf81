"""PostgreSQL's logical replication messages (pgoutput, protocol version 1), decoded: what the
stream consumer of continuously maintained views reads (the design in
docs/decisions.md, "Continuous maintenance from the WAL").

The messages come one by one from a streaming session (cache/backend/replication.SlotStream)
or, one per row, from ``pg_logical_slot_peek_binary_changes(slot, .., 'proto_version', '1',
'publication_names', pub)``. `decode` turns one into a typed message;
`Transactions` groups a stream of them into whole backend transactions in commit order,
resolving each change's relation from the Relation messages seen so far (pgoutput sends a
relation's description before its first change in a session, and again when it changes).
Column values stay PostgreSQL's text form (None for NULL, `UNCHANGED` for a TOASTed value the
update did not touch); the consumer types them as the view's columns.
"""

from __future__ import annotations

import datetime as dt
import struct
import typing as t
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


class Unchanged:
    """A TOASTed value an update did not change (pgoutput does not send it)."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = Unchanged()
Value = str | None | Unchanged


class DecodeError(ValueError):
    """A message that is not pgoutput protocol version 1 as this decoder knows it."""


@dataclass(frozen=True)
class Begin:
    final_lsn: int
    commit_time: dt.datetime
    xid: int


@dataclass(frozen=True)
class Commit:
    commit_lsn: int
    end_lsn: int
    commit_time: dt.datetime


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    key: bool


@dataclass(frozen=True)
class Relation:
    relid: int
    schema: str
    name: str
    replica_identity: str
    columns: tuple[Column, ...]


class Change(t.NamedTuple):
    """An insert, update or delete of one row; ``old`` is the key (or the whole old row under
    REPLICA IDENTITY FULL) when pgoutput sends it, ``new`` the row after (None for a delete).
    (A named tuple: one is made per row changed.)"""

    kind: t.Literal["insert", "update", "delete"]
    relid: int
    old: tuple[Value, ...] | None
    new: tuple[Value, ...] | None


@dataclass(frozen=True)
class Truncate:
    relids: tuple[int, ...]


@dataclass(frozen=True)
class Other:
    """A message the consumer does not act on (Origin, Type, logical decoding messages)."""

    tag: str


Message = Begin | Commit | Relation | Change | Truncate | Other


_INT16 = struct.Struct("!h")
_RELID = struct.Struct("!I")
_BEGIN = struct.Struct("!QqI")  # final LSN, commit time, xid
_COMMIT = struct.Struct("!BQQq")  # flags, commit LSN, end LSN, commit time
_INT32 = struct.Struct("!i")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> t.Any:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise DecodeError(f"message ends early at byte {self.at} ({len(self.data)} bytes)")
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return value

    def string(self) -> str:
        end = self.data.find(b"\0", self.at)
        if end < 0:
            raise DecodeError(f"unterminated string at byte {self.at}")
        text = self.data[self.at : end].decode()
        self.at = end + 1
        return text

    def time(self) -> dt.datetime:
        return PG_EPOCH + dt.timedelta(microseconds=self.take("!q"))

    def tuple(self) -> tuple[Value, ...]:
        """TupleData: the hot path of decoding (one per row changed), kept to plain indexing."""
        data, at = self.data, self.at
        int32 = _INT32.unpack_from
        try:
            (count,) = _INT16.unpack_from(data, at)
            at += 2
            values: list[Value] = []
            append = values.append
            for _ in range(count):
                kind = data[at]
                if kind == 0x74:  # t: text
                    size = int32(data, at + 1)[0]
                    at += 5 + size
                    append(data[at - size : at].decode())
                    continue
                at += 1
                if kind == 0x6E:  # n: NULL
                    append(None)
                elif kind == 0x75:  # u: unchanged TOASTed value
                    append(UNCHANGED)
                else:
                    raise DecodeError(f"unknown column kind {chr(kind)!r} (binary values need "
                                      "proto 2)")  # fmt: skip
        except (IndexError, struct.error):
            raise DecodeError(f"message ends early at byte {at} ({len(data)} bytes)") from None
        if at > len(data):
            raise DecodeError(f"message ends early at byte {at} ({len(data)} bytes)")
        self.at = at
        return tuple(values)


def decode(data: bytes) -> Message:
    """One pgoutput message."""
    if not data:
        raise DecodeError("an empty message")
    tag = chr(data[0])
    if tag == "B" and len(data) == 1 + _BEGIN.size:  # the per-transaction messages, unpacked
        lsn, micros, xid = _BEGIN.unpack_from(data, 1)  # at once: one each per transaction
        return Begin(lsn, PG_EPOCH + dt.timedelta(microseconds=micros), xid)
    if tag == "C" and len(data) == 1 + _COMMIT.size:
        _, lsn, end, micros = _COMMIT.unpack_from(data, 1)  # flags unused
        return Commit(lsn, end, PG_EPOCH + dt.timedelta(microseconds=micros))
    reader = _Reader(bytes(data))
    if tag == "U" and len(data) > 6 and data[5] == 0x4E:  # an update with no old key: the
        reader.at = 6  # common case of the hot path (one per row changed)
        return Change("update", _RELID.unpack_from(data, 1)[0], None, reader.tuple())
    reader.take("!B")
    if tag == "B":
        return Begin(reader.take("!Q"), reader.time(), reader.take("!I"))
    if tag == "C":
        reader.take("!B")  # flags, unused
        return Commit(reader.take("!Q"), reader.take("!Q"), reader.time())
    if tag == "R":
        relid, schema, name = reader.take("!I"), reader.string(), reader.string()
        identity = chr(reader.take("!B"))
        columns = []
        for _ in range(reader.take("!h")):
            flags, column = reader.take("!B"), reader.string()
            columns.append(Column(column, reader.take("!I"), bool(flags & 1)))
            reader.take("!i")  # type modifier
        return Relation(relid, schema, name, identity, tuple(columns))
    if tag == "I":
        relid = reader.take("!I")
        _expect(reader, "N")
        return Change("insert", relid, None, reader.tuple())
    if tag == "U":
        relid = reader.take("!I")
        marker = chr(reader.take("!B"))
        old = None
        if marker in ("K", "O"):
            old = reader.tuple()
            marker = chr(reader.take("!B"))
        if marker != "N":
            raise DecodeError(f"update: expected the new tuple, found {marker!r}")
        return Change("update", relid, old, reader.tuple())
    if tag == "D":
        relid = reader.take("!I")
        marker = chr(reader.take("!B"))
        if marker not in ("K", "O"):
            raise DecodeError(f"delete: expected a key or old tuple, found {marker!r}")
        return Change("delete", relid, reader.tuple(), None)
    if tag == "T":
        count = reader.take("!i")
        reader.take("!B")  # options: CASCADE, RESTART IDENTITY
        return Truncate(tuple(reader.take("!I") for _ in range(count)))
    if tag in ("O", "Y", "M"):
        return Other(tag)
    raise DecodeError(f"unknown message {tag!r}")


def _expect(reader: _Reader, marker: str) -> None:
    found = chr(reader.take("!B"))
    if found != marker:
        raise DecodeError(f"expected {marker!r}, found {found!r}")


@dataclass
class Transaction:
    """One backend transaction's changes, in order, each with its relation."""

    xid: int
    commit_lsn: int = 0
    end_lsn: int = 0
    commit_time: dt.datetime = PG_EPOCH
    changes: list[tuple[Relation, Change]] = field(default_factory=list)
    # relations truncated, each after how many of ``changes`` (the order matters: a TRUNCATE
    # and the rows inserted after it in one transaction)
    truncated: list[tuple[int, Relation]] = field(default_factory=list)


@dataclass
class Transactions:
    """Groups decoded messages into whole transactions (relations remembered across them)."""

    relations: dict[int, Relation] = field(default_factory=dict)
    unfinished: Transaction | None = None  # begun, its commit not read yet

    def read(self, messages: Iterable[bytes]) -> Iterator[Transaction]:
        """The transactions ``messages`` complete (a batch ending mid-transaction: the next
        read goes on with it)."""
        current, self.unfinished = self.unfinished, None
        relations = self.relations
        for data in messages:
            tag = data[0] if data else 0
            # the hot path, one message per row changed and two per transaction: an update
            # without its old key, a Begin and a Commit, unpacked in place
            if tag == 0x55 and current is not None and len(data) > 6 and data[5] == 0x4E:
                (relid,) = _RELID.unpack_from(data, 1)
                relation = relations.get(relid) or self._relation(relid)
                reader = _Reader(data)
                reader.at = 6
                current.changes.append((relation, Change("update", relid, None, reader.tuple())))
                continue
            if tag == 0x42 and len(data) == 1 + _BEGIN.size:
                current = Transaction(_BEGIN.unpack_from(data, 1)[2])
                continue
            if tag == 0x43 and current is not None and len(data) == 1 + _COMMIT.size:
                _, current.commit_lsn, current.end_lsn, micros = _COMMIT.unpack_from(data, 1)
                current.commit_time = PG_EPOCH + dt.timedelta(microseconds=micros)
                yield current
                current = None
                continue
            message = decode(data)
            if isinstance(message, Relation):
                self.relations[message.relid] = message
            elif isinstance(message, Begin):
                current = Transaction(message.xid)
            elif isinstance(message, Commit):
                if current is None:
                    raise DecodeError("a commit without its begin")
                current.commit_lsn, current.end_lsn = message.commit_lsn, message.end_lsn
                current.commit_time = message.commit_time
                yield current
                current = None
            elif isinstance(message, Change | Truncate):
                if current is None:
                    raise DecodeError("a change outside a transaction")
                if isinstance(message, Change):
                    current.changes.append((self._relation(message.relid), message))
                else:
                    at = len(current.changes)
                    current.truncated += [(at, self._relation(r)) for r in message.relids]
        self.unfinished = current

    def _relation(self, relid: int) -> Relation:
        relation = self.relations.get(relid)
        if relation is None:
            raise DecodeError(f"a change of relation {relid} before its description")
        return relation


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL writes it (``0/16B3748``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def lsn_value(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)
