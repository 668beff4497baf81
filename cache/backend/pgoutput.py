"""PostgreSQL's logical replication messages (pgoutput, protocol versions 1 and 2), decoded:
what the stream consumer of continuously maintained views reads (the design in
docs/decisions/continuous-maintenance-from-the-wal.md).

The messages come one by one from a streaming session (cache/backend/replication.SlotStream)
or, one per row, from ``pg_logical_slot_peek_binary_changes(slot, .., 'proto_version', '1',
'publication_names', pub)``. `decode` turns one into a typed message; `Transactions` groups a
stream of them into whole backend transactions in commit order. A transaction keeps its row
changes (Insert, Update, Delete: one message per row) as they were sent, with the relation
descriptions in effect for them (pgoutput sends a relation's description before its first
change in a session, and again when it changes); `Transaction.rows` decodes them at once, with
numpy over their bytes, into Arrow text columns per relation (`RowChanges`). Column values stay
PostgreSQL's text form (NULL apart, and a TOASTed value the update did not touch flagged
``unchanged``); the consumer types them as the view's columns.

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

import contextlib
import dataclasses
import datetime as dt
import itertools
import operator
import os
import pickle
import re
import struct
import typing as t
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

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
    if tag == "B" and len(data) == 1 + _BEGIN.size:  # the per-transaction messages, unpacked
        lsn, micros, xid = _BEGIN.unpack_from(data, 1)  # at once: one each per transaction
        return Begin(lsn, PG_EPOCH + dt.timedelta(microseconds=micros), xid)
    if tag == "C" and len(data) == 1 + _COMMIT.size:
        _, lsn, end, micros = _COMMIT.unpack_from(data, 1)  # flags unused
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


# -- row changes decoded at once --------------------------------------------------------------

_I, _U, _D, _N, _K, _O = b"IUDNKO"
_NOT_ROW = re.compile(rb"[^IUD]")  # a message's tag that is not a row change's
_FIRST_BYTE = operator.itemgetter(0)
_TEXT, _NULL, _TOASTED = b"tnu"
_WIDE = 512  # bytes a value takes on average past which its text is cut out value by value


@dataclass(frozen=True)
class RowChanges:
    """One relation's row changes among a transaction's messages, decoded at once: ``at``
    each change's index among them, ``kind`` its message's tag (``I``, ``U``, ``D``); ``old``
    and ``new`` the tuples' values as Arrow text columns named as the relation's, a row for
    every change (where ``has_old``/``has_new`` is False, no tuple was sent and the row is
    null); ``unchanged``, per column of ``new`` that has some, the rows whose TOASTed value
    the update did not send (null in ``new``)."""

    relation: Relation
    at: np.ndarray
    kind: np.ndarray
    old: pa.Table
    has_old: np.ndarray
    new: pa.Table
    has_new: np.ndarray
    unchanged: dict[str, np.ndarray]
    subxid: np.ndarray | None = None  # streamed: each change's subtransaction

    def where(self, keep: np.ndarray) -> RowChanges:
        """The changes ``keep`` (a mask) selects."""
        mask = pa.array(keep)
        return RowChanges(
            self.relation,
            self.at[keep],
            self.kind[keep],
            self.old.filter(mask),
            self.has_old[keep],
            self.new.filter(mask),
            self.has_new[keep],
            {c: m[keep] for c, m in self.unchanged.items()},
            None if self.subxid is None else self.subxid[keep],
        )

    def changes(self) -> list[Change]:
        """Each as a `Change`, plain values as `decode` gives them (tests, diagnostics)."""
        names = [c.name for c in self.relation.columns]
        kinds = {_I: "insert", _U: "update", _D: "delete"}
        olds = list(zip(*(self.old.column(n).to_pylist() for n in names), strict=True))
        news = list(zip(*(self.new.column(n).to_pylist() for n in names), strict=True))
        for name, mask in self.unchanged.items():
            index = names.index(name)
            for row in np.flatnonzero(mask).tolist():
                news[row] = (*news[row][:index], UNCHANGED, *news[row][index + 1 :])
        return [
            Change(kinds[k], self.relation.relid, o if ho else None, n if hn else None)  # type: ignore[arg-type]
            for k, o, ho, n, hn in zip(
                self.kind.tolist(),
                olds,
                self.has_old.tolist(),
                news,
                self.has_new.tolist(),
                strict=True,
            )
        ]


def decode_rows(
    messages: list[bytes], relations: Mapping[int, Relation], streamed: bool, first: int = 0
) -> list[RowChanges]:
    """Insert, Update and Delete messages decoded at once (numpy over their bytes joined),
    one `RowChanges` per relation in the order of its first change; ``first`` the index of
    the first message (``at`` counts from it); ``streamed``: each carries its
    subtransaction's xid (kept in ``subxid``)."""
    if not messages:
        return []
    joined = b"".join(messages)
    buf = np.frombuffer(joined, np.uint8)
    sizes = np.fromiter(map(len, messages), np.int64, len(messages))
    ends = np.cumsum(sizes)
    starts = ends - sizes
    at = np.arange(first, first + len(messages), dtype=np.int64)
    head = 1 + 4 * streamed + 4 + 1  # tag, [xid,] relid, marker
    if np.any(ends - starts < head):
        raise DecodeError(f"a row change of fewer than {head} bytes")
    kind = buf[starts]
    if np.any((kind != _I) & (kind != _U) & (kind != _D)):
        tag = chr(kind[(kind != _I) & (kind != _U) & (kind != _D)][0])
        raise DecodeError(f"unknown row change {tag!r}")
    where = starts + 1
    subxids = None
    if streamed:
        subxids = _int32(buf, where)
        where = where + 4
    relids = _int32(buf, where)
    marker = buf[where + 4]
    where = where + 5
    has_old = (marker == _K) | (marker == _O)
    if (
        np.any((kind == _I) & (marker != _N))
        or np.any((kind == _D) & ~has_old)
        or np.any((kind == _U) & ~has_old & (marker != _N))
    ):
        raise DecodeError("a row change without its tuple (expected 'N', 'K' or 'O')")
    found = []
    order = np.unique(relids, return_index=True)
    for relid in order[0][np.argsort(order[1])].tolist():
        relation = relations.get(relid)
        if relation is None:
            raise DecodeError(f"a change of relation {relid} before its description")
        mine = np.flatnonzero(relids == relid)
        rows = _relation_rows(
            buf, relation, at[mine], kind[mine], where[mine], ends[mine], has_old[mine]
        )
        found.append(rows if subxids is None else dataclasses.replace(rows, subxid=subxids[mine]))
    return found


