"""The C&C checker's short run over the wire (issue 28): the cache as `mtcache serve` with
transaction pooling, readers of random shapes and bounds and a maintainer driving it through
PostgreSQL's protocol, a client that disconnects mid-statement and mid-transaction and
cancels, the server SIGKILLed and started again, backend sessions terminated, the backend
restarted and the network between server and backend delaying, dropping and resetting its
connections, for 60 seconds, seeded: every answer and every cached region checked against the
backend's history, and no row of an abandoned transaction committed. The long runs are
`mtcache experiment chaos --wire --minutes N`."""

from __future__ import annotations

from cache.backend.embedded_pg import EmbeddedPostgres
from experiments.chaos import run_chaos


def test_a_short_chaos_run_over_the_wire_finds_no_violation(
    pg_cluster: EmbeddedPostgres, backend_dsn: str
) -> None:
    def restart() -> None:
        pg_cluster.stop()
        pg_cluster.ensure_running()

    result = run_chaos(backend_dsn, seconds=60, seed=20261127, restart=restart, wire=True)
    assert result["violations"] == []
    # the run did what it is for: many answers through the server, local ones among them,
    # and faults of each kind
    assert result["answers_checked"] > 100 and result["answers_local"] > 20
    assert result["regions_checked"] > 0 and result["ticks"] > 100
    assert result["owner_incarnations"] >= 2  # the server started again after a SIGKILL
    faults = result["faults"]
    kinds = [
        "pg_terminate_backend",
        "backend restart",
        "server SIGKILLed (started again)",
        "network delayed",
        "client disconnect mid-statement",
        "client disconnect mid-transaction",
        "client cancel",
        "client cancel mid-transaction",
    ]
    assert [k for k in kinds if not faults.get(k)] == []
    assert (
        faults.get("network dropped the server's backend connections", 0)
        + faults.get("network reset the server's backend connections", 0)
        > 0
    )
