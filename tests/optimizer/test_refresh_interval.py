"""The interval a `REFRESH AUTO` view is refreshed at, chosen from the bounds its queries ask
(`optimizer.rules.refresh_interval`). No database needed."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from optimizer.rules.refresh_interval import choose_interval, net_per_second, upquery_gain


def test_tighter_bounds_shrink_the_interval() -> None:
    loose = choose_interval({600.0: 5.0}, delay=1.0, pull_cost=100.0)
    tight = choose_interval({30.0: 5.0}, delay=1.0, pull_cost=100.0)
    tighter = choose_interval({5.0: 5.0}, delay=1.0, pull_cost=10.0)
    assert loose.interval == 599.0 and loose.served == (600.0,)
    assert tight.interval == 29.0 and tight.served == (30.0,)
    assert tighter.interval == 4.0 and tighter.served == (5.0,)
    assert "every 4 s serves bounds of 5 s" in tighter.reason


def test_no_reads_no_refresh() -> None:
    choice = choose_interval({}, delay=1.0, pull_cost=1.0)
    assert choice.interval is None and "no query asked" in choice.reason
    assert choose_interval({30.0: 0.0}, delay=1.0, pull_cost=1.0).interval is None


def test_a_refresh_dearer_than_what_it_saves_is_left_to_the_backend() -> None:
    # a 5 s bound asked at 0.01 cost units a second; a pull costs 1000: refreshing every 4 s
    # would cost 250 a second to save 0.01
    choice = choose_interval({5.0: 0.01}, delay=1.0, pull_cost=1000.0)
    assert choice.interval is None
    assert "costs the backend more than the local answers would save" in choice.reason


def test_bounds_below_the_delay_are_never_served() -> None:
    choice = choose_interval({2.0: 100.0}, delay=3.0, pull_cost=1.0)
    assert choice.interval is None


def test_any_age_needs_no_refresh() -> None:
    choice = choose_interval({math.inf: 50.0}, delay=1.0, pull_cost=1.0)
    assert choice.interval is None and "any age" in choice.reason


def test_a_mix_serves_the_bounds_that_pay() -> None:
    # many reads at 10 min, few at 5 s: refreshing every 4 s for the few costs more than it
    # saves, so the interval serves the 10 min bound (and the 5 s one part of the time)
    choice = choose_interval({5.0: 0.5, 600.0: 20.0}, delay=1.0, pull_cost=50.0)
    assert choice.interval == 599.0 and choice.served == (600.0,)
    # when the 5 s reads are worth it, it serves both
    both = choose_interval({5.0: 500.0, 600.0: 20.0}, delay=1.0, pull_cost=50.0)
    assert both.interval == 4.0 and both.served == (5.0, 600.0)


def test_an_objective_keeps_a_view_nobody_reads() -> None:
    # a tenth of W - L is kept as a margin: (30 - 2) * 0.9
    choice = choose_interval({}, delay=2.0, pull_cost=1000.0, within=30.0)
    assert choice.interval == pytest.approx(25.2) and "objective 30 s" in choice.reason
    # and caps the interval the reads would choose
    capped = choose_interval({600.0: 5.0}, delay=2.0, pull_cost=1.0, within=30.0)
    assert capped.interval == pytest.approx(25.2)
    # the longest landing counts, not the median delay
    slow = choose_interval({}, delay=2.0, pull_cost=1.0, within=30.0, landing=12.0)
    assert slow.interval == pytest.approx(16.2)


def test_an_objective_that_cannot_be_met_says_so() -> None:
    choice = choose_interval({}, delay=5.0, pull_cost=1.0, within=4.0)
    assert choice.interval == 5.0 and "cannot be met" in choice.reason
    late = choose_interval({}, delay=0.5, pull_cost=1.0, within=4.0, landing=3.5)
    assert late.interval == 1.0 and "takes up to 3.5 s to land" in late.reason


@given(
    rates=st.dictionaries(
        st.sampled_from([2.0, 5.0, 30.0, 120.0, 600.0, math.inf]),
        st.floats(0.0, 1e4, allow_nan=False),
        max_size=6,
    ),
    delay=st.floats(0.0, 10.0, allow_nan=False),
    pull_cost=st.floats(0.0, 1e6, allow_nan=False),
    other=st.floats(1.0, 1e5, allow_nan=False),
)
def test_the_choice_is_the_best_interval(
    rates: dict[float, float], delay: float, pull_cost: float, other: float
) -> None:
    """No interval at least the shortest saves more than the one chosen (or than none)."""
    choice = choose_interval(rates, delay, pull_cost)
    best = net_per_second(rates, delay, pull_cost, choice.interval)
    tolerance = 1e-9 * max(1.0, abs(best))
    assert net_per_second(rates, delay, pull_cost, None) <= best + tolerance
    if other >= max(1.0, delay):
        assert net_per_second(rates, delay, pull_cost, other) <= best + tolerance
    if choice.interval is not None:
        assert best > net_per_second(rates, delay, pull_cost, None)


@pytest.mark.parametrize("within", [10.0, 60.0])
def test_an_objective_is_met(within: float) -> None:
    choice = choose_interval(
        {5.0: 1.0, 600.0: 1.0}, delay=2.0, pull_cost=10.0, within=within, landing=3.0
    )
    assert choice.interval is not None and choice.interval + 3.0 <= within


def test_a_burst_of_missed_reads_pays_for_a_refresh_now() -> None:
    # 100 cost units a second asking 5 s of data 60 s old: a refresh (cost 50) serves them for
    # the next 4 s
    assert (
        upquery_gain({5.0: 100.0}, age=60.0, delay=1.0, pull_cost=50.0, until_due=math.inf) == 350.0
    )
    # the scheduled refresh lands in 2 s anyway: only those 2 s count
    assert upquery_gain({5.0: 100.0}, age=60.0, delay=1.0, pull_cost=50.0, until_due=2.0) == 150.0
    # a trickle does not pay
    assert upquery_gain({5.0: 1.0}, age=60.0, delay=1.0, pull_cost=50.0, until_due=math.inf) < 0
    # bounds the data meets now, or no refresh could meet, gain nothing
    assert upquery_gain({600.0: 100.0, 0.5: 100.0}, 60.0, 1.0, 50.0, math.inf) == -50.0
