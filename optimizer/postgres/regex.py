"""Which regular expressions PostgreSQL and DuckDB match alike, extent included.

Whether a pattern matches at all (``~``) is the same in PostgreSQL's ARE and DuckDB's RE2 for
the syntax both read alike (`optimizer.postgres.allowlist.patterns`). *Where* the match ends is
not: among the matches starting leftmost, PostgreSQL takes the longest (a greedy pattern), RE2
the first its preferences find (Perl's), so ``regexp_replace('xxy', 'x*(xy)?', '-')`` differs.
They agree when matching never has a choice to make: every repetition whose count can vary
(``*``, ``+``, ``?``, ``{m,n}``) repeats a set of characters that nothing able to come next can
start with, so the next character alone decides whether the repetition goes on (`deterministic`).
On such a pattern each start has at most one way to match each prefix of the text, both engines
take the longest one there is, and each group matches the same characters in both.

The class (`parse`): ``^`` first and ``$`` last only; literal characters (punctuation escaped
with a backslash), ``.``, bracket expressions of ASCII characters and ranges (``[a-z0-9_]``,
``[^,]``); parentheses that group (not repeated, no ``|`` anywhere); greedy quantifiers up to
255 (PostgreSQL's limit). Anything else - alternation, ``\\d`` and the other escapes, classes
such as ``[:alpha:]``, back references, lazy quantifiers, flags - keeps the call at the
backend. ``.`` and ``[^...]`` match a newline in PostgreSQL: DuckDB is given ``(?s)``
(`for_duckdb`).
"""

from __future__ import annotations

from dataclasses import dataclass

_SPECIAL = set("\\[](){}|*+?.^$")
_MAX_REPEAT = 255  # PostgreSQL's DUPMAX


@dataclass(frozen=True)
class CharSet:
    """The characters an atom matches: ``chars``, or every other one when ``negated``."""

    chars: frozenset[str]
    negated: bool = False

    def disjoint(self, other: CharSet) -> bool:
        if self.negated and other.negated:
            return False  # both hold every character but finitely many
        if self.negated:
            return other.chars <= self.chars
        if other.negated:
            return self.chars <= other.chars
        return not self.chars & other.chars


ANY = CharSet(frozenset(), negated=True)


@dataclass(frozen=True)
class Item:
    chars: CharSet
    least: int
    most: int


@dataclass(frozen=True)
class Pattern:
    items: tuple[Item, ...]
    groups: int  # capturing parentheses
    anchored_end: bool

    @property
    def deterministic(self) -> bool:
        """Whether every varying repetition's characters are disjoint from what may follow
        it (see the module)."""
        for index, item in enumerate(self.items):
            if item.least == item.most:
                continue
            for after in self.items[index + 1 :]:
                if not item.chars.disjoint(after.chars):
                    return False
                if after.least > 0:
                    break
        return True

    @property
    def may_be_empty(self) -> bool:
        return all(item.least == 0 for item in self.items)


def parse(pattern: str) -> Pattern | None:
    """The pattern in the class both engines read alike, or None."""
    items: list[Item] = []
    groups = depth = 0
    position = 0
    anchored_end = False
    if pattern.startswith("^"):
        position = 1
    while position < len(pattern):
        char = pattern[position]
        if anchored_end:
            return None  # something after $
        if char == "$":
            if position != len(pattern) - 1:
                return None
            anchored_end = True
            position += 1
            continue
        if char == "(":
            if pattern.startswith("(?", position):
                return None
            groups, depth, position = groups + 1, depth + 1, position + 1
            continue
        if char == ")":
            depth -= 1
            if depth < 0:
                return None
            position += 1
            if position < len(pattern) and pattern[position] in "*+?{":
                return None  # a repeated group
            continue
        if char == ".":
            chars, position = ANY, position + 1
        elif char == "[":
            found = _bracket(pattern, position)
            if found is None:
                return None
            chars, position = found
        elif char == "\\":
            escaped = pattern[position + 1 : position + 2]
            if not escaped or escaped not in _SPECIAL:
                return None  # \d, \w, back references, ...: read differently
            chars, position = CharSet(frozenset(escaped)), position + 2
        elif char in _SPECIAL:
            return None  # |, a quantifier with nothing to repeat, a lone } ...
        else:
            chars, position = CharSet(frozenset(char)), position + 1
        quantified = _quantifier(pattern, position)
        if quantified is None:
            return None
        least, most, position = quantified
        items.append(Item(chars, least, most))
    if depth != 0:
        return None
    return Pattern(tuple(items), groups, anchored_end)


