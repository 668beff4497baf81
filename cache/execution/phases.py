"""Where a statement's time goes, phase by phase (the guard-overhead experiment turns it on,
experiments/runs/guard_overhead.py; off, the cursor pays one attribute test per phase).

The phases of the dissertation's Table 4.5, as this cache has them: ``lookup`` (routing the
statement and finding its plan: the setup), ``guard`` (evaluating the guards), ``run``
(DuckDB or PostgreSQL producing the rows, converted to PostgreSQL's types); the application's
fetch is timed by whoever fetches.
"""

from __future__ import annotations

import time
from collections import defaultdict


class Phases:
    def __init__(self) -> None:
        self.totals: defaultdict[str, float] = defaultdict(float)
        self._at = 0.0

    def start(self) -> None:
        self._at = time.perf_counter()

    def mark(self, phase: str) -> None:
        """The time since the last mark (or start) goes to ``phase``."""
        now = time.perf_counter()
        self.totals[phase] += now - self._at
        self._at = now

    def take(self) -> dict[str, float]:
        """The phases' times so far, and a fresh start."""
        found = dict(self.totals)
        self.totals.clear()
        return found
