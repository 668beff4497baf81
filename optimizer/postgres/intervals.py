"""PostgreSQL's interval arithmetic that DuckDB does otherwise: an interval holding months
multiplied by a fraction (the cache's own DuckDB function, `optimizer.postgres.allowlist.
INTERVAL_MULTIPLY`, registered by cache/store/functions.py)."""

from __future__ import annotations

import math

DAYS_PER_MONTH = 30
SECONDS_PER_DAY = 86_400
_INT32 = 2**31


def _tsround(value: float) -> float:
    """TSROUND: to the microsecond."""
    return _rint(value * 1_000_000.0) / 1_000_000.0


def _rint(value: float) -> float:
    """C's rint under the default rounding mode: to the nearest, ties to even."""
    return float(round(value))


def multiply(
    months: int | None, days: int | None, micros: int | None, factor: float | None
) -> dict[str, int] | None:
    """interval_mul (src/backend/utils/adt/timestamp.c) of the interval (months, days,
    microseconds) by a double: each unit's product truncated, the fractions of months cascaded
    into days (30 a month) and of days into seconds, each rounded to the microsecond; the
    result as its three units. Out of range: an error, as PostgreSQL's."""
    if months is None or days is None or micros is None or factor is None:
        return None
    month_product = months * factor
    if math.isnan(month_product) or not -_INT32 <= month_product < _INT32:
        raise ArithmeticError("interval out of range")
    result_months = int(month_product)  # (C's cast truncates toward zero)
    day_product = days * factor
    if math.isnan(day_product) or not -_INT32 <= day_product < _INT32:
        raise ArithmeticError("interval out of range")
    result_days = int(day_product)
    month_remainder_days = _tsround((months * factor - result_months) * DAYS_PER_MONTH)
    sec_remainder = _tsround(
        (days * factor - result_days + month_remainder_days - int(month_remainder_days))
        * SECONDS_PER_DAY
    )
    if abs(sec_remainder) >= SECONDS_PER_DAY:
        whole = int(sec_remainder / SECONDS_PER_DAY)
        result_days += whole
        sec_remainder -= whole * SECONDS_PER_DAY
    result_days += int(month_remainder_days)
    time = _rint(micros * factor + sec_remainder * 1_000_000)
    if math.isnan(time) or not -(2**63) <= time < 2**63:
        raise ArithmeticError("interval out of range")
    return {"months": result_months, "days": result_days, "micros": int(time)}
