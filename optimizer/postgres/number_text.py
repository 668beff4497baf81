"""PostgreSQL's to_char of a number for the templates the cache formats itself (the cache's
own DuckDB function, `optimizer.postgres.allowlist.NUMERIC_TO_CHAR`, registered by
cache/store/functions.py)."""

from __future__ import annotations

import decimal


def number_template(template: str) -> bool:
    """Whether to_char's template is one the cache formats as PostgreSQL does (`to_char_text`):
    an optional ``FM``, then digit positions ``9`` and ``0`` with literal commas, at least one
    before an optional ``.`` and any after it, nothing else (no locale's G and D, no sign
    patterns)."""
    whole, point, fraction = template.removeprefix("FM").partition(".")
    if point and not fraction:
        return False  # a point with no digits after it: PostgreSQL prints none
    return (
        bool(whole.strip(","))
        and set(whole) <= set("90,")
        and set(fraction) <= set("90")
        and "." not in fraction
        and not whole.startswith(",")
    )


def to_char_text(value: str | None, template: str | None) -> str | None:
    """PostgreSQL's to_char(numeric, template) for a template `number_template` takes, from
    the value's text: a sign column (a blank, or ``-`` right before the first digit printed),
    the value rounded half away from zero to the template's fraction digits, integer digits
    blank until the first ``0`` position or the first significant digit (without a point, the
    last position always prints), commas printed only
    after a digit, and ``#`` in every digit position when the integer part does not fit. A
    value rounded to zero prints no sign. FM (fill mode) drops the leading blanks and the
    fraction's trailing zeros at ``9`` positions, and prints a zero left with nothing but its
    point as ``0.``."""
    if value is None or template is None:
        return None
    if template.startswith("FM"):
        return _fill_mode(value, template[2:])
    number = decimal.Decimal(value)
    if not number.is_finite():
        raise ArithmeticError("to_char of a number that is not finite: asked of PostgreSQL")
    whole, point, fraction = template.partition(".")
    quantum = decimal.Decimal(1).scaleb(-len(fraction))
    rounded = number.quantize(quantum, rounding=decimal.ROUND_HALF_UP)
    negative = rounded < 0
    integer, _, decimals = f"{abs(rounded):f}".partition(".")
    positions = [c for c in whole if c != ","]
    if len(integer.lstrip("0") or "0") > len(positions) or (integer != "0" and not positions):
        hashes = "".join("#" if c in "90" else c for c in template)
        return ("-" if negative else " ") + hashes
    digits = integer.rjust(len(positions), "0")
    forced = positions.index("0") if "0" in positions else len(positions)
    if not point:
        forced = min(forced, len(positions) - 1)  # without a point, the last digit prints
    significant = len(positions) - len(integer.lstrip("0"))
    start = min(forced, significant)  # the first position printed
    out: list[str] = []
    seen = 0
    printed = False
    for char in whole:
        if char == ",":
            out.append("," if printed else " ")
            continue
        if seen >= start:
            if not printed:
                out.append("-" if negative else " ")
                printed = True
            out.append(digits[seen])
        else:
            out.append(" ")
        seen += 1
    if not printed:
        out.append("-" if negative else " ")  # the sign column before the point
    text = "".join(out)
    if point:
        text += "." + decimals
    return text


def _fill_mode(value: str, template: str) -> str | None:
    text = to_char_text(value, template)
    if text is None or "#" in text:
        return text.lstrip(" ") if text is not None else None
    text = text.lstrip(" ")
    _, point, fraction = template.partition(".")
    if point:
        head, _, digits = text.rpartition(".")
        kept = len(digits)
        while kept and fraction[kept - 1] == "9" and digits[kept - 1] == "0":
            kept -= 1
        text = f"{head}.{digits[:kept]}"
    return "0." if text == "." else text
