"""The cache's figures as named samples, the same for `SHOW CACHE STATS` (a row each) and the
server's Prometheus endpoint (`cache.server.metrics`): from the status document (counters,
views, the stream) and from whatever else serves the engine (`Engine.stats_sources`: the
server's sessions and its paths). Made when asked: nothing is counted for them on the hit
path beyond the counters the cache keeps anyway.
"""

from __future__ import annotations

import typing as t
from collections.abc import Iterable, Mapping

from cache.store.counters import Counter, CounterEnum, by_family


class Sample(t.NamedTuple):
    name: str  # Prometheus's naming: mtcache_..., _total for counters
    labels: tuple[tuple[str, str], ...]
    value: float
    kind: t.Literal["counter", "gauge", "histogram"]  # histogram: a _bucket, _sum or _count
    help: str


def _gauge(name: str, value: float, help: str, **labels: str) -> Sample:
    return Sample(name, tuple(labels.items()), float(value), "gauge", help)


E = t.TypeVar("E", bound=CounterEnum)


def counter_samples(members: Iterable[E], counts: Mapping[E, float]) -> list[Sample]:
    """A registry's counters (`cache.store.counters`) as samples, each as its ``series``
    says, a family's together (`by_family`); a counter missing from ``counts`` is 0."""
    return [
        Sample(c.series.name, c.series.labels, float(counts.get(c, 0)), "counter", c.series.help)
        for c in by_family(members)
    ]


def document_samples(document: dict[str, t.Any]) -> list[Sample]:
    """The samples of a status document (`Admin.status`)."""
    found = counter_samples(Counter, document.get("counters", {}))
    used = document.get("resources") or {}
    if "data_bytes" in used:
        found.append(
            _gauge(
                "mtcache_data_bytes",
                used["data_bytes"],
                "the cached data's bytes, as the size budget counts them",
            )
        )
    if used.get("cache_size_limit") is not None:
        found.append(
            _gauge(
                "mtcache_cache_size_limit_bytes",
                used["cache_size_limit"],
                "the size budget of the cached data (cache_size_limit)",
            )
        )
    for view in document.get("views", []):
        name = view["name"]
        regions = view.get("regions") or []
        ages = [r["currency_seconds"] for r in regions if r.get("currency_seconds") is not None]
        found += [
            _gauge("mtcache_view_rows", view.get("rows", 0), "rows a cached view holds", view=name),
            _gauge(
                "mtcache_view_regions",
                view.get("region_count", len(regions)),
                "regions of a cached view present",
                view=name,
            ),
            _gauge(
                "mtcache_view_bytes",
                view.get("bytes", 0),
                "bytes a cached view's data takes in the cache file (checkpointed)",
                view=name,
            ),
        ]
        if ages:
            found.append(
                _gauge(
                    "mtcache_view_staleness_seconds",
                    max(ages),
                    "age of a cached view's oldest region",
                    view=name,
                )
            )
        auto = view.get("refresh_auto")
        interval = auto["interval_seconds"] if auto is not None else view.get("refresh_seconds")
        if interval:
            found.append(
                _gauge(
                    "mtcache_view_refresh_interval_seconds",
                    interval,
                    "a cached view's refresh interval (REFRESH EVERY, or chosen for REFRESH AUTO)",
                    view=name,
                )
            )
        if auto is not None:
            found.append(
                _gauge(
                    "mtcache_view_auto_refresh_saves_per_hour",
                    auto["saves_per_hour"],
                    "backend cost a REFRESH AUTO view's local answers save an hour, net of its "
                    "pulls (0: not refreshed, see SHOW CACHED VIEWS for why)",
                    view=name,
                )
            )
        goal = auto.get("objective") if auto is not None else None
        if goal is not None:
            found += [
                _gauge(
                    "mtcache_view_objective_seconds",
                    auto["within_seconds"],
                    "the age a REFRESH AUTO WITHIN view's data must never pass",
                    view=name,
                ),
                _gauge(
                    "mtcache_view_objective_at_risk",
                    goal["state"] != "met",
                    "1 when a REFRESH AUTO WITHIN view's next refresh is predicted to land past "
                    "its objective, or has (see mtcache_view_objective_missed)",
                    view=name,
                ),
                _gauge(
                    "mtcache_view_objective_missed",
                    goal["state"] == "missed",
                    "1 while a REFRESH AUTO WITHIN view's data is older than its objective",
                    view=name,
                ),
            ]
            if goal["predicted_age_seconds"] is not None:
                found.append(
                    _gauge(
                        "mtcache_view_objective_predicted_age_seconds",
                        goal["predicted_age_seconds"],
                        "the age a REFRESH AUTO WITHIN view's data will have when its next "
                        "refresh lands",
                        view=name,
                    )
                )
        for asked in view.get("bounds_asked", []):
            bound = asked["bound_seconds"]
            found.append(
                _gauge(
                    "mtcache_view_bound_queries_per_hour",
                    asked["queries_per_hour"],
                    "queries asking a cached view for a currency bound, per hour (decayed)",
                    view=name,
                    bound="any" if bound is None else f"{bound:g}",
                )
            )
        delay = view.get("refresh_delay_seconds")
        if delay is not None:
            found.append(
                _gauge(
                    "mtcache_view_refresh_delay_seconds",
                    delay,
                    "a cached view's measured refresh delay d",
                    view=name,
                )
            )
    stream = document.get("stream")
    if stream:
        if stream.get("lag_bytes") is not None:
            found.append(
                _gauge(
                    "mtcache_stream_lag_bytes",
                    stream["lag_bytes"],
                    "WAL the replication slot holds back",
                )
            )
        if stream.get("lag_seconds") is not None:
            found.append(
                _gauge(
                    "mtcache_stream_lag_seconds",
                    stream["lag_seconds"],
                    "how far the applied stream is behind",
                )
            )
    return found


__all__ = ["Sample", "counter_samples", "document_samples"]
