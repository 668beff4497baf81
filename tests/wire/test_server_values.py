"""The server's encodings of local answers, against PostgreSQL's own bytes: for edge values of
every type the cache answers, the value psycopg loads from PostgreSQL, encoded by the server,
must be the bytes PostgreSQL sent, in text and in binary."""

from __future__ import annotations

import math
import random
import struct

import psycopg
import pytest
from psycopg import pq

from cache.wire import values
from tests.answers import typed

EDGES = {
    "bool": ["true", "false"],
    "int2": ["-32768", "0", "32767"],
    "int4": ["-2147483648", "7", "2147483647"],
    "int8": ["-9223372036854775808", "9223372036854775807"],
    "numeric": [
        "0",
        "-0.00",
        "1.50",
        "123456789012345678901234567890.123",
        "0.000001",
        "-1e-20",
        "1e20",
        "NaN",
        "Infinity",
        "-Infinity",
        "100",
        "9999.9999",
    ],
    "float8": [
        "0",
        "-0",
        "1",
        "1.5",
        "1e15",
        "1e14",
        "123456789012345.6",
        "1e-5",
        "0.0001",
        "1e300",
        "-2.2250738585072014e-308",
        "5e-324",
        "3.141592653589793",
        "NaN",
        "Infinity",
        "-Infinity",
        "0.1",
        "100",
        "12345678.9",
        # halfway between two doubles: PostgreSQL takes one digit more than repr
        "-6.5670570644285216e+16",
        "-5.5261576824590643e+17",
    ],
    "float4": [
        "0",
        "-0",
        "1",
        "3.14",
        "1e6",
        "999999",
        "123456",
        "1.2345679e+07",
        "1e-5",
        "3.4028235e+38",
        "1e-45",
        "NaN",
        "Infinity",
        "0.1",
        "33566752",
        "5.0816768e+07",
        "-2.7479839e+09",
    ],  # halfway, as for doubles
    "text": ["", "plain", "ünïcødé ✓", "tab\there", "new\nline", "back\\slash"],
    "varchar(5)": ["abc", ""],
    "char(4)": ["ab", "abcd"],
    "name": ["a_name"],
    '"char"': ["x"],
    "date": ["2024-02-29", "0001-01-01", "9999-12-31", "1999-01-08"],
    "time": ["00:00:00", "12:34:56.789", "23:59:59.999999", "01:02:03.100"],
    "timestamp": [
        "2024-01-02 03:04:05",
        "2024-01-02 03:04:05.5",
        "0001-01-01 00:00:00",
        "9999-12-31 23:59:59.999999",
        "2000-01-01 00:00:00.000001",
    ],
    "timestamptz": [
        "2024-01-02 03:04:05+00",
        "2024-06-30 23:59:59.25+02",
        "1850-01-02 03:04:05+00",
        "2000-01-01 00:00:00.000001+00",
    ],
    "bytea": ["\\x", "\\x00ff10"],
    "uuid": ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
    "oid": ["0", "4294967295"],
}

ZONES = ["UTC", "Asia/Kolkata", "Europe/Amsterdam", "America/St_Johns"]


def _postgres(conn: psycopg.Connection, sql: str, binary: bool) -> tuple[int, bytes, object]:
    """What PostgreSQL sends for one value (type OID and bytes), and what psycopg loads."""
    result = conn.pgconn.exec_params(sql.encode(), [], result_format=1 if binary else 0)
    assert result.status == pq.ExecStatus.TUPLES_OK, result.error_message
    cursor = conn.cursor(binary=binary)
    cursor.execute(sql)
    (loaded,) = cursor.fetchone() or (None,)
    return result.ftype(0), result.get_value(0, 0) or b"", loaded


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_every_encoder_writes_postgres_bytes(backend_dsn: str, binary: bool) -> None:
    with psycopg.connect(backend_dsn, autocommit=True) as conn:
        for zone in ZONES:
            conn.execute(f"SET TimeZone = '{zone}'")
            for type_name, literals in EDGES.items():
                if type_name != "timestamptz" and zone != "UTC":
                    continue
                for literal in literals:
                    sql = f"SELECT {psycopg.sql.quote(literal)}::{type_name}"
                    oid, sent, loaded = _postgres(conn, sql, binary)
                    assert values.encodable([oid]), type_name
                    (encode,) = values.encoders(
                        (oid,), (1 if binary else 0,), values.OutputSettings()
                    )
                    assert encode(loaded) == sent, (zone, sql, loaded)


# array_out quotes these text elements (empty, NULL read as text, delimiters, braces, quotes,
# backslashes, white space) and not the others
QUOTING = ["", "NULL", "null", "NULLs", "a,b", 'a"b', "{x}", " lead", "x y", "é\\", "v\x0bt"]


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_arrays_of_every_type_as_postgres_sends_them(backend_dsn: str, binary: bool) -> None:
    """An array of each type's edge values and a NULL (array_agg's output), and of text that
    array_out must quote."""
    with psycopg.connect(backend_dsn, autocommit=True) as conn:
        for zone in ZONES[:2]:
            conn.execute(f"SET TimeZone = '{zone}'")
            for type_name, literals in [*EDGES.items(), ("text", QUOTING)]:
                items = [f"{psycopg.sql.quote(v)}::{type_name}" for v in literals]
                for sql in (
                    f"SELECT ARRAY[{', '.join([*items, 'NULL'])}]",
                    f"SELECT ARRAY[{items[0]}]",
                    f"SELECT ARRAY[]::{type_name}[]",
                ):
                    oid, sent, loaded = _postgres(conn, sql, binary)
                    assert values.encodable([oid]), type_name
                    (encode,) = values.encoders(
                        (oid,), (1 if binary else 0,), values.OutputSettings()
                    )
                    assert encode(loaded) == sent, (zone, sql, loaded)


