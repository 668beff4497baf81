"""Property-based fuzzing of the server's protocol codec and of a live server: valid messages
mutated (truncated, lengths and type bytes changed, bytes flipped, oversized), and arbitrary
bytes. The codec reads a message or raises ProtocolViolation, never anything else; a live
session given such bytes gets an answer, an 08P01 ErrorResponse and a closed connection, or the
connection closed, never a crash: the server goes on answering another session all along."""

from __future__ import annotations

import socket
import struct
import typing as t
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cache.wire import protocol
from cache.wire.protocol import FrontendReader, ProtocolViolation
from tests.fuzzing import fuzz_settings
from tests.serving import Served, messages, raw_session, serving


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


# valid frontend messages, the material the mutations start from
VALID = [
    _message(b"Q", b"SELECT 1\0"),
    _message(b"P", b"s1\0SELECT $1::int\0\0\x01\0\0\0\x17"),
    _message(b"B", b"\0s1\0\0\x01\0\0\0\x01\0\0\0\x011\0\x01\0\0"),
    _message(b"D", b"Ps1\0"),
    _message(b"E", b"\0\0\0\0\0"),
    _message(b"C", b"Ss1\0"),
    _message(b"S", b""),
    _message(b"H", b""),
    _message(b"d", b"some copy data"),
    _message(b"c", b""),
    _message(b"f", b"failed\0"),
    _message(b"p", b"password\0"),
]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A run of messages, one of them (or the run) damaged."""
    run = b"".join(draw(st.lists(st.sampled_from(VALID), min_size=1, max_size=4)))
    how = draw(st.sampled_from(["truncate", "length", "type", "flip", "oversize", "append"]))
    data = bytearray(run)
    if how == "truncate":
        return bytes(data[: draw(st.integers(0, len(data) - 1))])
    if how == "length":
        value = draw(st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(0, 16)))
        data[1:5] = struct.pack("!i", value)
    elif how == "type":
        data[0] = draw(st.integers(0, 255))
    elif how == "flip":
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    elif how == "oversize":
        data[1:5] = struct.pack("!i", protocol.MAX_MESSAGE + 1)
    else:
        data += draw(st.binary(max_size=64))
    return bytes(data)


frontend_bytes = st.one_of(mutated(), st.binary(max_size=200))


def _drain(reader: FrontendReader) -> list[protocol.Message]:
    found = []
    while (message := reader.next_message()) is not None:
        found.append(message)
    return found


@fuzz_settings(300)
@given(frontend_bytes, st.integers(1, 16))
def test_the_codec_reads_a_message_or_says_the_protocol_is_broken(data: bytes, chunk: int) -> None:
    reader = FrontendReader()
    try:
        for at in range(0, len(data), chunk):  # (arriving in pieces)
            reader.feed(data[at : at + chunk])
            for message in _drain(reader):
                assert isinstance(message, t.get_args(protocol.Message))
    except ProtocolViolation as exc:
        assert str(exc)


@fuzz_settings(200)
@given(
    st.one_of(
        st.binary(max_size=64),
        st.binary(min_size=8, max_size=64).map(lambda b: struct.pack("!i", len(b) + 4) + b),
    )
)
def test_the_codec_reads_a_startup_packet_or_says_the_protocol_is_broken(data: bytes) -> None:
    reader = FrontendReader()
    reader.feed(data)
    try:
        packet = reader.next_startup()
    except ProtocolViolation as exc:
        assert str(exc)
    else:
        assert packet is None or isinstance(packet, t.get_args(protocol.StartupPacket))


# -- a live server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(bookstore_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(bookstore_dsn, tmp_path_factory.mktemp("fuzz") / "cache.duckdb", (1,)) as found:
        yield found


@pytest.fixture(scope="module")
def bystander(served: Served) -> Iterator[psycopg.Connection[t.Any]]:
    with psycopg.connect(served.dsn, autocommit=True) as conn:
        yield conn


@fuzz_settings(40)
@given(data=frontend_bytes)
def test_a_live_session_answers_or_closes_and_others_go_on(
    served: Served, bystander: psycopg.Connection[t.Any], data: bytes
) -> None:
    sock = raw_session(served)
    try:
        sock.sendall(data + _message(b"S", b""))  # (a Sync: whatever was whole is answered)
        sock.shutdown(socket.SHUT_WR)  # no more: the session ends once it has answered
        seen = list(messages(sock))
    except ConnectionResetError:
        seen = []
    finally:
        sock.close()
    for kind, body in seen:
        assert kind in b"123nsICZEDTtNAKSvdcGHW", kind
        if kind == b"E":
            fields = dict((f[:1], f[1:]) for f in body.split(b"\0") if f)
            assert fields[b"C"] != b"XX000", fields  # (never an internal error)
    assert bystander.execute("SELECT 1").fetchone() == (1,)
