"""String functions and operators: upper and lower, lengths, position, substring, trim, replace,
padding, split_part, translate, to_hex, chr, ascii, starts_with, concat and ||."""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from optimizer.postgres.allowlist.base import (
    _LOWER,
    _UPPER,
    NOT_MINE,
    Call,
    Family,
    Result,
    _ascii_map,
    _error_if,
    _func,
    _integers,
    _literal_int,
    _own_collation,
    _string_literal,
    _strings,
    _text,
)
from optimizer.postgres.types import BOOL, INT4, STRINGS, PgType

FAMILY = Family()
entry = FAMILY.entry


def _text_of(*keys: str, result: Callable[..., PgType] | None = None) -> Callable[[Call], Result]:
    """A function of string arguments ``keys`` (the rest integers) returning text."""

    def signature(call: Call) -> Result:
        types = [call.type(k) for k in keys if call.arg(k) is not None]
        if not _strings(*types):
            return f"it passes {'/'.join(t_.kind for t_ in types)} to {call.node.key}"
        others = [
            call.type(k)
            for k in call.node.args
            if k not in keys and call.arg(k) is not None and k not in ("position", "is_left")
        ]
        if not _integers(*others):
            return f"it passes {'/'.join(t_.kind for t_ in others)} to {call.node.key}"
        return result(*types) if result is not None else _text(*types)

    return signature


def _case_map(source: str, target: str) -> Callable[[exp.Expr], exp.Expr]:
    def rewrite(node: exp.Expr) -> exp.Expr:
        return _ascii_map(node.this, source, target)

    return rewrite


def _cased(call: Call) -> Result:
    collated = _own_collation(call, "this")
    if collated is not None:
        return collated
    if not call.settings.ascii_case:
        if call.settings.unicode_case:
            return NOT_MINE  # (the entries under a Unicode ctype, below)
        return (
            f"it takes {call.node.key}, whose case mapping follows the database's ctype (one "
            "whose mapping the cache did not prove equal to DuckDB's)"
        )
    return _text_of("this")(call)


def _unicode_cased(*modes: str) -> Callable[[Call], Result]:
    """upper or lower where DuckDB's mapping was proven the database's (``modes``)."""

    def signature(call: Call) -> Result:
        if call.settings.ascii_case or call.settings.unicode_case not in modes:
            return NOT_MINE
        if _own_collation(call, "this") is not None:
            return NOT_MINE  # (the reason is the C entry's)
        return _text_of("this")(call)

    return signature


def _upper_keeping_sharp_s(node: exp.Expr) -> exp.Expr:
    """upper of each part between two ß, joined by ß: PostgreSQL's upper keeps ß (and no
    character's upper is ß), DuckDB's alone would give ẞ."""
    parts = _func("string_split", node.this, exp.Literal.string("ß"))
    variable = exp.to_identifier("mtcache_part")
    upper = exp.Lambda(this=exp.Upper(this=exp.column(variable)), expressions=[variable])
    return _func("array_to_string", _func("list_transform", parts, upper), exp.Literal.string("ß"))


entry(
    "upper",
    exp.Upper,
    _cased,
    rewrite=_case_map(_LOWER, _UPPER),
    proofs=("upper(e.t)", "upper(e.c)", "upper('äb')"),
)
entry(
    "lower",
    exp.Lower,
    _cased,
    rewrite=_case_map(_UPPER, _LOWER),
    proofs=("lower(e.t)", "lower(e.v)", "lower('ÄB')"),
)
INITCAP_C = "mtcache_initcap_c"  # PostgreSQL's initcap under the C ctype


def _initcap(call: Call) -> Result:
    collated = _own_collation(call, "this")
    if collated is not None:
        return collated
    if not call.settings.ascii_case:
        return (
            "it takes initcap, whose word boundaries and case mapping follow the database's "
            "ctype (C's only are the cache's)"
        )
    if not _strings(call.type()):
        return f"it takes initcap of {call.type().kind}"
    return _text(call.type())  # (sqlglot adds its own delimiters: not PostgreSQL's argument)