def _trail_bytes(codec: str) -> list[str]:
    """The first characters whose bytes in ``codec`` hold a backslash or a brace."""
    found = []
    for character in map(chr, range(0x4E00, 0x9FA6)):
        try:
            data = character.encode(codec)
        except UnicodeEncodeError:
            continue
        if any(b in data for b in b"\\{}"):
            found.append(character)
    return found[:3]


def test_arrays_are_quoted_before_conversion_to_the_client_encoding(backend_dsn: str) -> None:
    """array_out decides quoting on the server's UTF-8: a character whose SJIS or BIG5 bytes
    hold a backslash or a brace is not quoted (PostgreSQL's bytes, which psycopg itself then
    cannot read back)."""
    with psycopg.connect(backend_dsn, autocommit=True) as conn:
        for encoding in ("SJIS", "BIG5"):
            codec = values.codec_of(encoding, "UTF8")
            assert codec is not None
            shown = [*_trail_bytes(codec), "a b"]
            assert len(shown) == 4
            conn.execute(f"SET client_encoding = '{encoding}'")
            listed = ", ".join(f"'{e}'" for e in shown)  # (no quote in them)
            sql = f"SELECT ARRAY[{listed}]"
            result = conn.pgconn.exec_params(sql.encode(codec), [], result_format=0)
            assert result.status == pq.ExecStatus.TUPLES_OK, result.error_message
            (encode,) = values.encoders(
                (result.ftype(0),), (0,), values.OutputSettings(codec=codec)
            )
            assert encode(shown) == result.get_value(0, 0), encoding


def test_random_floats_print_as_postgres_prints_them(backend_dsn: str) -> None:
    """Every bit pattern is as likely: a fixed-seed sweep of doubles and reals."""
    chance = random.Random(27)
    doubles = [struct.unpack("d", struct.pack("Q", chance.getrandbits(64)))[0] for _ in range(3000)]
    reals = [struct.unpack("f", struct.pack("I", chance.getrandbits(32)))[0] for _ in range(3000)]
    with psycopg.connect(backend_dsn, autocommit=True) as conn:
        for type_name, found in (("float8", doubles), ("float4", reals)):
            finite = [v for v in found if math.isfinite(v)]
            array = "{" + ",".join(repr(v) for v in finite) + "}"
            sent = conn.pgconn.exec_params(
                f"SELECT unnest($1::{type_name}[])".encode(), [array.encode()]
            )
            oid = sent.ftype(0)
            (encode,) = values.encoders((oid,), (0,), values.OutputSettings())
            for row, value in enumerate(finite):
                assert encode(value) == sent.get_value(row, 0), (type_name, value)


def test_floats_under_extra_float_digits_zero(backend_dsn: str) -> None:
    settings = values.OutputSettings(extra_float_digits=0)
    with psycopg.connect(backend_dsn, autocommit=True) as conn:
        conn.execute("SET extra_float_digits = 0")
        for type_name in ("float8", "float4"):
            for literal in EDGES[type_name]:
                oid, sent, loaded = _postgres(conn, f"SELECT '{literal}'::{type_name}", False)
                (encode,) = values.encoders((oid,), (0,), settings)
                assert encode(loaded) == sent, (type_name, literal)


def test_parameters_decode_as_psycopg_loads_them(backend_dsn: str) -> None:
    """A parameter the client sends in either format is read as the value psycopg gives."""
    with psycopg.connect(backend_dsn, autocommit=True) as conn:
        for type_name, literals in EDGES.items():
            for literal in literals:
                sql = f"SELECT {psycopg.sql.quote(literal)}::{type_name}"
                for binary in (False, True):
                    oid, sent, loaded = _postgres(conn, sql, binary)
                    decode = values.decoder(oid, binary)
                    assert decode is not None
                    got = decode(sent)
                    assert typed([(got,)]) == typed([(loaded,)]), (sql, binary)


def test_interval_is_not_encoded_here() -> None:
    """PostgreSQL keeps an interval's days apart from its time; Python merges them."""
    assert not values.encodable([1186])


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_a_numeric_the_engine_gives_as_an_int(backend_dsn: str, binary: bool) -> None:
    """A local answer may carry a numeric column's value as an int (DuckDB's sum of
    integers, before the backend's description is known): the bytes are PostgreSQL's for
    that numeric, not a failed session (found by the chaos run over the wire)."""
    with psycopg.connect(backend_dsn, autocommit=True) as conn:
        for number in (0, 7, -12, 10**30):
            oid, sent, _ = _postgres(conn, f"SELECT {number}::numeric", binary)
            (encode,) = values.encoders((oid,), (1 if binary else 0,), values.OutputSettings())
            assert encode(number) == sent, number