def _relation_rows(
    buf: np.ndarray,
    relation: Relation,
    at: np.ndarray,
    kind: np.ndarray,
    where: np.ndarray,
    ends: np.ndarray,
    has_old: np.ndarray,
) -> RowChanges:
    width, count = len(relation.columns), len(at)
    old_cols = _absent(width, count)
    new_cols = _absent(width, count)
    where = where.copy()  # (each tuple's end replaces its start)
    if has_old.any():
        pick = np.flatnonzero(has_old)
        cols, after = _tuples(buf, relation, where[pick], ends[pick])
        _scatter(old_cols, cols, pick)
        where[pick] = after
        follows = kind[pick] == _U  # an update's new tuple follows its old one
        if np.any(buf[np.minimum(after[follows], len(buf) - 1)] != _N) or np.any(
            after[follows] >= ends[pick][follows]
        ):
            raise DecodeError("update: expected the new tuple after the old one ('N')")
        where[pick[follows]] += 1
    has_new = kind != _D
    pick = np.flatnonzero(has_new)
    if len(pick):
        cols, after = _tuples(buf, relation, where[pick], ends[pick])
        _scatter(new_cols, cols, pick)
        where[pick] = after
    if np.any(where != ends):
        raise DecodeError(f"a change of {relation.name} with bytes past its tuple")
    names = [c.name for c in relation.columns]
    unchanged = {
        name: kinds == _TOASTED
        for name, (kinds, _, _) in zip(names, new_cols, strict=True)
        if np.any(kinds == _TOASTED)
    }
    return RowChanges(
        relation,
        at,
        kind,
        _texts(buf, names, old_cols),
        has_old,
        _texts(buf, names, new_cols),
        has_new,
        unchanged,
    )


_Columns = list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # per column: kinds, starts, lengths


def _absent(width: int, count: int) -> _Columns:
    return [
        (np.full(count, _NULL, np.uint8), np.zeros(count, np.int64), np.zeros(count, np.int64))
        for _ in range(width)
    ]


def _scatter(into: _Columns, cols: _Columns, rows: np.ndarray) -> None:
    for (kinds, starts, lengths), (k, s, n) in zip(into, cols, strict=True):
        kinds[rows], starts[rows], lengths[rows] = k, s, n


