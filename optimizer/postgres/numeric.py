"""PostgreSQL's numeric division, exactly (src/backend/utils/adt/numeric.c): `numeric_div` and
so `avg` of numerics and integers, which PostgreSQL computes as sum / count.

The quotient's scale is `select_div_scale`'s: enough digits for at least 16 significant ones,
no fewer than either operand's display scale; the quotient is rounded half away from zero at
that scale. Numerics are stored in base 10000 (4 decimal digits a group), and the scale rule
looks at the weight and the first group of each operand, so those are computed here as
PostgreSQL keeps them.
"""

from __future__ import annotations

import decimal
import math

from optimizer.postgres.allowlist import DIVISION_SCALE

NUMERIC_MIN_SIG_DIGITS = 16
DEC_DIGITS = 4  # decimal digits per base-10000 group
NUMERIC_MIN_DISPLAY_SCALE = 0
NUMERIC_MAX_DISPLAY_SCALE = 1000


class DivisionByZero(ArithmeticError):
    """PostgreSQL's ERROR: division by zero (SQLSTATE 22012)."""


def _exact(value: decimal.Decimal) -> tuple[int, int]:
    """(N, s) with value = N / 10**s exactly, s >= 0 (no rounding by a decimal context)."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int), "not a finite number"
    integer = int(decimal.Decimal((0, digits, 0)))  # (exact: int() rounds by no context)
    if exponent >= 0:
        integer *= 10**exponent
        scale = 0
    else:
        scale = -exponent
    return (-integer if sign else integer), scale


def _weight_and_first_group(exact: tuple[int, int]) -> tuple[int, int]:
    """The base-10000 weight of the first non-zero group of a value (its `_exact` form) and
    that group's value (0, 0 for zero)."""
    integer, scale = exact
    integer = abs(integer)
    if integer == 0:
        return 0, 0
    exponent = len(str(integer)) - 1 - scale  # the leading decimal digit is 10**exponent
    weight = exponent // DEC_DIGITS  # groups are aligned at the decimal point
    shift = DEC_DIGITS * weight + scale  # value / 10000**weight = integer / 10**shift
    first = integer * 10**-shift if shift <= 0 else integer // 10**shift
    return weight, first


def _display_scale(value: decimal.Decimal) -> int:
    return _exact(value)[1]


def division_scale(dividend: decimal.Decimal, divisor: decimal.Decimal) -> int:
    """`select_div_scale`: the result scale of dividend / divisor."""
    return _division_scale(_exact(dividend), _exact(divisor))


def _division_scale(dividend: tuple[int, int], divisor: tuple[int, int]) -> int:
    """`division_scale` of operands in their `_exact` form."""
    weight1, first1 = _weight_and_first_group(dividend)
    weight2, first2 = _weight_and_first_group(divisor)
    # estimate the quotient's weight; with equal first groups assume dividend < divisor
    qweight = weight1 - weight2
    if first1 <= first2:
        qweight -= 1
    scale = NUMERIC_MIN_SIG_DIGITS - qweight * DEC_DIGITS
    scale = max(scale, dividend[1], divisor[1], NUMERIC_MIN_DISPLAY_SCALE)
    return min(scale, NUMERIC_MAX_DISPLAY_SCALE)


def divide(dividend: decimal.Decimal | int, divisor: decimal.Decimal | int) -> decimal.Decimal:
    """dividend / divisor as PostgreSQL's numeric division gives it: at `division_scale`,
    rounded half away from zero."""
    a, b = decimal.Decimal(dividend), decimal.Decimal(divisor)
    if b == 0:
        raise DivisionByZero("division by zero")
    # exact integer arithmetic: a = A / 10**sa, b = B / 10**sb
    big_a, sa = exact_a = _exact(a)
    big_b, sb = exact_b = _exact(b)
    scale = _division_scale(exact_a, exact_b)
    numerator = big_a * 10 ** (sb + scale)
    denominator = big_b * 10**sa
    negative = (numerator < 0) != (denominator < 0)
    quotient, remainder = divmod(abs(numerator), abs(denominator))
    if 2 * remainder >= abs(denominator):
        quotient += 1
    digits = tuple(map(int, str(quotient)))
    return decimal.Decimal((1 if negative and quotient else 0, digits, -scale))


