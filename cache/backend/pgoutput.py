"""PostgreSQL's logical replication messages (pgoutput, protocol versions 1 and 2), decoded:
what the stream consumer of continuously maintained views reads (the design in
docs/decisions.md, "Continuous maintenance from the WAL").

The messages come one by one from a streaming session (cache/backend/replication.SlotStream)
or, one per row, from ``pg_logical_slot_peek_binary_changes(slot, .., 'proto_version', '1',
'publication_names', pub)``. `decode` turns one into a typed message;
`Transactions` groups a stream of them into whole backend transactions in commit order,
resolving each change's relation from the Relation messages seen so far (pgoutput sends a
relation's description before its first change in a session, and again when it changes).
Column values stay PostgreSQL's text form (None for NULL, `UNCHANGED` for a TOASTed value the
update did not touch); the consumer types them as the view's columns.

Big transactions. With protocol version 2 and ``streaming 'on'``, the backend sends a
transaction larger than its ``logical_decoding_work_mem`` while it is in progress, in blocks
(Stream Start ... Stream Stop, each change carrying its (sub)transaction's xid), and then its
Stream Commit or Stream Abort (of the whole, or of one subtransaction). Whether streamed or
not, a transaction's changes past ``spill_changes`` go to a file of its own in
``spill_dir`` (pickled pieces of ``spill_changes`` changes), so memory holds one piece per
transaction; `Transaction.pieces` reads them back in order at its commit, and an abort drops
them. The files are the session's: the next session starts from the applied position, and
the backend sends the transaction again.
"""

from __future__ import annotations

import bisect
import contextlib
import datetime as dt
import itertools
import os
import pickle
import struct
import typing as t
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


class Unchanged:
    """A TOASTed value an update did not change (pgoutput does not send it)."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = Unchanged()
Value = str | None | Unchanged


class DecodeError(ValueError):
    """A message that is not pgoutput protocol version 1 or 2 as this decoder knows it."""


SPILL_CHANGES = 50_000  # changes of one transaction held in memory before a piece is spilled


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
    """One backend transaction's changes, in order, each with its relation: those in memory
    (``changes``), after the pieces spilled to ``spill`` (`pieces` gives them all)."""

    xid: int
    commit_lsn: int = 0
    end_lsn: int = 0
    commit_time: dt.datetime = PG_EPOCH
    changes: list[tuple[Relation, Change]] = field(default_factory=list)
    # relations truncated, each after how many of ``changes`` (the order matters: a TRUNCATE
    # and the rows inserted after it in one transaction)
    truncated: list[tuple[int, Relation]] = field(default_factory=list)
    spill: Path | None = None  # its spilled pieces, in order
    spilled: int = 0  # changes in them
    # a streamed transaction's subtransaction of each change and each TRUNCATE in memory,
    # and the aborted ones
    subxids: list[int] | None = None
    truncated_by: list[int] = field(default_factory=list)
    aborted: set[int] = field(default_factory=set)

    @property
    def size(self) -> int:
        """Its changes, spilled or not."""
        return self.spilled + len(self.changes)

    def spill_out(self, directory: Path) -> None:
        """Write the changes in memory as the next piece (they leave memory)."""
        if self.spill is None:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.spill = directory / f"xid-{self.xid}-{next(_SPILLS)}.pieces"
        # plain tuples, each relation once: pickled several times faster than named tuples
        relations: dict[int, int] = {}
        listed: list[Relation] = []
        rows = []
        for relation, change in self.changes:
            at = relations.get(id(relation))
            if at is None:
                at = relations[id(relation)] = len(listed)
                listed.append(relation)
            rows.append((at, *change))
        piece = (listed, rows, self.truncated, self.subxids, self.truncated_by)
        with open(self.spill, "ab") as out:
            pickle.dump(piece, out, protocol=pickle.HIGHEST_PROTOCOL)
        self.spilled += len(self.changes)
        self.changes, self.truncated, self.truncated_by = [], [], []
        self.subxids = [] if self.subxids is not None else None

    def pieces(self) -> Iterator[Transaction]:
        """Its changes as transactions of at most a piece each (the same xid and commit), in
        order, the aborted subtransactions' changes left out."""
        if self.spill is not None:
            with open(self.spill, "rb") as source:
                while True:
                    try:
                        listed, rows, truncated, subxids, truncated_by = pickle.load(source)
                    except EOFError:
                        break
                    changes = [(listed[r[0]], Change(r[1], r[2], r[3], r[4])) for r in rows]
                    yield self._piece(changes, truncated, subxids, truncated_by)
        yield self._piece(self.changes, self.truncated, self.subxids, self.truncated_by)

    def _piece(self, changes: list[tuple[Relation, Change]],
               truncated: list[tuple[int, Relation]], subxids: list[int] | None,
               truncated_by: list[int]) -> Transaction:  # fmt: skip
        if self.aborted and subxids is not None:
            aborted = self.aborted
            kept = [i for i, x in enumerate(subxids) if x not in aborted]
            # each TRUNCATE kept comes after the kept changes that came before it
            truncated = [(bisect.bisect_left(kept, at), relation)
                         for (at, relation), by in zip(truncated, truncated_by, strict=True)
                         if by not in aborted]  # fmt: skip
            changes = [changes[i] for i in kept]
        return Transaction(self.xid, self.commit_lsn, self.end_lsn, self.commit_time,
                           changes, truncated)  # fmt: skip

    def discard(self) -> None:
        """Remove its spilled pieces (after its apply, or at its abort)."""
        if self.spill is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.spill)
            self.spill = None