def _int32(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The big-endian unsigned 32-bit integers at ``at`` (room checked by the caller)."""
    return (
        (buf[at].astype(np.int64) << 24)
        | (buf[at + 1].astype(np.int64) << 16)
        | (buf[at + 2].astype(np.int64) << 8)
        | buf[at + 3].astype(np.int64)
    )


def _tuples(
    buf: np.ndarray, relation: Relation, where: np.ndarray, ends: np.ndarray
) -> tuple[_Columns, np.ndarray]:
    """TupleData at ``where`` in each message (ending at ``ends``): each column's kinds,
    starts and lengths, and where each tuple ends."""
    width = len(relation.columns)
    _room(where + 2, ends)
    count = (buf[where].astype(np.int64) << 8) | buf[where + 1]
    if np.any(count != width):
        raise DecodeError(
            f"a tuple of {int(count[count != width][0])} columns, but {relation.name} has {width}"
        )
    where = where + 2
    cols: _Columns = []
    for _ in range(width):
        _room(where + 1, ends)
        kinds = buf[where]
        text = kinds == _TEXT
        if not np.all(text | (kinds == _NULL) | (kinds == _TOASTED)):
            odd = chr(kinds[~(text | (kinds == _NULL) | (kinds == _TOASTED))][0])
            raise DecodeError(f"unknown column kind {odd!r} (binary values need proto 2)")
        starts = where + 1
        lengths = np.zeros(len(where), np.int64)
        if text.any():
            _room(starts[text] + 4, ends[text])
            lengths[text] = _int32(buf, starts[text])
            if np.any(lengths >= 1 << 31):
                raise DecodeError("a value of a negative length")
            starts = starts + 4 * text
        where = starts + lengths
        _room(where, ends)
        cols.append((kinds, starts, lengths))
    return cols, where


def _room(needed: np.ndarray, ends: np.ndarray) -> None:
    if np.any(needed > ends):
        raise DecodeError("message ends early")


def _texts(buf: np.ndarray, names: list[str], cols: _Columns) -> pa.Table:
    """The columns' values as Arrow text (null where not a text value), checked as UTF-8."""
    arrays = []
    for kinds, starts, sent in cols:
        valid = kinds == _TEXT
        lengths = np.where(valid, sent, 0)
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        if total and total > _WIDE * len(lengths):  # a few wide values: cut out one by one
            cut = zip(starts[valid].tolist(), lengths[valid].tolist(), strict=True)
            data = b"".join(buf[s : s + n].tobytes() for s, n in cut)
        elif total:
            data = buf[np.repeat(starts - offsets[:-1], lengths) + np.arange(total)].tobytes()
        else:
            data = b""
        validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
        buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
        array = pa.Array.from_buffers(pa.large_string(), len(lengths), buffers)
        try:
            array.validate(full=True)
        except pa.ArrowInvalid as exc:
            raise DecodeError(f"a value that is not UTF-8 text ({exc})") from None
        arrays.append(array)
    return pa.table(arrays, names=names)


@dataclass
class Transaction:
    """One backend transaction's row changes, in order: the Insert, Update and Delete messages
    as the backend sent them, decoded at once (`rows`) when the transaction is applied. Those
    in memory (``messages``) come after the pieces spilled to ``spill``, decoded as they were
    spilled (`pieces` gives them all, each a transaction of its own: a piece read back has
    its changes in ``ready``)."""

    xid: int
    commit_lsn: int = 0
    end_lsn: int = 0
    commit_time: dt.datetime = PG_EPOCH
    messages: list[bytes] = field(default_factory=list)
    # the relation descriptions in effect from each of ``messages`` on (a description sent
    # in the middle of the transaction starts a new one)
    described: list[tuple[int, Mapping[int, Relation]]] = field(default_factory=list)
    # relations truncated, each after how many of ``messages`` (the order matters: a TRUNCATE
    # and the rows inserted after it in one transaction)
    truncated: list[tuple[int, Relation]] = field(default_factory=list)
    spill: Path | None = None  # its spilled pieces, in order
    spilled: int = 0  # changes in them
    # sent while in progress (protocol 2 streaming): each message carries its subtransaction's
    # xid; the subtransaction of each TRUNCATE in memory, and the aborted ones
    streamed: bool = False
    truncated_by: list[int] = field(default_factory=list)
    aborted: set[int] = field(default_factory=set)
    ready: tuple[int, list[RowChanges]] | None = None  # a piece read back: its count and rows

    @property
    def size(self) -> int:
        """Its changes, spilled or not."""
        return self.spilled + self.count

    @property
    def count(self) -> int:
        """Its changes in memory (a piece read back: its changes)."""
        return self.ready[0] if self.ready is not None else len(self.messages)

    def describe(self, relations: Mapping[int, Relation]) -> None:
        """The descriptions in effect from its next message on."""
        if self.described and self.described[-1][0] == len(self.messages):
            self.described[-1] = (len(self.messages), relations)
        else:
            self.described.append((len(self.messages), relations))

    def spill_out(self, directory: Path) -> None:
        """Write the changes in memory as the next piece (they leave memory)."""
        if self.spill is None:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.spill = directory / f"xid-{self.xid}-{next(_SPILLS)}.pieces"
        # decoded now: while the backend still sends the transaction, not after its commit
        piece = (len(self.messages), self._decode(), self.truncated, self.truncated_by)
        with open(self.spill, "ab") as out:
            pickle.dump(piece, out, protocol=pickle.HIGHEST_PROTOCOL)
        self.spilled += len(self.messages)
        self.described = [(0, self.described[-1][1])] if self.described else []
        self.messages, self.truncated, self.truncated_by = [], [], []

    def pieces(self) -> Iterator[Transaction]:
        """Its changes as transactions of at most a piece each (the same xid and commit), in
        order."""
        if self.spill is not None:
            with open(self.spill, "rb") as source:
                while True:
                    try:
                        count, rows, truncated, truncated_by = pickle.load(source)
                    except EOFError:
                        break
                    yield self._piece([], [], truncated, truncated_by, (count, rows))
        yield self._piece(self.messages, self.described, self.truncated, self.truncated_by)

    def _piece(
        self,
        messages: list[bytes],
        described: list[tuple[int, Mapping[int, Relation]]],
        truncated: list[tuple[int, Relation]],
        truncated_by: list[int],
        ready: tuple[int, list[RowChanges]] | None = None,
    ) -> Transaction:
        return Transaction(
            self.xid,
            self.commit_lsn,
            self.end_lsn,
            self.commit_time,
            messages,
            described,
            truncated,
            streamed=self.streamed,
            truncated_by=truncated_by,
            aborted=self.aborted,
            ready=ready,
        )

    def truncates(self) -> list[tuple[int, Relation]]:
        """Its TRUNCATEs in memory, each after how many of ``messages`` (an aborted
        subtransaction's left out)."""
        if not self.aborted or not self.streamed:
            return self.truncated
        return [
            cut
            for cut, by in zip(self.truncated, self.truncated_by, strict=True)
            if by not in self.aborted
        ]

    def rows(self) -> list[RowChanges]:
        """Its row changes in memory, decoded at once, one `RowChanges` per relation (and per
        description of it), an aborted subtransaction's left out."""
        found = self.ready[1] if self.ready is not None else self._decode()
        if not self.aborted:
            return found
        aborted = np.array(sorted(self.aborted), np.int64)
        kept = [r.where(~np.isin(r.subxid, aborted)) if r.subxid is not None else r for r in found]
        return [r for r in kept if len(r.at)]

    def _decode(self) -> list[RowChanges]:
        found: list[RowChanges] = []
        bounds = [at for at, _ in self.described[1:]] + [len(self.messages)]
        for (start, relations), end in zip(self.described, bounds, strict=True):
            if end > start:
                found += decode_rows(self.messages[start:end], relations, self.streamed, start)
        if not self.described and self.messages:
            raise DecodeError("changes without the descriptions of their relations")
        return found

    def decoded(self) -> list[tuple[Relation, Change]]:
        """Its changes in memory one by one, in order (`rows` as plain values)."""
        found: list[tuple[int, Relation, Change]] = []
        for rows in self.rows():
            found += zip(
                rows.at.tolist(), itertools.repeat(rows.relation), rows.changes(), strict=False
            )
        return [(relation, change) for _, relation, change in sorted(found, key=lambda f: f[0])]

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


@dataclass
class Transactions:
    """Groups decoded messages into whole transactions (relations remembered across them);
    with ``spill_dir``, a transaction's changes past ``spill_changes`` are spilled there."""

    # the relations described so far (replaced, never changed in place: transactions hold
    # the descriptions in effect for their changes)
    relations: Mapping[int, Relation] = field(default_factory=dict)
    unfinished: Transaction | None = None  # begun, its commit not read yet
    spill_dir: Path | None = None
    spill_changes: int = SPILL_CHANGES
    streamed: dict[int, Transaction] = field(default_factory=dict)  # in progress, by xid
    streaming: Transaction | None = None  # the transaction of the stream block being read
    blocks: int = 0  # stream blocks read (the backend streamed transactions in progress)

    def __post_init__(self) -> None:
        # changes a transaction holds in memory before a piece is spilled (without a
        # directory to spill to: all of them)
        self._limit = self.spill_changes if self.spill_dir is not None else 1 << 62

    def read(self, messages: Sequence[bytes]) -> Iterator[Transaction]:
        """The transactions ``messages`` complete (a batch ending mid-transaction: the next
        read goes on with it). Row changes are kept as sent, a run of them at a time
        (`Transaction.rows` decodes them); the rest is decoded here."""
        current, self.unfinished = self.unfinished, None
        if not all(messages):
            raise DecodeError("an empty message")
        tags = bytes(map(_FIRST_BYTE, messages))
        at = 0
        for stop in [*(found.start() for found in _NOT_ROW.finditer(tags)), len(messages)]:
            if stop > at:  # a run of row changes (the hot path: one message per row changed)
                txn = self.streaming if self.streaming is not None else current
                if txn is None:
                    raise DecodeError("a change outside a transaction")
                self._keep(txn, messages, at, stop)
            if stop == len(messages):
                break
            data, at = messages[stop], stop + 1
            tag = tags[stop]
            if tag == 0x42 and len(data) == 1 + _BEGIN.size:
                current = Transaction(_BEGIN.unpack_from(data, 1)[2])
                current.describe(self.relations)
                continue
            if tag == 0x43 and current is not None and len(data) == 1 + _COMMIT.size:
                _, current.commit_lsn, current.end_lsn, micros = _COMMIT.unpack_from(data, 1)
                current.commit_time = PG_EPOCH + dt.timedelta(microseconds=micros)
                yield current
                current = None
                continue
            if self.streaming is not None or tag in (0x53, 0x63, 0x41):  # S, c, A: streamed
                finished = self._streamed(data)
                if finished is not None:
                    yield finished
                continue
            message = decode(data)
            if isinstance(message, Relation):
                going = [current] if current is not None else []
                self._described(message, going + list(self.streamed.values()))
            elif isinstance(message, Begin):
                current = Transaction(message.xid)
                current.describe(self.relations)
            elif isinstance(message, Commit):
                if current is None:
                    raise DecodeError("a commit without its begin")
                current.commit_lsn, current.end_lsn = message.commit_lsn, message.end_lsn
                current.commit_time = message.commit_time
                yield current
                current = None
            elif isinstance(message, Truncate):
                if current is None:
                    raise DecodeError("a change outside a transaction")
                self._truncate(current, message, None)
        self.unfinished = current

    def _keep(self, txn: Transaction, messages: Sequence[bytes], start: int, stop: int) -> None:
        """Row changes ``messages[start:stop]`` kept by ``txn``, pieces spilled as it fills."""
        while start < stop:
            end = min(stop, start + self._limit - len(txn.messages))
            txn.messages += messages[start:end]
            start = end
            if len(txn.messages) >= self._limit:
                txn.spill_out(t.cast(Path, self.spill_dir))

    def _streamed(self, data: bytes) -> Transaction | None:
        """A message of protocol 2's streaming: the transaction a Stream Commit completes."""
        tag = chr(data[0])
        if tag == "S":
            xid, _ = _take(_STREAM_START, data, "stream start")
            self.blocks += 1
            if xid not in self.streamed:
                self.streamed[xid] = Transaction(xid, streamed=True)
                self.streamed[xid].describe(self.relations)
            self.streaming = self.streamed[xid]
            return None
        if tag == "E":
            self.streaming = None
            return None
        if tag == "c":
            xid, _, commit_lsn, end_lsn, micros = _take(_STREAM_COMMIT, data, "stream commit")
            found = self.streamed.pop(xid, None)
            txn = found if found is not None else Transaction(xid, streamed=True)
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
        (subxid,) = _RELID.unpack_from(data, 1)
        message = decode(data[:1] + data[5:])  # (the same message less its xid)
        if isinstance(message, Relation):
            self._described(message, list(self.streamed.values()))
        elif isinstance(message, Truncate):
            self._truncate(self.streaming, message, subxid)
        return None

    def _described(self, relation: Relation, going: list[Transaction]) -> None:
        """A relation's description: in effect for the changes after it (of the transactions
        ``going`` too, and any unfinished)."""
        self.relations = {**self.relations, relation.relid: relation}
        for txn in going:
            txn.describe(self.relations)

    def _truncate(self, txn: Transaction, message: Truncate, subxid: int | None) -> None:
        at = len(txn.messages)
        txn.truncated += [(at, self._relation(r)) for r in message.relids]
        if txn.streamed:
            txn.truncated_by += [subxid if subxid is not None else txn.xid] * len(message.relids)

    @property
    def in_progress(self) -> bool:
        """A transaction has begun whose commit or abort has not been read."""
        return self.unfinished is not None or bool(self.streamed)

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
