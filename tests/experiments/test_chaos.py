"""The randomized C&C checker's short run (issue 10): writers; the cache in a process of its own
with readers of random shapes and bounds, refreshes (inline, Spark, scheduled), admissions and
evictions; faults of every kind (sessions terminated, the backend restarted, refreshes failing
and killed at each fault point, the cache's process SIGKILLed and reopened, Spark tasks
failing) for 90 seconds, seeded; every answer and every cached region checked against the
backend's history. The long runs are `mtcache experiment chaos --minutes N`."""

from __future__ import annotations

from cache.backend.embedded_pg import EmbeddedPostgres
from experiments.chaos import FAIL_POINTS, KILL_POINTS, SPARK_FAULTS, run_chaos


def test_a_short_chaos_run_finds_no_violation(
    pg_cluster: EmbeddedPostgres, backend_dsn: str
) -> None:
    def restart() -> None:
        pg_cluster.stop()
        pg_cluster.ensure_running()

    result = run_chaos(backend_dsn, seconds=90, seed=20261123, restart=restart)
    assert result["violations"] == []
    # the run did what it is for: many answers, local ones among them, faults of each kind
    assert result["answers_checked"] > 500 and result["answers_local"] > 20
    assert result["regions_checked"] > 0 and result["ticks"] > 100
    faults = result["faults"]
    assert faults.get("pg_terminate_backend", 0) > 0
    assert faults.get("backend restart", 0) > 0
    assert faults.get("owner SIGKILLed (reopened)", 0) > 0
    assert result["owner_incarnations"] > 2
    kinds = [f"refresh failed at {p}" for p in FAIL_POINTS]
    kinds += [f"refresh killed at {p} (owner reopened)" for p in KILL_POINTS]
    kinds += [f"Spark task failure ({p})" for p in SPARK_FAULTS]
    assert [k for k in kinds if not faults.get(k)] == []
