"""Pattern matching: LIKE, ILIKE, SIMILAR TO and the regular expressions ~ and ~*."""

from __future__ import annotations

import re

from sqlglot import exp

from optimizer.postgres.allowlist.base import (
    _LOWER,
    _UPPER,
    Call,
    Family,
    Result,
    _ascii_map,
    _string_literal,
    _strings,
)
from optimizer.postgres.types import BOOL

FAMILY = Family()
entry = FAMILY.entry


def _like(call: Call) -> Result:
    a, pattern = call.type(), call.type("expression")
    if not _strings(a, pattern):
        return f"it matches {a.kind} with LIKE"
    if isinstance(call.node, exp.ILike) and not call.settings.ascii_case:
        return "it takes ILIKE, whose case folding follows the database's ctype"
    text = _string_literal(call.arg("expression"))
    if text is None:
        return "it matches LIKE with a pattern that is not a literal"
    if "\\" in text:
        return "its LIKE pattern has a backslash (escapes are read differently)"
    return BOOL


def _ilike_rewrite(node: exp.Expr) -> exp.Expr:
    """ILIKE folds ASCII letters only under the C ctype: compare both sides lowered so."""
    like = exp.Like(
        this=_ascii_map(node.this, _UPPER, _LOWER),
        expression=_ascii_map(node.expression, _UPPER, _LOWER),
    )
    return exp.Not(this=like) if node.args.get("negate") else like


entry(
    "LIKE",
    exp.Like,
    _like,
    proofs=(
        "e.t LIKE 'A%'",
        "e.c LIKE 'ab'",
        "e.c LIKE 'ab%'",
        "e.c NOT LIKE '% '",
        "e.v LIKE '%b _'",
        "e.t LIKE ''",
        "e.v LIKE '%'",
        "e.t LIKE '_b%'",
    ),
)
entry(
    "ILIKE",
    exp.ILike,
    _like,
    rewrite=_ilike_rewrite,
    proofs=("e.t ILIKE 'a%'", "e.c ILIKE 'AB%'", "e.v NOT ILIKE '%Ä%'", "e.t ILIKE '%ö%'"),
)


def _similar_regex(pattern: str) -> str | None:
    """PostgreSQL's translation of a SQL regular expression (SIMILAR TO) into a POSIX one
    (``similar_to_escape``, src/backend/utils/adt/regexp.c) for the part both engines read
    alike; None for what the cache does not translate (escapes, brace ranges)."""
    out = []
    in_class = False
    for char in pattern:
        if char == "\\":
            return None
        if in_class:
            out.append(char)
            if char == "]":
                in_class = False
            continue
        if char == "[":
            in_class = True
            out.append(char)
        elif char == "%":
            out.append(".*")
        elif char == "_":
            out.append(".")
        elif char in ".^$":
            out.append("\\" + char)
        elif char in "{}":
            return None
        else:
            out.append(char)
    if in_class:
        return None
    return "^(?:" + "".join(out) + ")$"


def _similar(call: Call) -> Result:
    a = call.type()
    if not _strings(a, call.type("expression")):
        return f"it matches {a.kind} with SIMILAR TO"
    text = _string_literal(call.arg("expression"))
    if text is None or _similar_regex(text) is None:
        return "its SIMILAR TO pattern is not a literal the cache translates"
    return BOOL


def _similar_rewrite(node: exp.Expr) -> exp.Expr:
    """DuckDB reads SIMILAR TO's pattern as a regular expression: give it PostgreSQL's
    translation, matched in full."""
    regex = _similar_regex(node.expression.this) or ""
    return exp.RegexpLike(this=node.this, expression=exp.Literal.string(regex), full_match=True)


entry(
    "SIMILAR TO",
    exp.SimilarTo,
    _similar,
    rewrite=_similar_rewrite,
    proofs=(
        "e.t SIMILAR TO 'A%'",
        "e.c SIMILAR TO 'ab%'",
        "e.v SIMILAR TO '%(b|y)%'",
        "e.t SIMILAR TO '[A-C]%'",
        "e.t NOT SIMILAR TO '_%'",
        "e.v SIMILAR TO '%'",
        "e.t SIMILAR TO 'x.y'",
        "e.t SIMILAR TO '(Ab|x)%'",
        "e.v SIMILAR TO '%1*'",
    ),
)

# what both PostgreSQL's regular expressions and RE2 read alike
_SAFE_REGEX = re.compile(
    r"(?:[^\\\[\](){}|*+?.^$]|\\[.^$*+?()\[\]{}|\\]|[.^$|*+?()]"
    r"|\{\d+(,\d*)?\}|\[\^?\]?[^\]\[\\]*\])*"
)


def _regex(call: Call) -> Result:
    a = call.type()
    if not _strings(a, call.type("expression")):
        return f"it matches {a.kind} with a regular expression"
    if call.node.args.get("flag") is not None:
        return "it passes flags to a regular expression"
    if isinstance(call.node, exp.RegexpILike) and not call.settings.ascii_case:
        return "it takes ~*, whose case folding follows the database's ctype"
    text = _string_literal(call.arg("expression"))
    if text is None or not _SAFE_REGEX.fullmatch(text) or not text.isascii():
        return "its regular expression is not a literal both engines read alike"
    return BOOL


def _regex_i_rewrite(node: exp.Expr) -> exp.Expr:
    """~* folds ASCII letters only under the C ctype: match the value lowered so against the
    pattern lowered (a literal of ASCII, checked)."""
    return exp.RegexpLike(
        this=_ascii_map(node.this, _UPPER, _LOWER),
        expression=exp.Literal.string(node.expression.this.lower()),
    )


entry(
    "~",
    exp.RegexpLike,
    _regex,
    proofs=(
        "e.t ~ '^A'",
        "e.c ~ ' $'",
        "e.v ~ 'b +'",
        "e.t !~ '[0-9]{2}'",
        "e.t ~ '^(Ab|x)'",
        "e.v ~ '^$'",
        "e.t ~ 'a.c'",
    ),
)
entry(
    "~*",
    exp.RegexpILike,
    _regex,
    rewrite=_regex_i_rewrite,
    proofs=("e.t ~* '^a'", "e.v ~* 'B'", "e.t ~* 'X Y'"),
)
