"""Plans and run-time guard decisions from data (tests/fixtures/plans/*.toml, read by
tests/plan_cases.py): statement + catalog + cache schema + estimates + region state + session
in, plan and decision out. Pure: no PostgreSQL, DuckDB file or Spark."""

from __future__ import annotations

import pytest

from tests.plan_cases import (
    PlanCase,
    consistency_summary,
    load_plan_cases,
    misses_summary,
    plan_summary,
)

CASES = load_plan_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan_and_decision(case: PlanCase) -> None:
    expect = case.spec
    plan = case.plan()
    assert plan_summary(plan) == expect["plan"]
    if "consistency" in expect:
        assert consistency_summary(plan) == expect["consistency"]
    if "explain" in expect:
        assert plan.render() == expect["explain"].strip().splitlines()
    decision = case.decide(plan)
    assert str(decision) == expect["decision"]
    if "misses" in expect:
        assert misses_summary(decision) == expect["misses"]


def test_guards_that_read_no_parameter_decide_alike_for_any_values() -> None:
    """What lets the decision memo keep one decision for all values of such a plan."""
    reading = 0
    for case in CASES:
        plan = case.plan()
        if plan.guards_read_parameters:
            reading += 1
        else:
            assert str(case.decide(plan, None)) == str(case.decide(plan)), case.id
    assert 0 < reading < len(CASES)  # both kinds are among the cases


def test_every_fixture_file_has_cases() -> None:
    files = {c.file for c in CASES}
    assert {"section_4_7_3", "section_5_2", "fig_7_2", "session"} <= files
