"""Pattern matching: LIKE, ILIKE, SIMILAR TO and the regular expressions ~ and ~*; the
regular expression functions that return what matched (regexp_replace, substring(s FROM
pattern), regexp_substr) for the patterns whose match both engines find alike
(`optimizer.postgres.regex`)."""

from __future__ import annotations

import dataclasses
import re
import string
import typing as t

from sqlglot import exp

from optimizer.postgres import regex
from optimizer.postgres.allowlist.base import (
    _LOWER,
    _UPPER,
    NOT_MINE,
    Call,
    Family,
    Result,
    _ascii_map,
    _func,
    _own_collation,
    _string_literal,
    _strings,
    _text,
)
from optimizer.postgres.types import BOOL

FAMILY = Family()
entry = FAMILY.entry


def _like(call: Call) -> Result:
    a, pattern = call.type(), call.type("expression")
    if not _strings(a, pattern):
        return f"it matches {a.kind} with LIKE"
    if isinstance(call.node, exp.ILike) and _own_collation(call, "this", "expression"):
        return t.cast(str, _own_collation(call, "this", "expression"))
    if isinstance(call.node, exp.ILike) and not call.settings.ascii_case:
        if call.settings.unicode_case:
            return NOT_MINE  # (the entry under a Unicode ctype)
        return (
            "it takes ILIKE, whose case folding follows the database's ctype (one whose "
            "mapping the cache did not prove equal to DuckDB's)"
        )
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


def _as_under_c(check: t.Callable[[Call], Result]) -> t.Callable[[Call], Result]:
    """The signature of an entry for a ctype whose case mapping the cache proved DuckDB's
    (``C.UTF-8``): ``check``'s checks, made as under C (the case folding is the entry's)."""

    def signature(call: Call) -> Result:
        if call.settings.ascii_case or not call.settings.unicode_case:
            return NOT_MINE
        settings = dataclasses.replace(call.settings, ascii_case=True)
        return check(Call(call.node, call.typer, settings, call.identifies_rows))

    return signature


def _unicode_ilike_rewrite(node: exp.Expr) -> exp.Expr:
    """PostgreSQL's ILIKE under a multibyte encoding lowers both sides and matches them
    (Generic_Text_IC_like), with the lower DuckDB's was proven equal to."""
    like = exp.Like(this=exp.Lower(this=node.this), expression=exp.Lower(this=node.expression))
    return exp.Not(this=like) if node.args.get("negate") else like


