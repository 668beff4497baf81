"""The counters' registry (`cache.store.counters`, the server's `cache.server.counters`), with
no database: the names the cache file and the documents keep are unchanged and unique, every
counter says what it counts and which sample it is, the samples made from it are those the
endpoint gave before there was a registry, and the cache file keeps one row per counter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cache.engine.stats import Sample, counter_samples, document_samples
from cache.server.counters import ServerCounter
from cache.store.cache_file import CacheStore
from cache.store.counters import Counter, CounterEnum, as_document, by_family
from tests.paths import ROOT

SCHEMAS = ROOT / "docs" / "schemas"
REGISTRIES: list[type[CounterEnum]] = [Counter, ServerCounter]

# the names the cache file keeps and `mtcache status` shows, in the file's order
NAMES = [
    "hits",
    "presence_misses",
    "currency_misses",
    "remote",
    "memo_hits",
    "memo_misses",
    "completeness_misses",
    "consistency_misses",
    "timeline_misses",
    "evictions",
    "budget_overruns",
    "deferred_admissions",
]

ACCESSES = "table accesses of cached reads, by where they were answered"
GUARDS = "guard failures sending an access to the backend, by kind"
MEMO = "local answers looked up in the result memo or a lookup index"
STATEMENTS = "statements the server answered, by the path that answered them"


def test_the_names_are_unchanged_and_unique() -> None:
    assert [c.value for c in Counter] == NAMES
    assert all(type(c.value) is str for c in Counter)
    assert [c.name for c in Counter] == [n.upper() for n in NAMES]
    assert [c.value for c in ServerCounter] == ["lane", "at_hand", "relayed_raw", "relayed"]
    for registry in REGISTRIES:
        assert len({c.value for c in registry}) == len(registry)


def test_every_counter_has_help_and_a_sample() -> None:
    samples = set()
    families: dict[str, tuple[str, tuple[str, ...]]] = {}
    for registry in REGISTRIES:
        for counter in registry:
            assert counter.help.strip(), counter
            series = counter.series
            assert series.name.startswith("mtcache_") and series.name.endswith("_total"), counter
            assert series.help.strip(), counter
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in series.labels)
            samples.add((series.name, series.labels))
            # a family's members share its help and its label names (Prometheus's rule)
            shape = (series.help, tuple(k for k, _ in series.labels))
            assert families.setdefault(series.name, shape) == shape, counter
    assert len(samples) == len(Counter) + len(ServerCounter)  # (no two the same sample)


def test_the_status_schema_requires_every_counter() -> None:
    schema = json.loads((SCHEMAS / "status.schema.json").read_text())
    assert set(schema["properties"]["counters"]["required"]) == set(NAMES)


def test_the_samples_are_those_written_by_hand_before() -> None:
    counts = {name: i + 1 for i, name in enumerate(NAMES)}
    n = counts.__getitem__

    def counter(name: str, value: int, help: str, *labels: tuple[str, str]) -> Sample:
        return Sample(name, labels, float(value), "counter", help)

    guards = "mtcache_guard_failures_total"
    assert document_samples({"counters": counts}) == [
        counter("mtcache_accesses_total", n("hits"), ACCESSES, ("outcome", "local")),
        counter("mtcache_accesses_total", n("remote"), ACCESSES, ("outcome", "remote")),
        counter(guards, n("presence_misses"), GUARDS, ("kind", "presence")),
        counter(guards, n("currency_misses"), GUARDS, ("kind", "currency")),
        counter(guards, n("completeness_misses"), GUARDS, ("kind", "completeness")),
        counter(guards, n("consistency_misses"), GUARDS, ("kind", "consistency")),
        counter(guards, n("timeline_misses"), GUARDS, ("kind", "timeline")),
        counter("mtcache_memo_lookups_total", n("memo_hits"), MEMO, ("result", "hit")),
        counter("mtcache_memo_lookups_total", n("memo_misses"), MEMO, ("result", "miss")),
        counter(
            "mtcache_evictions_total", n("evictions"), "presence regions the size budget evicted"
        ),
        counter(
            "mtcache_budget_overruns_total",
            n("budget_overruns"),
            "stream batches that landed over the size budget (nothing left to evict)",
        ),
        counter(
            "mtcache_deferred_admissions_total",
            n("deferred_admissions"),
            "first misses of a key the doorkeeper did not admit",
        ),
    ]
    # a document without counters: each 0
    assert [s.value for s in document_samples({})] == [0.0] * len(NAMES)
    paths = {ServerCounter.LANE: 1, ServerCounter.AT_HAND: 2, ServerCounter.RELAYED: 3}
    assert counter_samples(ServerCounter, paths) == [
        counter("mtcache_server_statements_total", 1, STATEMENTS, ("path", "lane")),
        counter("mtcache_server_statements_total", 2, STATEMENTS, ("path", "at_hand")),
        counter("mtcache_server_statements_total", 0, STATEMENTS, ("path", "relayed_raw")),
        counter("mtcache_server_statements_total", 3, STATEMENTS, ("path", "relayed")),
    ]


def test_a_family_comes_together_in_the_order_of_its_first_member() -> None:
    assert [c.value for c in by_family(Counter)] == [
        "hits",
        "remote",
        "presence_misses",
        "currency_misses",
        "completeness_misses",
        "consistency_misses",
        "timeline_misses",
        "memo_hits",
        "memo_misses",
        "evictions",
        "budget_overruns",
        "deferred_admissions",
    ]


def test_counts_by_member_and_their_document() -> None:
    counts = Counter.zeros()
    assert list(counts) == list(Counter) and set(counts.values()) == {0}
    counts[Counter.HITS] += 2
    document = as_document(counts)
    assert list(document) == NAMES and document["hits"] == 2
    assert all(type(name) is str for name in document)  # (plain names: JSON's, the file's)
    assert json.dumps(document) == json.dumps(dict.fromkeys(NAMES, 0) | {"hits": 2})
    assert ServerCounter.zeros() == dict.fromkeys(ServerCounter, 0)
    with pytest.raises(ValueError):
        Counter("hitz")


def test_the_cache_file_keeps_a_row_per_counter(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "cache.duckdb")
    try:
        assert store.counters() == Counter.zeros()
        assert list(store.counters()) == list(Counter)
        store.add_counters({Counter.REMOTE: 3, Counter.EVICTIONS: 1})
        store.add_counters({Counter.REMOTE: 1})
        # a name another version counts is kept in the file and left out here
        store.con.execute("INSERT INTO mtcache.counters VALUES ('newer', 7)")
        found = store.counters()
        assert found == Counter.zeros() | {Counter.REMOTE: 4, Counter.EVICTIONS: 1}
        assert store.con.execute(
            "SELECT value FROM mtcache.counters WHERE name = 'newer'"
        ).fetchall() == [(7,)]
    finally:
        store.close()
