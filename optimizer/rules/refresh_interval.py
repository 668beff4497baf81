"""The refresh interval of a `REFRESH AUTO` view, chosen from the bounds its queries ask.

Each query that reads a view under a currency bound B asks for the view's data to be at most B
old; answered locally, it saves the backend the work the cost model estimates for it (the
statement's backend cost less the local plan's, in PostgreSQL's cost units). With the view
refreshed every f and each refresh landing d after its snapshot (§4.6), a query finds the data
fresh enough with probability p(B, d, f) (`optimizer.rules.estimate_cost.local_probability`).
Over a second, the asks save

    S(f) = sum over the bounds asked of  rate(B) * p(B, d, f)

(rate(B): the backend cost per second of the queries asking B), and the pulls cost C / f
(C: one refresh's backend cost). The interval chosen maximizes S(f) - C / f; no interval at
all (the view is not refreshed) when that is not above what no refresh saves: the queries
that accept data of any age, which any copy answers.

S(f) - C/f is monotone between the breakpoints f = B - d (below one, a bound is always met;
above, its share falls as 1/f, as the pulls' cost does), so its maximum over f >= the
shortest interval is at one of them or at the shortest: the choice is exact, not searched.

A view with an objective (`REFRESH AUTO WITHIN W`) is kept however little its reads save: its
data must be at most W old, so f + L <= W, L the longest a refresh took to land lately (not
the median d: an objective is about every cycle), with a tenth of W - L kept as a margin for
the scheduler waking late and a pull slower than any seen.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from optimizer.rules.estimate_cost import local_probability

SHORTEST_INTERVAL = 1.0  # seconds: no view is refreshed more often (the scheduler's tick)
OBJECTIVE_MARGIN = 0.1  # the share of W - L an objective's interval leaves unused


@dataclass(frozen=True)
class IntervalChoice:
    """A view's chosen interval (None: not refreshed), the bounds it serves (those its
    interval meets every time), and why, in a sentence."""

    interval: float | None
    served: tuple[float, ...]
    reason: str
    saves: float = 0.0  # the net backend cost saved per hour at that interval (cost units)


def net_per_second(
    rates: Mapping[float, float], delay: float, pull_cost: float, interval: float | None
) -> float:
    """S(f) - C/f: what the asks' local answers save per second, less the pulls (with no
    refresh: what the queries accepting any age save)."""
    saved = sum(rate * local_probability(b, delay, interval) for b, rate in rates.items())
    return saved if interval is None else saved - pull_cost / interval


def choose_interval(
    rates: Mapping[float, float],
    delay: float,
    pull_cost: float,
    within: float | None = None,
    landing: float | None = None,
    shortest: float = SHORTEST_INTERVAL,
) -> IntervalChoice:
    """The interval that saves the backend most (see the module): ``rates`` maps each bound
    asked (seconds; inf: any age) to the backend cost per second of the queries asking it,
    ``delay`` is d, ``pull_cost`` one refresh's backend cost, ``within`` the objective and
    ``landing`` the longest a refresh took to land lately (default: d)."""
    shortest = max(shortest, delay, 1e-9)
    landing = max(delay, landing or 0.0)
    longest = math.inf
    if within is not None:
        longest = (within - landing) * (1.0 - OBJECTIVE_MARGIN)
        if longest < shortest:
            return IntervalChoice(
                shortest,
                _served(rates, delay, shortest),
                f"objective {_seconds(within)} cannot be met: a refresh takes up to "
                f"{_seconds(landing)} to land and runs at most every {_seconds(shortest)}; "
                "refreshed as often as it can",
            )
    asked = {b: r for b, r in rates.items() if r > 0}
    unrefreshed = asked.get(math.inf, 0.0)  # what no refresh saves: any copy serves any age
    candidates = {shortest} | {b - delay for b in asked if b != math.inf}
    if longest != math.inf:
        candidates.add(longest)
    candidates = {f for f in candidates if shortest <= f <= longest}
    best = max(candidates, key=lambda f: (net_per_second(asked, delay, pull_cost, f), f))
    net = net_per_second(asked, delay, pull_cost, best) - unrefreshed
    if within is not None:
        served = _served(asked, delay, best)
        why = f"objective {_seconds(within)}: kept at most {_seconds(best + landing)} old"
        if net > 0:
            why += f"; saves the backend {net * 3600:.4g} cost units an hour"
        return IntervalChoice(best, served, why, net * 3600)
    if not asked:
        return IntervalChoice(None, (), "no query asked for it lately: not refreshed")
    if unrefreshed and len(asked) == 1:
        return IntervalChoice(
            None, (math.inf,), "its queries accept data of any age: not refreshed"
        )
    if net <= 0:
        saved = sum(asked.values()) * 3600
        return IntervalChoice(
            None,
            (),
            f"a refresh costs the backend more than the local answers would save (at most "
            f"{saved:.4g} cost units an hour; a refresh costs {pull_cost:.4g}): not refreshed, "
            "its queries go to the backend",
        )
    served = _served(asked, delay, best)
    return IntervalChoice(
        best,
        served,
        f"every {_seconds(best)} serves bounds of {', '.join(map(_seconds, served))} and saves "
        f"the backend {net * 3600:.4g} cost units an hour",
        net * 3600,
    )


def upquery_gain(
    recent: Mapping[float, float], age: float, delay: float, pull_cost: float, until_due: float
) -> float:
    """What refreshing now, ahead of the schedule, saves the backend net of its pull (an
    upquery in Noria's sense: reads that just missed pull the data in): ``recent`` maps each
    bound asked just now to the backend cost per second of those reads, ``age`` is the data's
    age, ``until_due`` the wait for the scheduled refresh (inf: none). Each bound the data
    fails now (B < age) but a refresh meets (B > d) is served from when the refresh lands for
    B - d seconds, or until the scheduled refresh would have landed anyway; the steady choice
    (`choose_interval`) reads the same bounds at their hourly rate, so this pays only for a
    burst above it."""
    gain = sum(
        rate * min(bound - delay, until_due)
        for bound, rate in recent.items()
        if delay < bound < age and bound != math.inf
    )
    return gain - pull_cost


def _served(rates: Mapping[float, float], delay: float, interval: float) -> tuple[float, ...]:
    return tuple(sorted(b for b in rates if local_probability(b, delay, interval) >= 1.0))


def _seconds(value: float) -> str:
    return "any age" if value == math.inf else f"{round(value, 3):g} s"
