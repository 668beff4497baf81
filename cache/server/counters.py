"""The server's own counters: the prepared runs its event loop took whole
(`cache.server.connection.ClientConnection._at_hand`), by the path that answered them. A
registry like the cache's (`cache.store.counters`) and sampled the same way
(`cache.engine.stats.counter_samples`), but apart from it: these are the process's, kept
while it serves and never saved in the cache file nor shown in the status document, where
every `cache.store.counters.Counter` is.
"""

from __future__ import annotations

from cache.store.counters import CounterEnum, Series

STATEMENTS = "statements the server answered, by the path that answered them"


def _statements(path: str) -> Series:
    return Series("mtcache_server_statements_total", STATEMENTS, (("path", path),))


class ServerCounter(CounterEnum):
    """A path of the prepared runs the event loop takes whole (each run counted by one)."""

    LANE = "lane", "runs a statement's lane answered (from a lookup index)", _statements("lane")
    AT_HAND = (
        "at_hand",
        "runs of a cached read answered at hand otherwise (`AtOnce.at_hand`)",
        _statements("at_hand"),
    )
    RELAYED_RAW = (
        "relayed_raw",
        "runs passed through sent as bytes, a raw lane's or not (`cache.engine.conversation.raw`)",
        _statements("relayed_raw"),
    )
    RELAYED = (
        "relayed",
        "runs passed through sent through libpq, their answers relayed by the loop",
        _statements("relayed"),
    )


__all__ = ["STATEMENTS", "ServerCounter"]
