"""The server's Prometheus endpoint (``mtcache serve --metrics HOST:PORT``, prometheus_client):

- ``/metrics``: the cache's figures (`cache.engine.stats`: table accesses local and remote,
  guard failures by kind, the memo, each view's rows, regions, staleness and refresh delay d,
  the stream's lag) with the server's (`server_samples`: sessions open and running,
  statements by the path that answered them, the shared backend pool's use and waits), all
  read when scraped, nothing counted for them on the hit path;
- ``/livez``: 200 while the event loop answers within two seconds;
- ``/readyz``: 200 while the server accepts sessions, once it has reached the backend since it
  started (`cache.server.watch`; an outage after that does not make it unready: the cache
  still answers what its guards allow).
"""

from __future__ import annotations

import threading
import typing as t
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import version
from wsgiref.simple_server import make_server

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import ThreadingWSGIServer, WSGIRequestHandler, make_wsgi_app

from cache.backend.pool import backend_pool
from cache.backend.session_pool import SessionPool
from cache.engine.conversation.statistics import StatementStats
from cache.engine.engine import Engine
from cache.engine.stats import Sample, counter_samples
from cache.server.counters import ServerCounter

LIVE_SECONDS = 2.0
VERSION = version("mtcache")


class Server(t.Protocol):
    """What the endpoint reads of the server (`cache.server.server.Server`)."""

    engine: Engine
    counters: dict[ServerCounter, int]
    pool: SessionPool | None
    statement_stats: StatementStats | None

    @property
    def ready(self) -> bool: ...

    @property
    def backend_up(self) -> bool: ...

    def sessions(self) -> int: ...
    def running(self) -> int: ...
    def stats(self) -> list[Sample]: ...
    def responsive(self, timeout: float) -> bool: ...

    @property
    def stopping(self) -> bool: ...


def server_samples(server: Server) -> list[Sample]:
    """The server's own figures."""
    found = [
        Sample(
            "mtcache_build_info",
            (("version", VERSION),),
            1.0,
            "gauge",
            "the mtcache version serving, as a label (Prometheus's _info convention)",
        ),
        Sample("mtcache_sessions", (), float(server.sessions()), "gauge", "client sessions open"),
        Sample(
            "mtcache_backend_up",
            (),
            float(server.backend_up),
            "gauge",
            "1 while the backend answered the server's last probe, else 0",
        ),
        Sample(
            "mtcache_sessions_running",
            (),
            float(server.running()),
            "gauge",
            "client sessions answering a statement now",
        ),
        *counter_samples(ServerCounter, server.counters),
    ]
    pool = backend_pool(server.engine.backend).get_stats()
    found += [
        Sample(
            "mtcache_backend_pool_connections",
            (),
            float(pool.get("pool_size", 0)),
            "gauge",
            "connections of the shared backend pool",
        ),
        Sample(
            "mtcache_backend_pool_available",
            (),
            float(pool.get("pool_available", 0)),
            "gauge",
            "idle connections of the shared backend pool",
        ),
        Sample(
            "mtcache_backend_pool_waiting",
            (),
            float(pool.get("requests_waiting", 0)),
            "gauge",
            "requests waiting for a connection of the shared backend pool",
        ),
        Sample(
            "mtcache_backend_pool_waits_total",
            (),
            float(pool.get("requests_queued", 0)),
            "counter",
            "requests that had to wait for a pooled backend connection",
        ),
    ]
    if server.statement_stats is not None:
        found += server.statement_stats.samples()
    sessions = server.pool.stats() if server.pool is not None else None
    if sessions is not None:
        for role, count in sessions.open.items():
            idle = sessions.idle.get(role, 0)
            found += [
                Sample(
                    "mtcache_session_pool_connections",
                    (("role", role), ("state", state)),
                    float(n),
                    "gauge",
                    "backend connections of the session pool",
                )
                for state, n in (("busy", count - idle), ("idle", idle))
            ]
        found += [
            Sample(
                "mtcache_session_pool_waiting",
                (),
                float(sessions.waiting),
                "gauge",
                "statements waiting for a connection of the session pool now",
            ),
            Sample(
                "mtcache_session_pool_waits_total",
                (),
                float(sessions.waits),
                "counter",
                "statements that waited for a connection of the session pool",
            ),
            Sample(
                "mtcache_session_pool_wait_seconds_total",
                (),
                sessions.wait_seconds,
                "counter",
                "time statements waited for a connection of the session pool",
            ),
            Sample(
                "mtcache_session_pool_timeouts_total",
                (),
                float(sessions.timeouts),
                "counter",
                "statements that gave up waiting (53300)",
            ),
            Sample(
                "mtcache_session_pool_acquired_total",
                (),
                float(sessions.acquired),
                "counter",
                "connections handed to sessions by the session pool",
            ),
        ]
    return found


