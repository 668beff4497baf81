"""Row changes decoded at once (cache/backend/pgoutput/rows.decode_rows, Transaction.rows) against
the message-by-message decoder (`decode`), on pgoutput messages built here: inserts, updates
with and without their old key or row, deletes, NULLs, TOASTed values not sent, quotes,
newlines and any text; streamed ones with their subtransactions, aborted ones left out; and
malformed ones, which are a DecodeError and nothing else."""

from __future__ import annotations

import struct
import typing as t

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.backend.pgoutput.messages import UNCHANGED, Change, Column, DecodeError, Relation, decode
from cache.backend.pgoutput.rows import decode_rows
from cache.backend.pgoutput.transactions import Transaction, Transactions, rows_of_run

RELATIONS = {
    relid: Relation(
        relid, "public", f"t{relid}", "d", tuple(Column(f"c{i}", 25, i == 0) for i in range(width))
    )
    for relid, width in ((7, 1), (8, 3), (9, 5))
}

texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=30)
values = st.one_of(st.none(), texts, st.sampled_from(['"', '""', "a,b", "x\ny", "", " "]))


Row = tuple[t.Any, ...]


def tuple_bytes(row: tuple[t.Any, ...]) -> bytes:
    out = [struct.pack("!h", len(row))]
    for value in row:
        if value is None:
            out.append(b"n")
        elif value is UNCHANGED:
            out.append(b"u")
        else:
            data = value.encode()
            out.append(b"t" + struct.pack("!i", len(data)) + data)
    return b"".join(out)


def message(change: tuple[str, int, str, Row | None, Row | None], subxid: int | None) -> bytes:
    kind, relid, marker, old, new = change
    head = kind.encode() + (struct.pack("!I", subxid) if subxid is not None else b"")
    head += struct.pack("!I", relid)
    if kind == "I":
        return head + b"N" + tuple_bytes(t.cast(tuple, new))
    if kind == "D":
        return head + marker.encode() + tuple_bytes(t.cast(tuple, old))
    if old is not None:
        return head + marker.encode() + tuple_bytes(old) + b"N" + tuple_bytes(t.cast(tuple, new))
    return head + b"N" + tuple_bytes(t.cast(tuple, new))


@st.composite
def changes(draw: st.DrawFn) -> tuple[str, int, str, Row | None, Row | None]:
    relid = draw(st.sampled_from(sorted(RELATIONS)))
    width = len(RELATIONS[relid].columns)
    row = st.tuples(*[values] * width)
    kind = draw(st.sampled_from("IUD"))
    marker = draw(st.sampled_from("KO"))
    if kind == "I":
        return kind, relid, "N", None, draw(row)
    if kind == "D":
        return kind, relid, marker, draw(row), None
    new = draw(st.tuples(*[st.one_of(values, st.just(UNCHANGED))] * width))
    return kind, relid, marker, draw(st.one_of(st.none(), row)), new


def reference(data: bytes, streamed: bool) -> Change:
    found = decode(data[:1] + data[5:] if streamed else data)
    assert isinstance(found, Change)
    return found


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(changes(), st.sampled_from([100, 101, 102])), max_size=40),
    st.booleans(),
    st.sets(st.sampled_from([101, 102])),
)
def test_decoded_at_once_as_one_by_one(
    found: list[t.Any], streamed: bool, aborted: set[int]
) -> None:
    messages = [message(change, subxid if streamed else None) for change, subxid in found]
    decoded = decode_rows(messages, RELATIONS, streamed)
    rows = Transaction(
        1,
        messages=messages,
        described=[(0, RELATIONS)],
        streamed=streamed,
        aborted=aborted if streamed else set(),
    ).rows()
    assert [r.relation.relid for r in decoded] == list(dict.fromkeys(c[1] for c, _ in found))
    got = sorted(
        (at, change) for r in rows for at, change in zip(r.at.tolist(), r.changes(), strict=True)
    )
    kept = [
        (i, reference(m, streamed))
        for i, (m, (_, subxid)) in enumerate(zip(messages, found, strict=True))
        if not streamed or subxid not in aborted
    ]
    assert got == kept
    assert all(len(r.at) for r in rows)
    assert {r.relation.relid for r in rows} == {c.relid for _, c in kept}  # none empty


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(changes(), max_size=6),
            st.sampled_from(["first", "again", "mid"]),
            st.booleans(),
        ),
        max_size=8,
    )
)
def test_a_run_of_transactions_decodes_as_each_one_does(
    drawn: list[tuple[list[t.Any], str, bool]],
) -> None:
    """A run decoded at once (its transactions in memory under one description joined) has
    each transaction's changes at their place in the run: under the first description, one
    described again (a new mapping), one described mid-transaction, aborted subtransactions
    left out of streamed ones."""
    again = dict(RELATIONS)
    txns = []
    for found, described, streamed in drawn:
        messages = [message(change, 101 if streamed else None) for change in found]
        where = [(0, RELATIONS)] if described == "first" else [(0, again)]
        if described == "mid" and len(messages) > 1:
            where.append((1, RELATIONS))
        txns.append(
            Transaction(
                1,
                messages=messages,
                described=where,
                streamed=streamed,
                aborted={101} if streamed and len(messages) % 2 else set(),
            )
        )
    want = []
    base = 0
    for txn in txns:
        want += [
            (base + at, r.relation.relid, change)
            for r in txn.rows()
            for at, change in zip(r.at.tolist(), r.changes(), strict=True)
        ]
        base += txn.count
    got = [
        (at, r.relation.relid, change)
        for r in rows_of_run(txns)
        for at, change in zip(r.at.tolist(), r.changes(), strict=True)
    ]
    assert sorted(got, key=lambda g: g[0]) == sorted(want, key=lambda g: g[0])


