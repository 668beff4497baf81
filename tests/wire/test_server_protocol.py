"""The server's protocol codec, fed bytes: whole, split at every byte, and malformed. No
database needed."""

from __future__ import annotations

import struct

import pytest

from cache.wire import protocol
from cache.wire.protocol import FrontendReader, ProtocolViolation


def _startup(**parameters: str) -> bytes:
    body = (
        struct.pack("!i", protocol.PROTOCOL_3_0)
        + b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in parameters.items())
        + b"\0"
    )
    return struct.pack("!i", len(body) + 4) + body


def _bind() -> bytes:
    body = (
        b"portal\0stmt\0"
        + struct.pack("!hh", 1, 1)
        + struct.pack("!h", 2)
        + struct.pack("!i", 4)
        + b"\0\0\0\x07"
        + struct.pack("!i", -1)
        + struct.pack("!hh", 1, 0)
    )
    return protocol.message(b"B", body)


MESSAGES = (
    protocol.message(b"Q", b"SELECT 1\0")
    + protocol.message(b"P", b"s1\0SELECT $1\0" + struct.pack("!hI", 1, 23))
    + _bind()
    + protocol.message(b"D", b"Pportal\0")
    + protocol.message(b"E", b"portal\0" + struct.pack("!i", 10))
    + protocol.message(b"C", b"Ss1\0")
    + protocol.message(b"H")
    + protocol.message(b"S")
    + protocol.message(b"d", b"raw copy bytes")
    + protocol.message(b"c")
    + protocol.message(b"f", b"no more\0")
    + protocol.message(b"X")
)

EXPECTED = [
    protocol.Query(b"SELECT 1"),
    protocol.Parse(b"s1", b"SELECT $1", (23,)),
    protocol.Bind(b"portal", b"stmt", (1,), (b"\0\0\0\x07", None), (0,)),
    protocol.Describe(b"P", b"portal"),
    protocol.Execute(b"portal", 10),
    protocol.Close(b"S", b"s1"),
    protocol.Flush(),
    protocol.Sync(),
    protocol.CopyData(b"raw copy bytes"),
    protocol.CopyDone(),
    protocol.CopyFail(b"no more"),
    protocol.Terminate(),
]


def _read_all(reader: FrontendReader) -> list[protocol.Message]:
    found = []
    while (message := reader.next_message()) is not None:
        found.append(message)
    return found


def test_startup_then_every_message_type() -> None:
    reader = FrontendReader()
    reader.feed(_startup(user="alice", database="shop", options="-c mtcache.x=1") + MESSAGES)
    startup = reader.next_startup()
    assert startup == protocol.Startup(
        protocol.PROTOCOL_3_0, {"user": "alice", "database": "shop", "options": "-c mtcache.x=1"}
    )
    assert _read_all(reader) == EXPECTED
    assert reader.pending == 0


def test_messages_split_at_every_byte() -> None:
    reader = FrontendReader()
    found: list[protocol.Message] = []
    for i in range(len(MESSAGES)):
        reader.feed(MESSAGES[i : i + 1])
        found += _read_all(reader)
    assert found == EXPECTED


def test_a_run_of_a_prepared_statement_is_recognized_whole() -> None:
    """Bind, Describe of its portal (or not), Execute of every row, Sync: recognized when the
    bytes are exactly that; anything else (another portal, a row limit, a message more or
    less, a malformed Bind, a partial message) is left to the message-by-message reader."""
    bind = _bind()
    parsed = protocol.Bind(b"portal", b"stmt", (1,), (b"\0\0\0\x07", None), (0,))
    describe = protocol.message(b"D", b"Pportal\0")
    execute = protocol.message(b"E", b"portal\0" + struct.pack("!i", 0))
    sync = protocol.message(b"S")
    assert protocol.execution(bind + execute + sync) == (parsed, False)
    assert protocol.execution(bind + describe + execute + sync) == (parsed, True)
    unnamed = protocol.message(b"B", b"\0stmt\0\0\0\0\0\0\0")
    assert protocol.execution(
        unnamed + protocol.message(b"D", b"P\0") + protocol.message(b"E", b"\0\0\0\0\0") + sync
    ) == (protocol.Bind(b"", b"stmt", (), (), ()), True)
    for other in (
        bind + protocol.message(b"E", b"other\0" + struct.pack("!i", 0)) + sync,
        bind + protocol.message(b"E", b"portal\0" + struct.pack("!i", 10)) + sync,
        bind + protocol.message(b"D", b"Sstmt\0") + execute + sync,
        bind + execute,
        bind + execute + sync + sync,
        bind + execute + sync[:-1],
        bind[:-3] + execute + sync,
        protocol.message(b"B", b"portal\0stmt\0" + struct.pack("!hh", 1, 7)) + execute + sync,
        protocol.message(b"H") + bind + execute + sync,
        b"B\0\0",
        b"",
    ):
        assert protocol.execution(other) is None, other


