"""Whole backend transactions from a stream of pgoutput messages (`Transactions`), in commit
order: each `Transaction` keeps its row changes as sent (decoded at once by `Transaction.rows`),
with the relation descriptions in effect for them; protocol 2's streamed transactions (Stream
Start/Stop/Commit/Abort, subtransactions aborted); changes past ``spill_changes`` spilled to
disk in pieces."""

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

from cache.backend.pgoutput.messages import (
    BEGIN_LAYOUT,
    COMMIT_LAYOUT,
    PG_EPOCH,
    RELID_LAYOUT,
    Begin,
    Change,
    Commit,
    DecodeError,
    Relation,
    Truncate,
    decode,
)
from cache.backend.pgoutput.rows import RowChanges, decode_rows

SPILL_CHANGES = 50_000  # changes of one transaction held in memory before a piece is spilled

_NOT_ROW = re.compile(rb"[^IUD]")  # a message's tag that is not a row change's
_FIRST_BYTE = operator.itemgetter(0)


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


def rows_of_run(txns: Sequence[Transaction]) -> list[RowChanges]:
    """The row changes of transactions applied together, ``at`` counting from the first
    one's first change: consecutive transactions in memory under one description of their
    relations decoded at once (decoding costs about a millisecond a call whatever its size,
    and a run of single-row transactions would pay it for each)."""
    found: list[RowChanges] = []
    group: list[Transaction] = []
    base = start = 0

    def flush() -> None:
        if group:
            messages = [m for txn in group for m in txn.messages]
            relations = group[0].described[0][1]
            found.extend(decode_rows(messages, relations, group[0].streamed, start))
            group.clear()

    for txn in txns:
        whole = (
            txn.ready is None
            and not txn.aborted
            and len(txn.described) == 1
            and txn.described[0][0] == 0
        )
        if (
            whole
            and group
            and (
                txn.described[0][1] is not group[0].described[0][1]
                or txn.streamed != group[0].streamed
            )
        ):
            flush()
        if whole:
            if not group:
                start = base
            group.append(txn)
        else:
            flush()
            found += [dataclasses.replace(r, at=r.at + base) for r in txn.rows()]
        base += txn.count
    flush()
    return found


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
            if tag == 0x42 and len(data) == 1 + BEGIN_LAYOUT.size:
                current = Transaction(BEGIN_LAYOUT.unpack_from(data, 1)[2])
                current.describe(self.relations)
                continue
            if tag == 0x43 and current is not None and len(data) == 1 + COMMIT_LAYOUT.size:
                _, current.commit_lsn, current.end_lsn, micros = COMMIT_LAYOUT.unpack_from(data, 1)
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
        (subxid,) = RELID_LAYOUT.unpack_from(data, 1)
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
