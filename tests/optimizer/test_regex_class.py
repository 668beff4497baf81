"""The regular expressions whose match PostgreSQL and DuckDB end alike
(`optimizer.postgres.regex`), without a database: what the class takes, what it refuses, and
why (their answers are compared with PostgreSQL's in tests/optimizer/test_allowlist.py)."""

from __future__ import annotations

import pytest

from optimizer.postgres import regex


@pytest.mark.parametrize(
    "pattern",
    [
        "[0-9]+",
        "^[A-Za-z]+",
        "a(.)c",
        "([a-z]+)#([0-9]+)",
        "[^,]*,",
        "x*$",
        "^ *",
        "q{2,3}",
        "Ä",
        "",
        "\\.[0-9]{2}$",
        "[a-z]+ [0-9]",
    ],
)
def test_patterns_whose_match_never_has_a_choice_are_taken(pattern: str) -> None:
    found = regex.parse(pattern)
    assert found is not None and found.deterministic, pattern


@pytest.mark.parametrize(
    "pattern",
    [
        "x*(xy)?",  # a repeated group
        "a|ab",  # alternation: PostgreSQL takes the longest branch
        "\\d+",  # escapes PostgreSQL reads by its locale
        "[[:alpha:]]",
        "a*?",  # lazy
        "(?i)a",
        "a{256}",  # beyond PostgreSQL's limit
        "a$b",
        "(a",
        "[a-",
        "[é-z]",
        "[a-c-e]",  # a range right after a range: PostgreSQL raises
        "x{1,300}",  # beyond 255: PostgreSQL raises
        "x{01}",  # RE2 reads a leading zero's braces as text
        "x{1,02}",
    ],
)
def test_patterns_outside_the_class_are_refused(pattern: str) -> None:
    assert regex.parse(pattern) is None, pattern


@pytest.mark.parametrize(
    "pattern",
    ["a*a", ".*x", "[a-z]*[aeiou]", "a?ab", "[^x]*y*[^z]"],
)
def test_a_repetition_meeting_what_may_follow_is_not_deterministic(pattern: str) -> None:
    """Where a varying repetition's characters may also start what follows, PostgreSQL's
    longest match and RE2's preferred one can differ."""
    found = regex.parse(pattern)
    assert found is not None and not found.deterministic, pattern


def test_replacements_are_translated_or_refused() -> None:
    assert regex.replacement("<\\&>", 0) == "<\\0>"
    assert regex.replacement("\\2-\\1", 2) == "\\2-\\1"
    assert regex.replacement("\\\\", 0) == "\\\\"
    assert regex.replacement("\\3", 2) is None  # a group the pattern does not have
    assert regex.replacement("\\n", 0) is None
    assert regex.for_duckdb("a.c") == "(?s)a.c"
