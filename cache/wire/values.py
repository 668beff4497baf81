"""Values on the wire: a local answer's Python values (the types psycopg gives) encoded as
PostgreSQL sends them, in text and binary format, and the parameters a client binds decoded
into the Python values the session engine takes.

Binary is PostgreSQL's ``*send`` format, which psycopg's binary dumpers write byte for byte.
Text is PostgreSQL's *output* format, which psycopg's text dumpers do not write (they write
input that PostgreSQL reads: ``1.0`` for the float 1, PostgreSQL prints ``1``), so it is
encoded here per type, under the settings that shape it: DateStyle ISO, IntervalStyle
postgres, bytea_output hex and extra_float_digits (see `OutputSettings`). A type with no
encoder here (`encodable`) is not answered locally: the backend answers the statement.
tests/wire/test_server_values.py checks every encoder against PostgreSQL's own bytes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import math
import struct
import typing as t
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import psycopg
from psycopg import _encodings as psycopg_encodings  # PostgreSQL's encoding names (no public map)
from psycopg.pq import Format

from cache.wire.oids import OID, element_oid
from optimizer.postgres.float_text import shortest_digits

Encoder = Callable[[t.Any], bytes]


@dataclass(frozen=True)
class OutputSettings:
    """The session settings PostgreSQL's text output depends on. Other DateStyles,
    IntervalStyles and bytea outputs are not encoded here (`supported`): under them the
    backend answers."""

    codec: str = "utf-8"  # Python's name of the client encoding
    extra_float_digits: int = 1
    date_style: str = "ISO, MDY"
    bytea_output: str = "hex"

    @functools.cached_property
    def supported(self) -> bool:
        return (
            self.date_style.replace(" ", "").upper().startswith("ISO,")
            and self.bytea_output == "hex"
        )


def codec_of(client_encoding: str, server_encoding: str) -> str | None:
    """Python's codec for text in the client encoding (SQL_ASCII: the server's bytes as they
    are, which for a UTF8 database are UTF-8); None: Python has none (EUC_TW, MULE_INTERNAL),
    so the server cannot read or write text in it."""
    name = client_encoding if client_encoding.upper() != "SQL_ASCII" else server_encoding
    try:
        return psycopg_encodings.pg2pyenc(name.strip().strip("'\"").encode())
    except psycopg.NotSupportedError:
        return None


def unconvertible(encoding: str) -> str:
    """Why a client encoding Python has no codec for is refused, and what to do."""
    return (
        f"the cache server cannot convert text to or from {encoding}: choose another "
        "client_encoding (UTF8 serves every text)"
    )


def encodable(type_oids: t.Iterable[int]) -> bool:
    """Whether values of every one of these types can be encoded here (an array: its
    elements')."""
    return all(element_oid(oid) in _TEXT or oid in _TEXT for oid in type_oids)


@functools.lru_cache(maxsize=1024)
def encoders(
    type_oids: tuple[int, ...], formats: tuple[int, ...], settings: OutputSettings
) -> tuple[Encoder, ...]:
    """One encoder per column, in the format the client asked for it (0 text, 1 binary);
    made once per result shape (encoders keep no state: sessions share them)."""
    return tuple(
        _binary(oid) if code == 1 else _text(oid, settings)
        for oid, code in zip(type_oids, formats, strict=True)
    )


def _text(oid: int, settings: OutputSettings) -> Encoder:
    element = element_oid(oid)
    if element is None:
        return _TEXT[oid](settings)
    # array_out writes the server's UTF-8 (where no character's bytes hold a quote, brace or
    # backslash, as SJIS's or BIG5's may), converted to the client encoding afterwards
    text = _array_text(_TEXT[element](dataclasses.replace(settings, codec="utf-8")))
    if settings.codec == "utf-8":
        return text
    codec = settings.codec
    return lambda values: text(values).decode("utf-8").encode(codec)


# -- text: PostgreSQL's output functions ----------------------------------------------------------


def _strings(settings: OutputSettings) -> Encoder:
    codec = settings.codec
    return lambda value: value.encode(codec)


def _bool(_: OutputSettings) -> Encoder:
    return lambda value: b"t" if value else b"f"


def _integer(_: OutputSettings) -> Encoder:
    return lambda value: str(int(value)).encode()


def _numeric(_: OutputSettings) -> Encoder:
    def encode(value: Decimal | int) -> bytes:
        if isinstance(value, int):  # (a sum of integers DuckDB gives as an int: no scale)
            return str(value).encode()
        if value.is_nan():
            return b"NaN"
        if value.is_infinite():
            return b"-Infinity" if value.is_signed() else b"Infinity"
        text = format(value, "f")
        if value.is_zero() and text.startswith("-"):  # PostgreSQL has no negative zero
            text = text[1:]
        return text.encode()

    return encode


def _float(width: int) -> Callable[[OutputSettings], Encoder]:
    """float8out / float4out: the shortest digits that read back to the same value, fixed
    notation for decimal exponents -4 up to 14 (6 for float4), else d.ddde+XX; with
    extra_float_digits <= 0, printf's %g at 15 (6) + extra_float_digits digits."""
    limit = 15 if width == 8 else 6

    def make(settings: OutputSettings) -> Encoder:
        extra = settings.extra_float_digits

        def encode(value: float) -> bytes:
            if math.isnan(value):
                return b"NaN"
            if math.isinf(value):
                return b"Infinity" if value > 0 else b"-Infinity"
            if extra <= 0:
                return format(value, f".{max(limit + extra, 1)}g").encode()
            if value == 0:
                return b"-0" if math.copysign(1.0, value) < 0 else b"0"
            if width == 4:  # psycopg gives a real as the double of its printed digits
                value = _F4.unpack(_F4.pack(value))[0]
            sign, digits, exponent = Decimal(shortest_digits(value, width)).normalize().as_tuple()
            text = "".join(map(str, digits))
            point = len(text) + int(exponent)  # digits before the decimal point
            e10 = point - 1
            if -4 <= e10 < limit:
                if point <= 0:
                    text = "0." + "0" * -point + text
                elif point >= len(text):
                    text += "0" * (point - len(text))
                else:
                    text = text[:point] + "." + text[point:]
            else:
                mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
                text = f"{mantissa}e{'-' if e10 < 0 else '+'}{abs(e10):02d}"
            return (("-" if sign else "") + text).encode()

        return encode

    return make


_F4 = struct.Struct("f")


def _date(_: OutputSettings) -> Encoder:
    return lambda value: value.isoformat().encode()


def _fraction(microseconds: int) -> str:
    return f".{microseconds:06d}".rstrip("0") if microseconds else ""


def _time(_: OutputSettings) -> Encoder:
    return lambda v: (
        f"{v.hour:02d}:{v.minute:02d}:{v.second:02d}{_fraction(v.microsecond)}".encode()
    )


def _timestamp(_: OutputSettings) -> Encoder:
    def encode(value: dt.datetime) -> bytes:
        return (
            f"{value.year:04d}-{value.month:02d}-{value.day:02d} {value.hour:02d}:"
            f"{value.minute:02d}:{value.second:02d}{_fraction(value.microsecond)}"
        ).encode()

    return encode


def _timestamptz(settings: OutputSettings) -> Encoder:
    plain = _timestamp(settings)

    def encode(value: dt.datetime) -> bytes:
        offset = value.utcoffset()
        seconds = int(offset.total_seconds()) if offset is not None else 0
        sign = "-" if seconds < 0 else "+"
        hours, rest = divmod(abs(seconds), 3600)
        minutes, secs = divmod(rest, 60)
        zone = f"{sign}{hours:02d}"
        if minutes or secs:
            zone += f":{minutes:02d}"
        if secs:
            zone += f":{secs:02d}"
        return plain(value) + zone.encode()

    return encode


def _bytea(_: OutputSettings) -> Encoder:
    return lambda value: b"\\x" + bytes(value).hex().encode()


def _uuid(_: OutputSettings) -> Encoder:
    return lambda value: str(value).encode()


_TEXT: dict[int, Callable[[OutputSettings], Encoder]] = {
    OID.bool: _bool,
    OID.int2: _integer,
    OID.int4: _integer,
    OID.int8: _integer,
    OID.oid: _integer,
    OID.float4: _float(4),
    OID.float8: _float(8),
    OID.numeric: _numeric,
    OID.text: _strings,
    OID.varchar: _strings,
    OID.bpchar: _strings,
    OID.name: _strings,
    OID.char: _strings,
    OID.date: _date,
    OID.time: _time,
    OID.timestamp: _timestamp,
    OID.timestamptz: _timestamptz,
    OID.bytea: _bytea,
    OID.uuid: _uuid,
}


# array_out quotes an element that is empty, reads NULL, or holds a delimiter, a brace, a quote,
# a backslash or white space (array_isspace); inside quotes a quote and a backslash are escaped
_QUOTED = frozenset(b'{},"\\ \t\n\r\v\f')


def _array_text(element: Encoder) -> Encoder:
    """array_out of a one-dimensional array: ``{1,NULL,"a b"}``."""

    def item(value: t.Any) -> bytes:
        if value is None:
            return b"NULL"
        text = element(value)
        if text and text.upper() != b"NULL" and not _QUOTED.intersection(text):
            return text
        return b'"' + text.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"'

    return lambda values: b"{" + b",".join(map(item, values)) + b"}"


# -- binary: PostgreSQL's send functions, as psycopg's dumpers write them ------------------------


# numeric_send of +-Infinity: PostgreSQL reads a display scale of 32 off the special value's
# header bits (psycopg writes 0)
_NUMERIC_INFINITIES = {False: b"\0\0\0\0\xd0\0\0\x20", True: b"\0\0\0\0\xf0\0\0\x20"}


def _binary(oid: int) -> Encoder:
    element = element_oid(oid)
    if element is not None:
        return _array_binary(element, _binary(element))
    if oid in (OID.bpchar, OID.char):  # bpcharsend / charsend: the bytes themselves
        return lambda value: value.encode()
    if oid == OID.numeric:
        plain = _dumped(oid)

        def numeric(value: Decimal | int) -> bytes:
            if isinstance(value, int):  # (as the text encoder: an int has no scale)
                value = Decimal(value)
            return _NUMERIC_INFINITIES[value.is_signed()] if value.is_infinite() else plain(value)

        return numeric
    return _dumped(oid)


def _array_binary(element_type: int, element: Encoder) -> Encoder:
    """array_send of a one-dimensional array: dimensions, a has-NULLs flag, the element type,
    then each element's length (-1: NULL) and bytes."""

    def encode(values: list[t.Any]) -> bytes:
        if not values:
            return struct.pack("!iii", 0, 0, element_type)
        parts = [struct.pack("!iiiii", 1, None in values, element_type, len(values), 1)]
        for value in values:
            if value is None:
                parts.append(b"\xff\xff\xff\xff")
            else:
                data = element(value)
                parts.append(struct.pack("!i", len(data)) + data)
        return b"".join(parts)

    return encode


def _dumped(oid: int) -> Encoder:
    dumper = psycopg.adapters.get_dumper_by_oid(oid, Format.BINARY)(object, None)
    dump = dumper.dump
    return lambda value: bytes(dump(value) or b"")


# -- parameters ------------------------------------------------------------------------------------

Decoder = Callable[[bytes], t.Any]


@functools.lru_cache(maxsize=256)
def decoder(type_oid: int, binary: bool) -> Decoder | None:
    """How a parameter of this type, in this format, becomes the Python value psycopg would
    give for it (None: no such loader; the backend takes the statement)."""
    try:
        loader_class = psycopg.adapters.get_loader(
            type_oid, Format.BINARY if binary else Format.TEXT
        )
    except KeyError:
        return None
    if loader_class is None:
        return None
    loader = loader_class(type_oid, None)
    return loader.load


__all__ = ["OutputSettings", "codec_of", "decoder", "encodable", "encoders"]