def spread(
    numerator: decimal.Decimal | int, denominator: int, root: bool
) -> decimal.Decimal | None:
    """A variance (or, ``root``, a standard deviation) from its exact numerator
    ``N * sum(x*x) - sum(x)^2`` and denominator ``N * (N - 1)`` (``N * N``), as PostgreSQL's
    numeric_stddev_internal computes it: NULL for no denominator (no rows; one, for a sample),
    0 where the numerator is not positive, else the numeric quotient, and its square root at
    the quotient's scale (rounded half away from zero, from the integer square root)."""
    if denominator == 0:
        return None
    if numerator <= 0:
        return decimal.Decimal(0)
    variance = divide(numerator, denominator)
    if not root:
        return variance
    big, scale = _exact(variance)
    # sqrt(big / 10**scale) * 10**(scale + 1), truncated: one digit past the scale
    truncated = math.isqrt(big * 10 ** (scale + 2))
    rounded = truncated // 10 + (1 if truncated % 10 >= 5 else 0)
    return decimal.Decimal((0, tuple(int(d) for d in str(rounded)), -scale))


def average(total: decimal.Decimal | int | None, count: int) -> decimal.Decimal | None:
    """avg of numerics or integers: sum / count (NULL over no rows)."""
    if total is None or count == 0:
        return None
    return divide(total, count)


# -- inside a local statement ---------------------------------------------------------------------
#
# A numeric division PostgreSQL computes inside a statement (an average in a subquery, a
# quotient compared in WHERE) is computed by these functions, which DuckDB calls
# (`cache.store.functions`): the operands come as their exact text with PostgreSQL's display
# scale beside them; the quotient goes back as text at PostgreSQL's scale, which DuckDB reads as
# a DECIMAL(38, DIVISION_SCALE) (a quotient needing more digits raises: the backend answers).


def _operand(text: str, scale: int) -> decimal.Decimal:
    return decimal.Decimal(text).quantize(
        decimal.Decimal(1).scaleb(-scale), context=decimal.Context(prec=1000)
    )


def divide_texts(
    a: str | None, a_scale: int | None, b: str | None, b_scale: int | None
) -> str | None:
    """a / b as PostgreSQL's numeric division, from and to text (NULL in, NULL out)."""
    if a is None or b is None or a_scale is None or b_scale is None:
        return None
    quotient = divide(_operand(a, a_scale), _operand(b, b_scale))
    scale = _display_scale(quotient)
    if scale > DIVISION_SCALE:
        raise ArithmeticError(f"a quotient of scale {scale} exceeds the cache's {DIVISION_SCALE}")
    return format(quotient, "f")


def spread_texts(
    numerator: str | None, numerator_scale: int | None, denominator: str | None, root: int | None
) -> str | None:
    """A variance (``root``: a standard deviation) from its exact numerator and denominator
    (`spread`), from and to text."""
    if numerator is None or denominator is None or numerator_scale is None or root is None:
        return None
    value = spread(_operand(numerator, numerator_scale), int(denominator), bool(root))
    if value is None:
        return None
    if _display_scale(value) > DIVISION_SCALE:
        raise ArithmeticError(f"a variance of scale {_display_scale(value)} exceeds the cache's")
    return format(value, "f")


def spread_text_scale(
    numerator: str | None, numerator_scale: int | None, denominator: str | None, root: int | None
) -> int | None:
    """The display scale of `spread_texts`'s value."""
    found = spread_texts(numerator, numerator_scale, denominator, root)
    return _display_scale(decimal.Decimal(found)) if found is not None else None


def division_text_scale(
    a: str | None, a_scale: int | None, b: str | None, b_scale: int | None
) -> int | None:
    """The display scale of a / b as PostgreSQL gives it."""
    if a is None or b is None or a_scale is None or b_scale is None:
        return None
    dividend, divisor = _operand(a, a_scale), _operand(b, b_scale)
    if divisor == 0:
        return None  # the division itself raises
    return division_scale(dividend, divisor)


def width_bucket_texts(
    operand: str | None, low: str | None, high: str | None, count: int | None
) -> int | None:
    """PostgreSQL's width_bucket(numeric, numeric, numeric, int) (width_bucket_numeric: exact
    in numeric, the bucket truncated), from the operands' text (NULL in, NULL out)."""
    if operand is None or low is None or high is None or count is None:
        return None
    if count <= 0:
        raise ArithmeticError("count must be greater than zero")
    value, first, last = decimal.Decimal(operand), decimal.Decimal(low), decimal.Decimal(high)
    if first == last:
        raise ArithmeticError("lower bound cannot equal upper bound")
    if first < last:
        if value < first:
            return 0
        if value >= last:
            return _bucket_limit(count + 1)
        return _bucket_limit(int((value - first) * count // (last - first)) + 1)
    if value > first:
        return 0
    if value <= last:
        return _bucket_limit(count + 1)
    return _bucket_limit(int((first - value) * count // (first - last)) + 1)


def _bucket_limit(bucket: int) -> int:
    if bucket > 2**31 - 1:
        raise ArithmeticError("integer out of range")
    return bucket
