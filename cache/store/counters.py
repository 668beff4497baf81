"""The cache's counters, one registry: `Counter` names each thing the cache counts (its value is
the name the cache file keeps in ``mtcache.counters`` and the status document shows under
``counters``) and carries what every reader needs of it: what it counts (``help``), and the
Prometheus sample it is (``series``: a name, labels and the family's help) for ``/metrics``
and SHOW CACHE STATS (`cache.engine.stats.counter_samples`). Counts are kept by member
(`Counts`, `Counter.zeros`): mypy rejects a counter that is not one, as it could not a string.

`CounterEnum` is the registry's shape, for counters kept elsewhere and shown the same way (the
server's paths, `cache.server.counters`).
"""

from __future__ import annotations

import enum
import typing as t
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Series:
    """Where a counter shows among the samples: a sample name of Prometheus's (``..._total``),
    its family's help (the same for each member of a family) and the labels that tell the
    family's members apart."""

    name: str
    help: str
    labels: tuple[tuple[str, str], ...] = ()


class CounterEnum(enum.StrEnum):
    """A registry of counters: each member a name (its value), what it counts and its sample.
    Subclassed with members (`Counter`; the server's `cache.server.counters.ServerCounter`)."""

    _value_: str
    help: str  # what it counts
    series: Series

    def __new__(cls, value: str, help: str, series: Series) -> t.Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.help = help
        member.series = series
        return member

    @classmethod
    def zeros(cls) -> dict[t.Self, int]:
        """Every member at 0, in the registry's order."""
        return dict.fromkeys(cls, 0)


ACCESSES = "table accesses of cached reads, by where they were answered"
GUARDS = "guard failures sending an access to the backend, by kind"
MEMO = "local answers looked up in the result memo or a lookup index"


def _accesses(outcome: str) -> Series:
    return Series("mtcache_accesses_total", ACCESSES, (("outcome", outcome),))


def _guards(kind: str) -> Series:
    return Series("mtcache_guard_failures_total", GUARDS, (("kind", kind),))


def _memo(result: str) -> Series:
    return Series("mtcache_memo_lookups_total", MEMO, (("result", result),))


class Counter(CounterEnum):
    """What the cache counts, saved in the cache file (a row each, in this order, made when
    the file opens), shown by `mtcache status` and sampled for ``/metrics``."""

    HITS = "hits", "table accesses of cached reads answered from a cached view", _accesses("local")
    PRESENCE_MISSES = (
        "presence_misses",
        "accesses sent to the backend because a presence region was not cached",
        _guards("presence"),
    )
    CURRENCY_MISSES = (
        "currency_misses",
        "accesses sent to the backend because the cached data was older than the bound",
        _guards("currency"),
    )
    REMOTE = (
        "remote",
        "reads the backend answered, whole or in part (passed through, planned or sent "
        "there, the remote part of a mixed answer)",
        _accesses("remote"),
    )
    MEMO_HITS = (
        "memo_hits",
        "local answers reused from memory (the result memo or a lookup index)",
        _memo("hit"),
    )
    MEMO_MISSES = (
        "memo_misses",
        "local answers the result memo did not have (run, then kept in it)",
        _memo("miss"),
    )
    COMPLETENESS_MISSES = (
        "completeness_misses",
        "accesses sent to the backend because a completeness region was missing",
        _guards("completeness"),
    )
    CONSISTENCY_MISSES = (
        "consistency_misses",
        "accesses sent to the backend because regions present and fresh shared no snapshot "
        "their consistency class needs",
        _guards("consistency"),
    )
    TIMELINE_MISSES = (
        "timeline_misses",
        "accesses sent to the backend because the cached data was older than the session's "
        "timeline floor or its own writes",
        _guards("timeline"),
    )
    EVICTIONS = (
        "evictions",
        "presence keys the size budget evicted",
        Series("mtcache_evictions_total", "presence regions the size budget evicted"),
    )
    BUDGET_OVERRUNS = (
        "budget_overruns",
        "stream batches that landed over the size budget (nothing left to evict)",
        Series(
            "mtcache_budget_overruns_total",
            "stream batches that landed over the size budget (nothing left to evict)",
        ),
    )
    DEFERRED_ADMISSIONS = (
        "deferred_admissions",
        "first misses of a key the doorkeeper did not admit (`cache.engine.admission`)",
        Series(
            "mtcache_deferred_admissions_total",
            "first misses of a key the doorkeeper did not admit",
        ),
    )


Counts = dict[Counter, int]  # a count per counter (a session's, the engine's, the file's)
_NAMED: dict[str, Counter] = {c.value: c for c in Counter}


def named(name: str) -> Counter | None:
    """The counter of this name (None: not one of this version's, say a newer one's in the
    cache file)."""
    return _NAMED.get(name)


def as_document(counts: Mapping[Counter, int]) -> dict[str, int]:
    """The status document's ``counters`` (docs/json-outputs.md): the counts by name, in the
    order given."""
    return {counter.value: value for counter, value in counts.items()}


E = t.TypeVar("E", bound=CounterEnum)


def by_family(members: Iterable[E]) -> list[E]:
    """The members with those of one sample name together (Prometheus's text gives a family's
    samples at once), families in the order of their first member, each's members in order."""
    families: dict[str, list[E]] = {}
    for member in members:
        families.setdefault(member.series.name, []).append(member)
    return [member for family in families.values() for member in family]


__all__ = ["Counter", "CounterEnum", "Counts", "Series", "as_document", "by_family", "named"]