def test_ssl_gssenc_and_cancel_requests() -> None:
    reader = FrontendReader()
    reader.feed(
        struct.pack("!ii", 8, protocol.SSL_REQUEST)
        + struct.pack("!ii", 8, protocol.GSSENC_REQUEST)
        + struct.pack("!iii", 16, protocol.CANCEL_REQUEST, 42)
        + b"KEY!"
    )
    assert reader.next_startup() == protocol.SSLRequest()
    assert reader.next_startup() == protocol.GSSENCRequest()
    assert reader.next_startup() == protocol.CancelRequest(42, b"KEY!")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (protocol.message(b"Y"), "invalid frontend message type"),
        (b"Q" + struct.pack("!i", 2), "invalid message length"),
        (b"Q" + struct.pack("!i", -5), "invalid message length"),
        (protocol.message(b"Q", b"no terminator"), "no terminator"),
        (protocol.message(b"E", b"portal\0\0"), "insufficient data"),
        (protocol.message(b"S", b"extra"), "left over"),
        (protocol.message(b"D", b"Xname\0"), "subtype"),
        (
            protocol.message(b"B", b"\0\0" + struct.pack("!hh", 1, 7) + b"\0\0\0\0"),
            "unsupported format code",
        ),
        (
            protocol.message(b"B", b"\0\0\0\0" + struct.pack("!hi", 1, -2) + b"\0\0"),
            "invalid parameter length",
        ),
        (
            protocol.message(
                b"B",
                b"\0\0"
                + struct.pack("!hhh", 2, 0, 0)
                + struct.pack("!h", 1)
                + struct.pack("!i", -1)
                + b"\0\0",
            ),
            "parameter formats",
        ),
    ],
    ids=[
        "unknown",
        "short-length",
        "negative-length",
        "unterminated",
        "truncated",
        "left-over",
        "describe-kind",
        "format-code",
        "param-length",
        "format-count",
    ],
)
def test_malformed_messages_are_protocol_violations(data: bytes, says: str) -> None:
    reader = FrontendReader()
    reader.feed(data)
    with pytest.raises(ProtocolViolation, match=says):
        reader.next_message()


@pytest.mark.parametrize(
    "packet",
    [
        struct.pack("!i", 4),  # too short
        struct.pack("!i", 20_000) + b"\0" * 16,  # too long
        struct.pack("!ii", 8, 2 << 16),  # protocol 2
        struct.pack("!iii", 12, protocol.PROTOCOL_3_0, 0x41414141),  # an unterminated name
    ],
    ids=["short", "long", "version-2", "unterminated"],
)
def test_malformed_startup_packets(packet: bytes) -> None:
    reader = FrontendReader()
    reader.feed(packet)
    with pytest.raises(ProtocolViolation):
        reader.next_startup()


def test_backend_messages_encode_as_postgres_frames_them() -> None:
    assert protocol.ready_for_query(b"I") == b"Z\0\0\0\x05I"
    assert protocol.command_complete("SELECT 1") == b"C\0\0\0\x0dSELECT 1\0"
    assert protocol.data_row([b"7", None]) == (
        b"D\0\0\0\x0f\0\x02" + b"\0\0\0\x017" + b"\xff\xff\xff\xff"
    )
    row = protocol.row_description([protocol.Field(b"a", 16384, 1, 23, 4, -1, 0)])
    assert row == b"T" + struct.pack("!ih", 4 + 2 + 2 + 18, 1) + b"a\0" + struct.pack(
        "!IhIhih", 16384, 1, 23, 4, -1, 0
    )
    body = b"SERROR\0VERROR\0C42601\0Mbad\0P3\0\0"
    assert (
        protocol.error_response("42601", "bad", position=3)
        == b"E" + struct.pack("!i", len(body) + 4) + body
    )


def _run(value: bytes | None, statement: bytes = b"s") -> bytes:
    """A run of a one-parameter prepared statement, as psycopg sends it."""
    length = -1 if value is None else len(value)
    bind = (
        b"\0"
        + statement
        + b"\0"
        + struct.pack("!hhhi", 1, 0, 1, length)
        + (value or b"")
        + struct.pack("!hh", 1, 1)
    )
    return (
        protocol.message(b"B", bind)
        + protocol.message(b"D", b"P\0")
        + protocol.message(b"E", b"\0\0\0\0\0")
        + protocol.message(b"S")
    )


@pytest.mark.parametrize("value", [b"42", b"", b"a longer value \0 with a zero", None])
def test_a_run_shapes_one_value_is_what_its_values_are(value: bytes | None) -> None:
    """`RunShape.value`, the one-parameter lane's reading, and `fits`, the raw lane's, agree
    with `values` on a run and on every malformed or other run (then None and False; a NULL
    is None for `value`)."""
    found = protocol.execution(_run(b"7"))
    assert found is not None
    shape = protocol.run_shape(*found)
    data = _run(value)
    assert shape.values(data) == [value]
    assert shape.value(data) == value
    assert shape.fits(data)
    others = [data[:cut] for cut in range(len(data))] + [data + b"S\0\0\0\x04", _run(value, b"t")]
    longer = bytearray(data)
    longer[4] += 1  # (the Bind's length one more than it is)
    shorter = bytearray(data)
    struct.pack_into("!i", shorter, 5 + len(shape.head), 0 if value else 1)  # a value's length
    for other in [*others, bytes(longer), bytes(shorter)]:
        assert shape.values(other) is None
        assert shape.value(other) is None
        assert not shape.fits(other)