entry(
    "initcap",
    exp.Initcap,
    _initcap,
    rewrite=lambda node: _func(INITCAP_C, node.this),
    proofs=(
        "initcap(e.t)",
        "initcap(e.c)",
        "initcap(e.v)",
        "initcap('hello wORLD-foo_bar 2nd äbc Éx')",
        "initcap('')",
    ),
)
_UNICODE_PROOFS = ("e.t", "e.c", "e.v", "'äöüßẞǆǅǄİıΣσς'", "''")
entry(
    "upper (Unicode ctype keeping ß)",
    exp.Upper,
    _unicode_cased("sharp_s"),
    rewrite=_upper_keeping_sharp_s,
    proofs=tuple(f"upper({p})" for p in _UNICODE_PROOFS),
    ctype="sharp_s",
)
entry(
    "lower (Unicode ctype)",
    exp.Lower,
    _unicode_cased("equal", "sharp_s"),
    proofs=tuple(f"lower({p})" for p in _UNICODE_PROOFS),
    ctype="equal sharp_s",
)
entry(
    "length / char_length",
    exp.Length,
    _text_of("this", result=lambda *_: INT4),
    rewrite=lambda node: exp.Length(this=exp.cast(node.this, "VARCHAR")),
    proofs=("length(e.t)", "char_length(e.c)", "length('ab  ')", "length(e.v)"),
)


def _octet_length(call: Call) -> Result:
    args = [call.of(a) for a in call.node.expressions]
    if len(args) != 1 or not _strings(*args):
        return "it takes octet_length of something other than one string"
    if not call.settings.utf8:
        return "it takes octet_length, which counts bytes of the server's encoding (not UTF8)"
    return INT4


entry(
    "octet_length",
    "octet_length",
    _octet_length,
    rewrite=lambda node: _func("strlen", exp.cast(node.expressions[0], "VARCHAR")),
    proofs=("octet_length(e.t)", "octet_length(e.c)", "octet_length('ÄÖ')", "octet_length(e.v)"),
)
entry(
    "strpos / position",
    exp.StrPosition,
    _text_of("this", "substr", result=lambda *_: INT4),
    proofs=("strpos(e.t, 'b')", "position('' in e.v)", "position(' ' in e.c)", "strpos(e.v, e.c)"),
)


def _substring(call: Call) -> Result:
    found = _text_of("this")(call)
    if isinstance(found, str):
        return found
    start = call.arg("start")
    if start is not None and call.of(start).is_string:
        return NOT_MINE  # substring(s FROM pattern): a regular expression (patterns)
    if start is not None and not _integers(call.of(start)):
        return "its substring start is not an integer"
    length = call.arg("length")
    if length is not None and not _integers(call.of(length)):
        return "its substring length is not an integer"
    return found


def _substring_rewrite(node: exp.Expr) -> exp.Expr:
    """PostgreSQL counts a start below 1 as characters before the string, which shorten the
    length (DuckDB counts a negative start from the end); a negative length raises (DuckDB
    would give '')."""
    start, length = node.args.get("start"), node.args.get("length")
    literal = _literal_int(start) if start is not None else 1
    fixed = _literal_int(length) if length is not None else None
    if length is not None and (fixed is None or fixed < 0):
        length = _error_if(
            exp.LT(this=length.copy(), expression=exp.Literal.number(0)),
            "negative substring length not allowed",
            length,
        )
        node.set("length", length)
    if start is None or (literal is not None and literal >= 1):
        return node
    one = exp.Literal.number(1)
    first = exp.Greatest(this=start.copy(), expressions=[one.copy()])
    node.set("start", first)
    if length is not None:  # the characters from start to start + length, of those from 1
        end = exp.Sub(this=exp.Add(this=start.copy(), expression=length), expression=first.copy())
        node.set("length", exp.Greatest(this=end, expressions=[exp.Literal.number(0)]))
    return node


entry(
    "substring / substr",
    exp.Substring,
    _substring,
    rewrite=_substring_rewrite,
    proofs=(
        "substring(e.t from 2 for 3)",
        "substr(e.c, 1, 2)",
        "substring(e.v from 3)",
        "substring(e.t, 1, e.i2 + 1)",
        "substr(e.v, 2, 0)",
        "substring(e.t from 0 for 3)",
        "substring(e.v from -2 for 4)",
        "substring(e.t from -5)",
        "substr(e.c, e.i2, 2)",
        "substring(e.v from e.i4 - 8)",
        "substr(e.t, -1, 1)",
    ),
    raises=("substring(e.t from 1 for -1)", "substr(e.v, 1, e.i4 - 100)"),
)


