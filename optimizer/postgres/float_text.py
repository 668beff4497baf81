"""PostgreSQL's shortest-exact output of double precision and real values (float8out and
float4out with extra_float_digits > 0, src/common/d2s.c and f2s.c, Ryu): the fewest
significant digits that read back as the same value. Unlike Python's ``repr`` (which accepts
a decimal exactly halfway to a neighbouring value when the halfway point rounds to it),
PostgreSQL takes only decimals strictly closer to the value than to either neighbour:
``33566752::real`` prints ``3.3566752e+07``, not ``3.356675e+07``. psycopg reads reals from
that text, so a cached real is given as the double of these digits.
"""

from __future__ import annotations

import decimal
import math
import struct
import typing as t

_EXACT = decimal.Context(prec=1200)  # enough digits for any double's exact value
_F4 = struct.Struct("f")
_I4 = struct.Struct("I")


def shortest_digits(value: float, width: int) -> str:
    """The value's shortest-exact decimal as PostgreSQL chooses it (``%g``-style text; a
    finite, non-zero value of a double (``width`` 8) or a real (4))."""
    text = repr(value) if width == 8 else _shortest4(value)
    if not _halfway(value, decimal.Decimal(text), width):
        return text
    digits = len(decimal.Decimal(text).normalize().as_tuple().digits)
    for more in range(digits + 1, 18):
        text = format(value, f".{more}g")
        if not _halfway(value, decimal.Decimal(text), width):
            return text
    return format(value, ".17g")


def _shortest4(value: float) -> str:
    """The fewest digits that read back as the same real (halfway points included)."""
    target = _F4.pack(value)
    for digits in range(1, 10):
        text = format(value, f".{digits}g")
        try:
            if _F4.pack(float(text)) == target:
                return text
        except OverflowError:  # rounded past the largest real
            continue
    return repr(value)


def _halfway(value: float, candidate: decimal.Decimal, width: int) -> bool:
    """Is ``candidate`` exactly halfway between the value and a neighbouring one?"""
    exact = decimal.Decimal(value)
    low, high = (None if math.isinf(n) else decimal.Decimal(n) for n in _neighbours(value, width))
    # past the largest finite value: the step below, mirrored
    low = low if low is not None else _EXACT.subtract(2 * exact, t.cast(decimal.Decimal, high))
    high = high if high is not None else _EXACT.subtract(2 * exact, low)
    return any(_EXACT.divide(_EXACT.add(exact, end), 2) == candidate for end in (low, high))


def _neighbours(value: float, width: int) -> tuple[float, float]:
    if width == 8:
        return math.nextafter(value, -math.inf), math.nextafter(value, math.inf)
    bits = _I4.unpack(_F4.pack(value))[0]
    # a real's bit pattern, read as an unsigned integer, orders its magnitudes
    away, toward = bits + 1, bits - 1
    if bits & 0x7FFFFFFF == 0:
        toward = bits ^ 0x80000000 | 1  # past zero: the smallest real of the other sign
    up, down = (_real(away), _real(toward)) if value > 0 else (_real(toward), _real(away))
    return down, up


def _real(bits: int) -> float:
    return _F4.unpack(_I4.pack(bits & 0xFFFFFFFF))[0]