_SPILLS = itertools.count()
_STREAM_START = struct.Struct("!IB")  # xid, first segment
_STREAM_COMMIT = struct.Struct("!IBQQq")  # xid, flags, commit LSN, end LSN, commit time
_STREAM_ABORT = struct.Struct("!II")  # xid, subtransaction xid
_XID_RELID = struct.Struct("!II")  # a streamed change's (sub)transaction and relation


@dataclass
class Transactions:
    """Groups decoded messages into whole transactions (relations remembered across them);
    with ``spill_dir``, a transaction's changes past ``spill_changes`` are spilled there."""

    relations: dict[int, Relation] = field(default_factory=dict)
    unfinished: Transaction | None = None  # begun, its commit not read yet
    spill_dir: Path | None = None
    spill_changes: int = SPILL_CHANGES
    streamed: dict[int, Transaction] = field(default_factory=dict)  # in progress, by xid
    streaming: int | None = None  # the xid of the stream block being read
    blocks: int = 0  # stream blocks read (the backend streamed transactions in progress)

    def __post_init__(self) -> None:
        # changes a transaction holds in memory before a piece is spilled (without a
        # directory to spill to: all of them)
        self._limit = self.spill_changes if self.spill_dir is not None else 1 << 62

    def read(self, messages: Iterable[bytes]) -> Iterator[Transaction]:
        """The transactions ``messages`` complete (a batch ending mid-transaction: the next
        read goes on with it)."""
        current, self.unfinished = self.unfinished, None
        relations = self.relations
        limit = self._limit
        for data in messages:
            tag = data[0] if data else 0
            if self.streaming is not None:
                finished = self._streamed(data)
                if finished is not None:
                    yield finished
                continue
            # the hot path, one message per row changed and two per transaction: an update
            # without its old key, a Begin and a Commit, unpacked in place
            if tag == 0x55 and current is not None and len(data) > 6 and data[5] == 0x4E:
                (relid,) = _RELID.unpack_from(data, 1)
                relation = relations.get(relid) or self._relation(relid)
                reader = _Reader(data)
                reader.at = 6
                current.changes.append((relation, Change("update", relid, None, reader.tuple())))
                if len(current.changes) >= limit:
                    current.spill_out(t.cast(Path, self.spill_dir))
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
            if tag in (0x53, 0x63, 0x41):  # S, c, A: a streamed transaction's (between blocks)
                finished = self._streamed(data)
                if finished is not None:
                    yield finished
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
                self._add(current, message, None)
        self.unfinished = current

    def _streamed(self, data: bytes) -> Transaction | None:
        """A message of protocol 2's streaming: the transaction a Stream Commit completes."""
        tag = chr(data[0])
        if tag == "S":
            xid, _ = _take(_STREAM_START, data, "stream start")
            self.streaming = xid
            self.blocks += 1
            if xid not in self.streamed:
                self.streamed[xid] = Transaction(xid, subxids=[])
            return None
        if tag == "E":
            self.streaming = None
            return None
        if tag == "c":
            xid, _, commit_lsn, end_lsn, micros = _take(_STREAM_COMMIT, data, "stream commit")
            found = self.streamed.pop(xid, None)
            txn = found if found is not None else Transaction(xid, subxids=[])
            txn.commit_lsn, txn.end_lsn = commit_lsn, end_lsn
            txn.commit_time = PG_EPOCH + dt.timedelta(microseconds=micros)
            return txn
        if tag == "A":
            xid, subxid = _take(_STREAM_ABORT, data[: 1 + _STREAM_ABORT.size], "stream abort")
            going = self.streamed.get(xid)
            if going is not None:
                if subxid == xid:
                    self.streamed.pop(xid).discard()
                else:
                    going.aborted.add(subxid)
            return None
        if self.streaming is None or len(data) < 5:
            raise DecodeError(f"a streamed {tag!r} message outside a stream block")
        if tag in ("U", "I") and len(data) > 10 and data[9] == 0x4E:  # (the hot path: a row
            subxid, relid = _XID_RELID.unpack_from(data, 1)  # inserted, or updated without
            reader = _Reader(data)  # its old key: read in place)
            reader.at = 10
            change = Change("update" if tag == "U" else "insert", relid, None, reader.tuple())
            self._add(self.streamed[self.streaming], change, subxid)
            return None
        (subxid,) = _RELID.unpack_from(data, 1)
        message = decode(data[:1] + data[5:])  # (the same message less its xid)
        if isinstance(message, Relation):
            self.relations[message.relid] = message
        elif isinstance(message, Change | Truncate):
            self._add(self.streamed[self.streaming], message, subxid)
        return None

    def _add(self, txn: Transaction, message: Change | Truncate, subxid: int | None) -> None:
        if isinstance(message, Change):
            txn.changes.append((self._relation(message.relid), message))
            if txn.subxids is not None:
                txn.subxids.append(subxid if subxid is not None else txn.xid)
            if len(txn.changes) >= self._limit:
                txn.spill_out(t.cast(Path, self.spill_dir))
        else:
            at = len(txn.changes)
            txn.truncated += [(at, self._relation(r)) for r in message.relids]
            if txn.subxids is not None:
                txn.truncated_by += [subxid if subxid is not None else txn.xid] * len(
                    message.relids)

    def close(self) -> None:
        """Drop what the session left unfinished (its spilled pieces with it)."""
        for txn in self.streamed.values():
            txn.discard()
        self.streamed.clear()
        if self.unfinished is not None:
            self.unfinished.discard()
            self.unfinished = None

    def _relation(self, relid: int) -> Relation:
        relation = self.relations.get(relid)
        if relation is None:
            raise DecodeError(f"a change of relation {relid} before its description")
        return relation


def _take(layout: struct.Struct, data: bytes, what: str) -> tuple[t.Any, ...]:
    if len(data) != 1 + layout.size:
        raise DecodeError(f"{what}: {len(data)} bytes, not {1 + layout.size}")
    return layout.unpack_from(data, 1)


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL writes it (``0/16B3748``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def lsn_value(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)