def _trim(call: Call) -> Result:
    node = call.node
    if node.args.get("collation"):
        return "it trims with a collation"
    return _text_of("this", "expression")(call)


entry(
    "trim / ltrim / rtrim / btrim",
    exp.Trim,
    _trim,
    proofs=(
        "trim(e.t)",
        "ltrim(e.v)",
        "rtrim(e.c)",
        "btrim(e.v, 'ab')",
        "trim(both 'x' from e.t)",
        "trim(leading from e.v)",
        "rtrim(e.t, ' b')",
    ),
)
entry(
    "replace",
    exp.Replace,
    _text_of("this", "expression", "replacement"),
    proofs=("replace(e.t, 'b', 'X')", "replace(e.c, 'a', '')", "replace(e.v, '', 'x')"),
)
entry(
    "left / right",
    (exp.Left, exp.Right),
    _text_of("this"),
    proofs=("left(e.t, 2)", "right(e.c, 1)", "left(e.v, -1)", "right(e.t, -2)", "left(e.v, e.i2)"),
)


def _pad(call: Call) -> Result:
    found = _text_of("this", "fill_pattern")(call)
    if isinstance(found, str):
        return found
    fill = call.arg("fill_pattern")
    if fill is not None and not _string_literal(fill):
        return "it pads with a fill that is not a literal of at least one character"
    return found


entry(
    "lpad / rpad",
    exp.Pad,
    _pad,
    proofs=(
        "lpad(e.t, 5, '*')",
        "rpad(e.v, 3)",
        "lpad(e.c, 2, 'xy')",
        "rpad(e.t, -1, '*')",
        "lpad(e.v, 0)",
    ),
)
entry(
    "repeat",
    exp.Repeat,
    _text_of("this"),
    proofs=("repeat(e.t, 2)", "repeat(e.c, 0)", "repeat(e.v, -1)"),
)
entry("reverse", exp.Reverse, _text_of("this"), proofs=("reverse(e.t)", "reverse(e.c)"))
entry("md5", exp.MD5, _text_of("this"), proofs=("md5(e.t)", "md5(e.c)", "md5('')"))


def _split_part(call: Call) -> Result:
    found = _text_of("this", "delimiter")(call)
    if isinstance(found, str):
        return found
    part = _literal_int(call.arg("part_index"))
    if part is None or part == 0:
        return "it takes split_part of a field that is not a nonzero literal"
    if not _string_literal(call.arg("delimiter")):
        return "it splits at a delimiter that is not a nonempty literal"
    return found


entry(
    "split_part",
    exp.SplitPart,
    _split_part,
    proofs=(
        "split_part(e.t, ' ', 2)",
        "split_part(e.v, 'b', 1)",
        "split_part(e.t, ' ', -1)",
        "split_part(e.c, 'b', 1)",
    ),
    raises=("split_part(e.t, ' ', 0)",),
)
entry(
    "translate",
    exp.Translate,
    _text_of("this", "from_", "to"),
    proofs=("translate(e.t, 'ab', 'XY')", "translate(e.c, 'a', '')", "translate(e.v, '', 'x')"),
)


def _to_hex(width: int) -> Callable[[Call], Result]:
    def signature(call: Call) -> Result:
        found = call.type()
        if found.kind == "integer" and (found.width or 4) != width:
            return NOT_MINE
        if found.kind != "integer":
            return f"it takes to_hex of {found.kind}"
        return PgType("text")

    return signature


def _to_hex_int4(node: exp.Expr) -> exp.Expr:
    """PostgreSQL prints lower case, and an integer's negative values as 32 bits (DuckDB:
    64)."""
    value = node.this
    negative = exp.LT(this=value.copy(), expression=exp.Literal.number(0))
    wrapped = exp.Add(this=exp.cast(value.copy(), "BIGINT"), expression=exp.Literal.number(2**32))
    unsigned = exp.Case(
        ifs=[exp.If(this=negative, true=wrapped)], default=exp.cast(value, "BIGINT")
    )
    return exp.Lower(this=exp.Hex(this=unsigned))