entry(
    "ILIKE (Unicode ctype)",
    exp.ILike,
    _as_under_c(_like),  # (ILIKE lowers both sides: see the rewrite)
    rewrite=_unicode_ilike_rewrite,
    proofs=("e.t ILIKE '%Ä%'", "e.c ILIKE 'é%'", "e.v NOT ILIKE '%ǅ%'", "e.t ILIKE '%SS%'"),
    ctype="equal sharp_s",
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
    translated = "".join(out)
    if _are_only(translated):
        return None  # (a quantifier with nothing to repeat: what ARE and RE2 read otherwise)
    return "^(?:" + translated + ")$"


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
    translation, matched in full (its ``_`` and ``%`` match a newline too)."""
    translated = regex.for_duckdb(_similar_regex(node.expression.this) or "")
    return exp.RegexpLike(
        this=node.this, expression=exp.Literal.string(translated), full_match=True
    )


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
        "e.v SIMILAR TO 'a_c'",
    ),
)

_BRACKET = r"\[\^?\]?[^\]\[\\]*\]"  # a bracket expression without classes or escapes
# what both PostgreSQL's regular expressions and RE2 read alike
_SAFE_REGEX = re.compile(
    r"(?:[^\\\[\](){}|*+?.^$]|\\[.^$*+?()\[\]{}|\\]|[.^$|*+?()]"
    r"|\{\d+(,\d*)?\}|" + _BRACKET + ")*"
)


def _regex(call: Call) -> Result:
    a = call.type()
    if not _strings(a, call.type("expression")):
        return f"it matches {a.kind} with a regular expression"
    if call.node.args.get("flag") is not None:
        return "it passes flags to a regular expression"
    if isinstance(call.node, exp.RegexpILike) and _own_collation(call, "this", "expression"):
        return t.cast(str, _own_collation(call, "this", "expression"))
    if isinstance(call.node, exp.RegexpILike) and not call.settings.ascii_case:
        if call.settings.unicode_case:
            return NOT_MINE  # (the entry under a Unicode ctype)
        return (
            "it takes ~*, whose case folding follows the database's ctype (one whose mapping "
            "the cache did not prove equal to DuckDB's)"
        )
    text = _string_literal(call.arg("expression"))
    if (
        text is None
        or not _SAFE_REGEX.fullmatch(text)
        or not text.isascii()
        or not regex.readable(text)
    ):
        return "its regular expression is not a literal both engines read alike"
    if _are_only(text):
        return (
            "its regular expression has embedded options or a quantifier with nothing to "
            "repeat (PostgreSQL's ARE reads them its own way: (?m), (?i), ***, ^*)"
        )
    if isinstance(call.node, exp.RegexpILike) and _case_crossing_range(text):
        return (
            "its ~* pattern has a range crossing letters of both cases or other characters "
            "(PostgreSQL adds each letter's other case to the range as it is)"
        )
    return BOOL


# what PostgreSQL's ARE reads otherwise than RE2, or refuses where RE2 answers: embedded
# options ("(?m)" is newline-sensitive to PostgreSQL, "(?i)" folds by RE2's Unicode rules),
# "***" directors, a quantifier with nothing before it or after another quantifier
_ARE_ONLY = re.compile(r"\(\?(?!:)|(?:^|[|^])[*+?{]|\((?!\?:)[*+?{]|[*+?}][*+{]|[*+?}]\?[*+?{]")


def _are_only(pattern: str) -> bool:
    """Whether a pattern holds what `_ARE_ONLY` names, outside its bracket expressions (each
    read as one character: ``[^*]`` is no quantifier)."""
    return _ARE_ONLY.search(re.sub(_BRACKET, "x", pattern)) is not None


def _case_crossing_range(pattern: str) -> bool:
    """Whether a bracket expression's range holds letters yet is not within a..z or A..Z
    (``[A-z]`` holds ``_``, which lowering the pattern to ``[a-z]`` would lose)."""
    for found in re.finditer(_BRACKET, pattern):
        body = found.group(0)[1:-1].lstrip("^")
        for i in range(1, len(body) - 1):
            if body[i] != "-" or i == 0:
                continue
            low, high = body[i - 1], body[i + 1]
            letters = any(low <= c <= high for c in string.ascii_letters)
            within = (low.islower() and high.islower()) or (low.isupper() and high.isupper())
            if low > high or (letters and not within):
                return True
    return False


def _regex_rewrite(node: exp.Expr) -> exp.Expr:
    """PostgreSQL's ``.`` matches a newline: so does DuckDB's, given ``(?s)``."""
    return exp.RegexpLike(
        this=node.this, expression=exp.Literal.string(regex.for_duckdb(node.expression.this))
    )


def _regex_i_rewrite(node: exp.Expr) -> exp.Expr:
    """~* folds ASCII letters only under the C ctype: match the value lowered so against the
    pattern lowered (a literal of ASCII, checked)."""
    return exp.RegexpLike(
        this=_ascii_map(node.this, _UPPER, _LOWER),
        expression=exp.Literal.string(regex.for_duckdb(node.expression.this.lower())),
    )


entry(
    "~",
    exp.RegexpLike,
    _regex,
    rewrite=_regex_rewrite,
    raises=("e.t ~ '[a-c-e]'", "e.t ~ 'x{1,300}'"),
    proofs=(
        "e.v ~ 'a.c'",
        "e.v ~ '^a[^x]c$'",
        "regexp_like(e.t, 'b.*y')",
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
    raises=("e.t ~* '[a-c-e]'",),
    proofs=("e.t ~* '^a'", "e.v ~* 'B'", "e.t ~* 'X Y'", "e.v ~* '[A-C]'", "e.t !~* '[0-9b-d]'"),
)


entry(
    "~* (Unicode ctype)",
    exp.RegexpILike,
    # PostgreSQL's ~* adds to each character of the pattern its towlower and towupper: for the
    # ASCII letters of an ASCII pattern, under a ctype whose case mapping the cache proved
    # DuckDB's, the other ASCII case only - as under C (a subject's character is not folded:
    # the Kelvin sign does not match k)
    _as_under_c(_regex),
    rewrite=_regex_i_rewrite,
    proofs=("e.t ~* '^a'", "e.v ~* 'B'", "e.t ~* 'X Y'", "e.v ~* '[A-C]'", "e.t !~* 'Q R'"),
    ctype="equal sharp_s",
)


# -- what a regular expression matched ----------------------------------------------------------


def _matched(call: Call, pattern_key: str) -> regex.Pattern | str:
    """The pattern of a function returning what it matched, if both engines find that alike;
    else why not."""
    a = call.type()
    if not _strings(a, call.type(pattern_key)):
        return NOT_MINE
    text = _string_literal(call.arg(pattern_key))
    if text is None:
        return f"it calls {call.node.key} with a pattern that is not a literal"
    found = regex.parse(text)
    if found is None:
        return (
            f"it calls {call.node.key} with the regular expression '{text}', outside what the "
            "cache reads as PostgreSQL does (alternation, escapes such as \\d, classes, "
            "repeated groups)"
        )
    if not found.deterministic:
        return (
            f"it calls {call.node.key} with the regular expression '{text}', whose match "
            "PostgreSQL ends at the longest and DuckDB at the first its preferences find"
        )
    return found


def _regexp_replace(call: Call) -> Result:
    found = _matched(call, "expression")
    if isinstance(found, str):
        return found
    replacement = _string_literal(call.arg("replacement"))
    if replacement is None or regex.replacement(replacement, found.groups) is None:
        return "its regexp_replace replacement is not a literal of \\1-\\9, \\& and text"
    flags = call.arg("modifiers")
    if flags is not None and _string_literal(flags) not in ("", "g"):
        return "it passes flags other than 'g' to regexp_replace"
    if flags is not None and _string_literal(flags) == "g" and found.may_be_empty:
        return (
            "it replaces every match of a pattern that matches the empty string (PostgreSQL "
            "also replaces the empty match right after a match, DuckDB does not)"
        )
    if any(call.arg(k) is not None for k in ("position", "occurrence")):
        return "it passes a start or an occurrence to regexp_replace"
    return _text(call.type())


def _regexp_replace_rewrite(node: exp.Expr) -> exp.Expr:
    pattern = regex.parse(node.expression.this)
    assert pattern is not None
    flags = node.args.get("modifiers")
    arguments = [
        node.this,
        exp.Literal.string(regex.for_duckdb(node.expression.this)),
        exp.Literal.string(regex.replacement(node.args["replacement"].this, pattern.groups) or ""),
    ]
    if flags is not None and flags.this == "g":
        arguments.append(exp.Literal.string("g"))
    return _func("regexp_replace", *arguments)


entry(
    "regexp_replace",
    exp.RegexpReplace,
    _regexp_replace,
    rewrite=_regexp_replace_rewrite,
    proofs=(
        "regexp_replace(e.t, '[0-9]+', '#')",
        "regexp_replace(e.t, '[a-z]', '<\\&>', 'g')",
        "regexp_replace(e.v, '^ *', '')",
        "regexp_replace(e.c, '([A-Z]) ([A-Z])', '\\2-\\1')",
        "regexp_replace(e.t, 'a.c', 'X', 'g')",
        "regexp_replace(e.t, '[^ ]+$', '_')",
        "regexp_replace(e.v, 'Ä', 'A', 'g')",
        "regexp_replace(e.t, 'x*', '-')",
        "regexp_replace(e.t, ' +$', '.', 'g')",
        "regexp_replace(e.t, '', '>')",
        "regexp_replace(e.t, 'q{2,3}', '\\\\')",
        "regexp_replace(e.t || '.x', '\\.x$', '!')",
        "regexp_replace(e.t, 'x{1}', 'Z', 'g')",
    ),
)


def _substring_pattern(call: Call) -> Result:
    if call.arg("length") is not None:
        return "it calls substring(s FROM pattern FOR escape), a SQL regular expression"
    found = _matched(call, "start")
    if isinstance(found, str):
        return found
    return _text(call.type())


def _matched_part(value: exp.Expr, pattern: str, group: int) -> exp.Expr:
    """What ``pattern`` matched in ``value`` (its ``group``-th parenthesized part, 0: the whole
    match), NULL without a match (DuckDB's regexp_extract alone would give '')."""
    duckdb_pattern = exp.Literal.string(regex.for_duckdb(pattern))
    return exp.Case(
        ifs=[
            exp.If(
                this=_func("regexp_matches", value.copy(), duckdb_pattern.copy()),
                true=_func("regexp_extract", value, duckdb_pattern, exp.Literal.number(group)),
            )
        ]
    )


def _substring_pattern_rewrite(node: exp.Expr) -> exp.Expr:
    """The first parenthesized part's match, else the whole match."""
    text = node.args["start"].this
    pattern = regex.parse(text)
    assert pattern is not None
    return _matched_part(node.this, text, 1 if pattern.groups else 0)


entry(
    "substring(text FROM pattern)",
    exp.Substring,
    _substring_pattern,
    rewrite=_substring_pattern_rewrite,
    proofs=(
        "substring(e.t FROM '[0-9]+')",
        "substring(e.t FROM '^[A-Za-z]+')",
        "substring(e.v, 'a(.)c')",
        "substring(e.t FROM '([a-z]+)#([0-9]+)')",
        "substring(e.c FROM ' [A-Z]$')",
        "substring(e.v FROM '[^a-z]+')",
        "substring(e.t FROM 'y*')",
        "substring(e.v || '[1]' FROM '\\[([0-9])\\]')",
    ),
)


def _regexp_substr(call: Call) -> Result:
    if any(call.arg(k) is not None for k in ("position", "occurrence", "parameters", "group")):
        return "it passes more than a string and a pattern to regexp_substr"
    found = _matched(call, "expression")
    if isinstance(found, str):
        return found
    return _text(call.type())


def _regexp_substr_rewrite(node: exp.Expr) -> exp.Expr:
    return _matched_part(node.this, node.expression.this, 0)


entry(
    "regexp_substr",
    exp.RegexpSubstr,
    _regexp_substr,
    rewrite=_regexp_substr_rewrite,
    proofs=("regexp_substr(e.t, '[a-z]+')", "regexp_substr(e.v, 'b *$')"),
)