def _bracket(pattern: str, start: int) -> tuple[CharSet, int] | None:
    """``[...]`` of ASCII characters and ranges, from ``start`` (its ``[``)."""
    position = start + 1
    negated = pattern.startswith("^", position)
    if negated:
        position += 1
    chars: set[str] = set()
    first = position
    while position < len(pattern) and pattern[position] != "]":
        char = pattern[position]
        if char in "[\\" or not char.isascii() or not char.isprintable():
            return None
        if (
            char != "-"
            and pattern[position + 1 : position + 2] == "-"
            and pattern[position + 2 : position + 3] not in ("]", "")
        ):
            end = pattern[position + 2]
            if end in "[\\" or not end.isascii() or end < char:
                return None
            chars |= {chr(c) for c in range(ord(char), ord(end) + 1)}
            position += 3
            if (
                pattern[position : position + 1] == "-"
                and pattern[position + 1 : position + 2] != "]"
            ):
                return None  # a range right after a range: PostgreSQL raises (2201B)
            continue
        chars.add(char)
        position += 1
    if position >= len(pattern) or position == first:
        return None  # unclosed, or []... (a ] first is a member in both, not followed here)
    return CharSet(frozenset(chars), negated), position + 1


def _quantifier(pattern: str, position: int) -> tuple[int, int, int] | None:
    """(least, most, position after) of the quantifier at ``position``, if any (a lazy one
    ends in ``?``: None)."""
    found = pattern[position : position + 1]
    if found == "*":
        least, most, position = 0, _MAX_REPEAT + 1, position + 1
    elif found == "+":
        least, most, position = 1, _MAX_REPEAT + 1, position + 1
    elif found == "?":
        least, most, position = 0, 1, position + 1
    elif found == "{":
        end = pattern.find("}", position)
        if end < 0:
            return None
        bounds = pattern[position + 1 : end].split(",")
        if len(bounds) > 2 or not all(_count(b) for b in bounds if b) or not bounds[0]:
            return None  # (a leading zero: PostgreSQL reads {01} as {1}, RE2 as text)
        least = int(bounds[0])
        if len(bounds) == 1:
            most = least
        elif bounds[1] == "":
            most = _MAX_REPEAT + 1
        else:
            most = int(bounds[1])
            if most > _MAX_REPEAT:
                return None  # PostgreSQL raises (2201B)
        if least > _MAX_REPEAT or (most <= _MAX_REPEAT and most < least) or most == 0:
            return None
        position = end + 1
    else:
        return 1, 1, position
    if pattern[position : position + 1] in ("?", "*", "+", "{"):
        return None  # lazy, or repeated twice
    return least, most, position


def _count(text: str) -> bool:
    """A repetition count both engines read alike: digits without a leading zero."""
    return text.isdigit() and (text == "0" or not text.startswith("0")) and len(text) <= 3


def readable(pattern: str) -> bool:
    """Whether the bracket expressions and repetition counts of a pattern (whatever else it
    holds) are read alike by both engines: no range right after a range, counts without a
    leading zero and at most 255 (for `~`, which only asks whether a pattern matches)."""
    position = 0
    while position < len(pattern):
        char = pattern[position]
        if char == "\\":
            position += 2
            continue
        if char == "[":
            found = _bracket(pattern, position)
            if found is None:
                return False
            position = found[1]
            continue
        if char == "{":
            end = pattern.find("}", position)
            bounds = pattern[position + 1 : end].split(",") if end > 0 else []
            if not bounds or not bounds[0] or not all(_count(b) for b in bounds if b):
                return False
            if any(b and int(b) > _MAX_REPEAT for b in bounds):
                return False
            position = end + 1
            continue
        position += 1
    return True


def for_duckdb(pattern: str) -> str:
    """The pattern as DuckDB is given it: ``.`` matching a newline, as PostgreSQL's does."""
    return "(?s)" + pattern


def replacement(text: str, groups: int) -> str | None:
    """A regexp_replace replacement in RE2's syntax (``\\&`` is ``\\0``), or None where it is
    read differently (another escape, a group the pattern does not have)."""
    out = []
    position = 0
    while position < len(text):
        char = text[position]
        if char != "\\":
            out.append(char)
            position += 1
            continue
        escaped = text[position + 1 : position + 2]
        if escaped == "&":
            out.append("\\0")
        elif escaped == "\\":
            out.append("\\\\")
        elif escaped.isdigit() and escaped != "0" and int(escaped) <= groups:
            out.append("\\" + escaped)
        else:
            return None
        position += 2
    return "".join(out)
