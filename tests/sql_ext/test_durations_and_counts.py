"""Durations as the cache reads them wherever one is taken (no database): the clause's words
and PostgreSQL's forms of its time settings, and a number alone in the unit of the PostgreSQL
setting an option is named after; and counts as messages write them."""

from __future__ import annotations

import datetime as dt

import pytest

from cache.engine.engine import bound_seconds
from cache.tools.cli.serve import MS, duration_option
from sql_ext import parse_duration
from sql_ext.errors import ProgrammingError, SqlSyntaxError
from sql_ext.nodes import plural

FORMS = [
    ("10 MIN", 600.0),
    ("500 MS", 0.5),
    ("1.5 SECONDS", 1.5),
    ("500ms", 0.5),
    ("2s", 2.0),
    ("2 s", 2.0),
    ("10min", 600.0),
    ("1h", 3600.0),
    ("1d", 86400.0),
    ("250us", 0.00025),
    ("0s", 0.0),
]


@pytest.mark.parametrize("text, seconds", FORMS)
def test_the_clauses_words_and_postgresqls_forms(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert bound_seconds(text) == seconds


@pytest.mark.parametrize("text", ["2", "soon", "5 parsecs", "-2s", "2 s s"])
def test_what_is_not_a_duration_is_refused_with_what_to_write(text: str) -> None:
    with pytest.raises(SqlSyntaxError, match="is not a duration"):
        parse_duration(text)
    with pytest.raises(ProgrammingError, match=r"write one like '10 min' or '2s'"):
        bound_seconds(text, "--pool-timeout")


def test_a_number_alone_is_in_the_unit_of_the_setting_an_option_is_named_after() -> None:
    assert parse_duration("2000", MS) == 2.0
    assert parse_duration(" 1.5 ", 1.0) == 1.5
    assert bound_seconds("2000", "--statement-timeout", MS) == 2.0
    assert duration_option("2000", "--statement-timeout", MS) == 2.0  # PostgreSQL's ms
    assert duration_option("2s", "--statement-timeout", MS) == 2.0
    assert duration_option("0", "--statement-timeout", MS) is None  # 0: no limit, as PostgreSQL
    with pytest.raises(SqlSyntaxError, match="give 0 or more"):
        parse_duration("-5", MS)
    with pytest.raises(ProgrammingError, match="is not a duration"):
        duration_option("2000", "--pool-timeout")  # (an option of ours: a unit is asked for)


def test_numbers_and_timedeltas_are_seconds() -> None:
    assert bound_seconds(2) == 2.0
    assert bound_seconds(dt.timedelta(minutes=1)) == 60.0
    assert bound_seconds(None) is None


def test_a_count_and_its_noun() -> None:
    """Messages count as English does ("1 region", not "1 regions")."""
    assert [plural(n, "region") for n in (0, 1, 2)] == ["0 regions", "1 region", "2 regions"]
