"""The cache's figures as named samples, the same for `SHOW CACHE STATS` (a row each) and the
server's Prometheus endpoint (`cache.server.metrics`): from the status document (counters,
views, the stream) and from whatever else serves the engine (`Engine.stats_sources`: the
server's sessions and its paths). Made when asked: nothing is counted for them on the hit
path beyond the counters the cache keeps anyway.
"""

from __future__ import annotations

import typing as t


class Sample(t.NamedTuple):
    name: str  # Prometheus's naming: mtcache_..., _total for counters
    labels: tuple[tuple[str, str], ...]
    value: float
    kind: t.Literal["counter", "gauge", "histogram"]  # histogram: a _bucket, _sum or _count
    help: str


def _counter(name: str, value: float, help: str, **labels: str) -> Sample:
    return Sample(name, tuple(labels.items()), float(value), "counter", help)


def _gauge(name: str, value: float, help: str, **labels: str) -> Sample:
    return Sample(name, tuple(labels.items()), float(value), "gauge", help)


ACCESSES = "table accesses of cached reads, by where they were answered"
GUARDS = "guard failures sending an access to the backend, by kind"
MEMO = "local answers looked up in the result memo or a lookup index"


def document_samples(document: dict[str, t.Any]) -> list[Sample]:
    """The samples of a status document (`Admin.status`)."""
    counters = document.get("counters", {})
    found = [
        _counter("mtcache_accesses_total", counters.get("hits", 0), ACCESSES, outcome="local"),
        _counter("mtcache_accesses_total", counters.get("remote", 0), ACCESSES, outcome="remote"),
        _counter(
            "mtcache_guard_failures_total",
            counters.get("presence_misses", 0),
            GUARDS,
            kind="presence",
        ),
        _counter(
            "mtcache_guard_failures_total",
            counters.get("currency_misses", 0),
            GUARDS,
            kind="currency",
        ),
        *(
            _counter(
                "mtcache_guard_failures_total", counters.get(f"{kind}_misses", 0), GUARDS, kind=kind
            )
            for kind in ("completeness", "consistency", "timeline")
        ),
        _counter("mtcache_memo_lookups_total", counters.get("memo_hits", 0), MEMO, result="hit"),
        _counter("mtcache_memo_lookups_total", counters.get("memo_misses", 0), MEMO, result="miss"),
        _counter(
            "mtcache_evictions_total",
            counters.get("evictions", 0),
            "presence regions the size budget evicted",
        ),
        _counter(
            "mtcache_budget_overruns_total",
            counters.get("budget_overruns", 0),
            "stream batches that landed over the size budget (nothing left to evict)",
        ),
        _counter(
            "mtcache_deferred_admissions_total",
            counters.get("deferred_admissions", 0),
            "first misses of a key the doorkeeper did not admit",
        ),
    ]
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


__all__ = ["Sample", "document_samples"]