entry(
    "to_hex(integer)",
    exp.Hex,
    _to_hex(4),
    rewrite=_to_hex_int4,
    proofs=("to_hex(e.i4)", "to_hex(255)", "to_hex(-1)", "to_hex(e.i4 * 0 - 2147483647 - 1)"),
)
entry(
    "to_hex(bigint)",
    exp.Hex,
    _to_hex(8),
    rewrite=lambda node: exp.Lower(this=exp.Hex(this=node.this)),
    proofs=("to_hex(e.i8)", "to_hex(-1::bigint)", "to_hex(e.i8 * 0)"),
)


def _chr(call: Call) -> Result:
    args = call.node.expressions
    if len(args) != 1 or not _integers(call.of(args[0])) or call.node.args.get("charset"):
        return "it takes chr of something other than one integer"
    if call.of(args[0]).width == 8:
        return "it takes chr of a bigint (PostgreSQL has no chr(bigint))"
    return PgType("text")


def _chr_rewrite(node: exp.Expr) -> exp.Expr:
    """chr(0) and code points that are not characters raise in PostgreSQL; DuckDB's chr
    takes an INTEGER (its octet_length or date - date is a BIGINT, PostgreSQL's an int4)."""
    value = node.expressions[0]
    bad = exp.or_(
        exp.LTE(this=value.copy(), expression=exp.Literal.number(0)),
        exp.GT(this=value.copy(), expression=exp.Literal.number(1114111)),
        exp.Between(
            this=value.copy(), low=exp.Literal.number(55296), high=exp.Literal.number(57343)
        ),
    )
    whole = exp.Cast(this=value, to=exp.DataType.build("INTEGER"))
    return _error_if(bad, "requested character not valid", exp.Chr(expressions=[whole]))


entry(
    "chr",
    exp.Chr,
    _chr,
    rewrite=_chr_rewrite,
    proofs=(
        "chr(65)",
        "chr(e.i4 + 65)",
        "chr(228)",
        "chr(8364)",
        "chr(65 + octet_length(e.t) % 26)",
        "chr(65 + (e.d - DATE '1990-01-01') % 26)",
    ),
    raises=("chr(0)", "chr(e.i2 * 0)", "chr(-1)", "chr(55296)"),
)
entry(
    "ascii",
    exp.Ascii,
    _text_of("this", result=lambda *_: INT4),
    proofs=("ascii(e.t)", "ascii(e.c)", "ascii('')", "ascii('Ä')"),
)
entry(
    "starts_with",
    exp.StartsWith,
    _text_of("this", "expression", result=lambda *_: BOOL),
    proofs=("starts_with(e.t, 'A')", "starts_with(e.c, 'ab')", "starts_with(e.v, '')"),
)


_PRINTED = frozenset({"integer", "numeric", "date"}) | STRINGS | {"null"}


def _concat(call: Call) -> Result:
    node = call.node
    args = node.expressions
    types = [call.of(a) for a in args]
    for found in types:
        if found.kind not in _PRINTED:
            return f"it concatenates {found.kind}, which DuckDB prints differently"
    if isinstance(node, exp.ConcatWs) and not _strings(types[0]):
        return "its concat_ws separator is not a string"
    return _text(*types)


entry(
    "concat / concat_ws",
    (exp.Concat, exp.ConcatWs),
    _concat,
    proofs=(
        "concat(e.t, e.i4, e.c)",
        "concat(e.v, NULL, 'x')",
        "concat_ws('-', e.c, e.v, e.n)",
        "concat(e.d, e.n0)",
        "concat_ws(',', NULL, e.t)",
    ),
)


def _dpipe(call: Call) -> Result:
    a, b = call.type(), call.type("expression")
    if not (a.is_string or b.is_string) and not {a.kind, b.kind} & {"null"}:
        return "it applies || to values that are not text"
    for found in (a, b):
        if found.kind not in _PRINTED:
            return f"it concatenates {found.kind}, which DuckDB prints differently"
    return _text(a, b)


entry(
    "||",
    exp.DPipe,
    _dpipe,
    proofs=(
        "e.t || e.v",
        "e.c || '!'",
        "'<' || e.c || '>'",
        "e.t || e.i4",
        "e.n || 'x'",
        "e.d || ''",
        "e.t || NULL",
    ),
)