class _Collector:
    """The samples, as Prometheus's metric families, made at each scrape."""

    def __init__(self, samples: Callable[[], list[Sample]]) -> None:
        self._samples = samples

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        histograms: dict[str, dict[tuple[tuple[str, str], ...], dict[str, t.Any]]] = {}
        helps: dict[str, str] = {}
        for sample in self._samples():
            if sample.kind == "histogram":  # its series gathered, then one family each
                base, _, part = sample.name.rpartition("_")
                labels = tuple(kv for kv in sample.labels if kv[0] != "le")
                series = histograms.setdefault(base, {}).setdefault(
                    labels, {"buckets": [], "sum": 0.0}
                )
                if part == "bucket":
                    series["buckets"].append((dict(sample.labels)["le"], sample.value))
                elif part == "sum":
                    series["sum"] = sample.value
                helps[base] = sample.help
                continue
            family = families.get(sample.name)
            if family is None:
                kind = CounterMetricFamily if sample.kind == "counter" else GaugeMetricFamily
                name = (
                    sample.name.removesuffix("_total") if sample.kind == "counter" else sample.name
                )
                family = families[sample.name] = kind(
                    name, sample.help, labels=[k for k, _ in sample.labels]
                )
            family.add_metric([v for _, v in sample.labels], sample.value)  # type: ignore[attr-defined]
        yield from families.values()
        for base, by_labels in histograms.items():
            names = [k for k, _ in next(iter(by_labels))]
            histogram = HistogramMetricFamily(base, helps[base], labels=names)
            for labels, series in by_labels.items():
                histogram.add_metric([v for _, v in labels], series["buckets"], series["sum"])
            yield histogram


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: t.Any) -> None:  # scrapes are not logged
        pass


class MetricsEndpoint:
    """The HTTP endpoint of a server's metrics, served from a thread of its own."""

    def __init__(self, server: Server, host: str, port: int) -> None:
        self._server = server
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(server.stats))  # type: ignore[arg-type]
        self._metrics = make_wsgi_app(registry)
        self._httpd = make_server(host, port, self._app, ThreadingWSGIServer, _Quiet)
        self.address = self._httpd.server_address[:2]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, daemon=True, name="mtcache-metrics"
        )
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _app(self, environ: dict[str, t.Any], respond: Callable[..., t.Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/livez":
            return _plain(respond, self._server.responsive(LIVE_SECONDS), "live")
        if path == "/readyz":
            return _plain(respond, self._server.ready, "ready")
        return t.cast(Iterable[bytes], self._metrics(environ, respond))


def _plain(respond: Callable[..., t.Any], ok: bool, what: str) -> list[bytes]:
    respond(
        "200 OK" if ok else "503 Service Unavailable",
        [("Content-Type", "text/plain; charset=utf-8")],
    )
    return [f"{what}\n".encode() if ok else f"not {what}\n".encode()]


__all__ = ["MetricsEndpoint", "server_samples"]
