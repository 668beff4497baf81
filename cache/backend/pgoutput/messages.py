"""pgoutput's messages one at a time (`cache.backend.pgoutput`): their types (`Begin`,
`Commit`, `Relation`, `Change`, `Truncate`, `Other`), `decode` for one message, the layouts of
the fixed-size ones, and LSNs as PostgreSQL writes them (`lsn_text`, `lsn_value`)."""

from __future__ import annotations

import datetime as dt
import struct
import typing as t
from dataclasses import dataclass

PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


class Unchanged:
    """A TOASTed value an update did not change (pgoutput does not send it)."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = Unchanged()
Value = str | None | Unchanged


class DecodeError(ValueError):
    """A message that is not pgoutput protocol version 1 or 2 as this decoder knows it."""


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
    (One message's, as `decode` reads it; a transaction's are decoded in bulk, `RowChanges`.)"""

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
RELID_LAYOUT = struct.Struct("!I")
BEGIN_LAYOUT = struct.Struct("!QqI")  # final LSN, commit time, xid
COMMIT_LAYOUT = struct.Struct("!BQQq")  # flags, commit LSN, end LSN, commit time
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
        """TupleData, one message's (a transaction's go through `decode_rows`)."""
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
                    raise DecodeError(
                        f"unknown column kind {chr(kind)!r} (binary values need proto 2)"
                    )
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
    if tag == "B" and len(data) == 1 + BEGIN_LAYOUT.size:  # the per-transaction messages, unpacked
        lsn, micros, xid = BEGIN_LAYOUT.unpack_from(data, 1)  # at once: one each per transaction
        return Begin(lsn, PG_EPOCH + dt.timedelta(microseconds=micros), xid)
    if tag == "C" and len(data) == 1 + COMMIT_LAYOUT.size:
        _, lsn, end, micros = COMMIT_LAYOUT.unpack_from(data, 1)  # flags unused
        return Commit(lsn, end, PG_EPOCH + dt.timedelta(microseconds=micros))
    reader = _Reader(bytes(data))
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


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL writes it (``0/16B3748``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def lsn_value(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)
