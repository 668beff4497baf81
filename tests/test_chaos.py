"""The randomized C&C checker's short run (issue 10): writers, readers with random shapes and
bounds, refreshes, admissions, evictions and injected faults (sessions terminated, refreshes
failing at each fault point, the backend restarted) for 40 seconds, seeded; every answer and
every cached region checked against the writers' history. The long runs are
`mtcache experiment chaos --minutes N`."""

from __future__ import annotations

from cache.backend.embedded_pg import EmbeddedPostgres
from experiments.chaos import run_chaos


def test_a_short_chaos_run_finds_no_violation(
    pg_cluster: EmbeddedPostgres, backend_dsn: str
) -> None:
    def restart() -> None:
        pg_cluster.stop()
        pg_cluster.ensure_running()

    result = run_chaos(backend_dsn, seconds=40, seed=20261123, restart=restart)
    assert result["violations"] == []
    # the run did what it is for: many answers, local ones among them, faults of each kind
    assert result["answers_checked"] > 500 and result["answers_local"] > 20
    assert result["regions_checked"] > 0 and result["ticks"] > 100
    assert result["faults"].get("pg_terminate_backend", 0) > 0
    assert result["faults"].get("backend restart", 0) > 0
    assert any(kind.startswith("refresh fault") for kind in result["faults"])
