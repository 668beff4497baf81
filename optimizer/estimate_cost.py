"""Cost of a guarded access (§4.6): a SwitchUnion runs its local branch with probability p.

Refresh is periodic with interval f and delay d, and queries arrive uniformly over a cycle.
Right after a refresh the local data is d old; it ages to d + f before the next one. A query
with bound B finds it fresh enough during B - d of every f seconds:

    p = 0            if B - d <= 0
    p = (B - d) / f  if 0 < B - d <= f
    p = 1            if B - d > f

f = 0 models continuous propagation: p = 1 when B > d, else 0.
"""

from __future__ import annotations

DEFAULT_DELAY = 1.0  # seconds a refresh takes to land (d of §4.6), until measured


def below_delay(bound: float, delay: float = DEFAULT_DELAY) -> bool:
    """§4.4's compile-time rule: a bound no larger than the refresh delay can never be met by
    a cached copy, so plans (and the executor following them) do not try."""
    return bound <= delay


def local_probability(bound: float, delay: float, interval: float | None) -> float:
    """p for bound B, refresh delay d and refresh interval f (None: never refreshed on a
    schedule, so only data refreshed on demand can serve, which a cost model cannot count on:
    p = 0 unless the bound is unlimited)."""
    if bound < 0 or delay < 0:
        raise ValueError("bounds and delays are durations: 0 or more")
    slack = bound - delay
    if slack <= 0:
        return 0.0
    if interval is None:
        return 1.0 if bound == float("inf") else 0.0
    if interval <= 0:
        return 1.0
    return min(1.0, slack / interval)


def guarded_cost(p: float, local: float, remote: float, guard: float) -> float:
    """Expected cost of a SwitchUnion: p*c_local + (1 - p)*c_remote + c_guard."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p is a probability, got {p}")
    return p * local + (1.0 - p) * remote + guard
