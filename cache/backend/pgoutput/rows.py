"""A transaction's row changes decoded at once (`decode_rows`): numpy over the bytes of its
Insert, Update and Delete messages, into Arrow text columns per relation (`RowChanges`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from cache.backend.pgoutput.messages import UNCHANGED, Change, DecodeError, Relation

_I, _U, _D, _N, _K, _O = b"IUDNKO"
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