@settings(max_examples=300, deadline=None)
@given(changes(), st.booleans(), st.data())
def test_a_malformed_change_is_a_decode_error(
    change: t.Any, streamed: bool, data: st.DataObject
) -> None:
    """Cut short, lengthened, or a byte changed: a DecodeError, or (the change still well
    formed) what the one-by-one decoder reads."""
    whole = message(change, 100 if streamed else None)
    how = data.draw(st.sampled_from(["cut", "longer", "byte"]))
    if how == "cut":
        broken = whole[: data.draw(st.integers(0, len(whole) - 1))]
    elif how == "longer":
        broken = whole + data.draw(st.binary(min_size=1, max_size=4))
    else:
        at = data.draw(st.integers(0, len(whole) - 1))
        broken = whole[:at] + bytes([data.draw(st.integers(0, 255))]) + whole[at + 1 :]
    try:
        rows = decode_rows([broken], RELATIONS, streamed)
    except DecodeError:
        return
    assert [c for r in rows for c in r.changes()] == [reference(broken, streamed)]


BEGIN = b"B" + bytes(8) + bytes(8) + struct.pack("!I", 100)
COMMIT = b"C" + bytes(1 + 8 + 8 + 8)
RELATION_MESSAGE = (
    b"R"
    + struct.pack("!I", 8)
    + b"public\0t8\0d"
    + struct.pack("!h", 3)
    + b"".join(
        b"\x01" * (i == 0)
        + b"\x00" * (i != 0)
        + f"c{i}".encode()
        + b"\0"
        + struct.pack("!Ii", 25, -1)
        for i in range(3)
    )
)


def test_transactions_keep_row_changes_as_sent_and_spill_them_in_pieces(tmp_path: t.Any) -> None:
    """Runs of row changes kept whole between the other messages, a piece spilled whenever
    the transaction holds ``spill_changes``; the pieces decode, in order, to what the
    one-by-one decoder reads."""
    rows = [("I", 8, "N", None, (str(i), f"v{i}", None)) for i in range(7)]
    rows.append(("U", 8, "K", ("3", None, None), ("30", "moved", UNCHANGED)))
    rows.append(("D", 8, "K", ("4", None, None), None))
    sent = [message(r, None) for r in rows]
    decoder = Transactions(spill_dir=tmp_path, spill_changes=4)
    assert list(decoder.read([RELATION_MESSAGE, BEGIN, *sent[:5]])) == []
    assert decoder.in_progress
    (txn,) = decoder.read([*sent[5:], COMMIT])
    assert txn.spill is not None and txn.size == 9 and len(txn.messages) == 1
    pieces = list(txn.pieces())
    assert [p.count for p in pieces] == [4, 4, 1]
    assert [c for p in pieces for _, c in p.decoded()] == [decode(m) for m in sent]
    txn.discard()
    assert not list(tmp_path.iterdir())


def test_a_message_of_nothing_or_a_change_outside_a_transaction_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="an empty message"):
        list(Transactions().read([RELATION_MESSAGE, b""]))
    with pytest.raises(DecodeError, match="outside a transaction"):
        list(
            Transactions().read(
                [RELATION_MESSAGE, message(("I", 8, "N", None, ("1", "", "")), None)]
            )
        )


def relation_message(relid: int, width: int) -> bytes:
    return (
        b"R"
        + struct.pack("!I", relid)
        + f"public\0t{relid}\0d".encode()
        + struct.pack("!h", width)
        + b"".join(
            bytes([i == 0]) + f"c{i}".encode() + b"\0" + struct.pack("!Ii", 25, -1)
            for i in range(width)
        )
    )


def test_a_relation_described_again_mid_transaction(tmp_path: t.Any) -> None:
    """A column added in the middle of a transaction: the changes before its new description
    decode with the old one, those after with the new, spilled or not."""
    before = [message(("I", 8, "N", None, (str(i), "a", "b")), None) for i in range(3)]
    after = [message(("I", 8, "N", None, (str(i), "a", "b", "c")), None) for i in range(3, 6)]
    for spill_changes in (2, 100):
        decoder = Transactions(spill_dir=tmp_path, spill_changes=spill_changes)
        (txn,) = decoder.read(
            [relation_message(8, 3), BEGIN, *before, relation_message(8, 4), *after, COMMIT]
        )
        decoded = [d for p in txn.pieces() for d in p.decoded()]
        assert [len(r.columns) for r, _ in decoded] == [3, 3, 3, 4, 4, 4]
        assert [c.new for _, c in decoded] == [
            *((str(i), "a", "b") for i in range(3)),
            *((str(i), "a", "b", "c") for i in range(3, 6)),
        ]
        txn.discard()
