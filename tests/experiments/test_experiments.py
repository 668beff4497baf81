"""`mtcache experiment ... --quick` end to end on the test cluster: the CSV rows, the plots and
the report's sections (the answers themselves are checked against PostgreSQL's inside the
runs, before anything is timed); and the benchmarks' own reference relay."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import psycopg
import psycopg.conninfo

from cache.backend.embedded_pg import EmbeddedPostgres

PNG = b"\x89PNG\r\n\x1a\n"


def test_all_quick_writes_csv_plots_and_one_report(
    pg_cluster: EmbeddedPostgres, mtcache_bin: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    dsn = pg_cluster.create_database("experiments")
    out = tmp_path / "out"
    done = subprocess.run(
        [
            mtcache_bin,
            "--backend",
            dsn,
            "--cache",
            str(tmp_path / "c.duckdb"),
            "experiment",
            "all",
            "--quick",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"report: {out / 'report.md'}" in done.stdout
    report = (out / "report.md").read_text()
    assert "TPC-H scale factor 0.01 (quick run" in report

    # tpch: a row per query and the geometric means, with provenance
    with (out / "tpch.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    queries = [r for r in rows if r["query"].startswith("Q")]
    assert [r["query"] for r in queries] == [f"Q{n}" for n in range(1, 23)]
    assert all(r["route"] in ("local", "mixed", "remote") for r in queries)
    assert all(float(r["cache_ms"]) > 0 and float(r["postgres_ms"]) > 0 for r in queries)
    assert all(
        r["experiment"] == "tpch" and r["git_sha"] and r["scale_factor"] == "0.01" for r in rows
    )
    local = [r for r in queries if r["route"] == "local"]
    assert len(local) >= 15  # every table is cached and the bound is loose
    geomean = next(r for r in rows if r["query"] == "geomean (all)")
    assert geomean["route"] == f"{len(local)} of 22 local" and float(geomean["speedup"]) > 0
    assert "## TPC-H: the 22 queries through the cache vs PostgreSQL" in report
    for r in queries:  # one verdict line per query, naming its route
        assert f"| {r['query']} | {r['route']} |" in report
    assert (out / "tpch-speedups.png").read_bytes()[:8] == PNG
    assert "![tpch-speedups](tpch-speedups.png)" in report

    # guard-overhead: four ways per query, each split into phases; only a guarded run
    # spends time in the guard phase
    with (out / "guard-overhead.csv").open(newline="") as handle:
        guards = list(csv.DictReader(handle))
    assert sorted({r["query"] for r in guards}) == ["Q1", "Q2", "Q3"]
    assert {r["variant"] for r in guards} == {
        "local, no guard",
        "local, guard",
        "remote, no guard",
        "remote, guard",
    }
    assert {r["query"]: r["rows_returned"] for r in guards}["Q1"] == "1"
    for r in guards:
        if r["phase"] == "guard":
            assert (float(r["median_us"]) > 0) == r["variant"].endswith(", guard"), r
        if r["phase"] == "total":
            assert float(r["median_us"]) > 0
    assert "**Table 4.4: with and without the currency guard**" in report
    assert "**Table 4.5: where the time goes**" in report
    assert (out / "guard-overhead.png").read_bytes()[:8] == PNG

    # plan-choices: each query's candidates timed, one of them the cost-based choice; the
    # choices that do not depend on the scale are the dissertation's
    with (out / "plan-choices.csv").open(newline="") as handle:
        plans = list(csv.DictReader(handle))
    names = list(dict.fromkeys(r["query"] for r in plans))
    assert names == ["Q1", "Q2", "Q2 (clause)", "Q3", "Q4", "Q5", "Q6", "Q7"]
    for name in names:
        mine = [r for r in plans if r["query"] == name]
        assert [r["chosen"] for r in mine].count("True") == 1
        assert all(float(r["median_ms"]) > 0 for r in mine)
    chosen = {r["query"]: r for r in plans if r["chosen"] == "True"}
    assert {q: chosen[q]["chosen_plan"] for q in ("Q1", "Q4", "Q5", "Q7")} == {
        "Q1": "remote",
        "Q4": "mixed",
        "Q5": "local",
        "Q7": "local",
    }
    assert chosen["Q4"]["ran_as"] == "remote+local" and chosen["Q3"]["ran_as"] == "remote"
    assert "## Plan choices (dissertation §4.7.3, Table 4.3 and Fig 4.1)" in report
    assert "| Q4 | " in report and "same choice" in report
    assert (out / "plan-choices.png").read_bytes()[:8] == PNG

    # workload-shift: the fraction answered locally under the real scheduler, per bound; no
    # bound at or below d is ever met, one above d + f always is
    with (out / "workload-shift.csv").open(newline="") as handle:
        shift = list(csv.DictReader(handle))
    sweep = [r for r in shift if r["figure"] == "4.2a"]
    assert sorted({float(r["d_units"]) for r in sweep}) == [1, 5, 10]
    for r in sweep:
        assert int(r["queries"]) > 20 and 0 <= float(r["p_measured"]) <= 1
        b, d, f = (float(r[k]) for k in ("b_units", "d_units", "f_units"))
        assert float(r["d_measured_s"]) >= float(r["d_injected_s"])  # the emulated delay landed
        if b == 0:
            assert r["local"] == "0"
        if b >= d + f + 10:
            assert r["local"] == r["queries"], r
        if b == 60:  # the model says (60 - d) / 100: half of them, roughly
            assert 0.3 <= float(r["p_measured"]) <= 0.8, r
    assert {r["figure"] for r in shift} == {"4.2a", "4.2b", "continuous"}
    live = [r for r in shift if r["figure"] == "continuous"]
    assert int(live[0]["writes"]) > 100 and all(int(r["queries"]) > 10 for r in live)
    assert max(float(r["p_measured"]) for r in live) >= 0.9  # a loose bound is met locally
    assert (
        "## Workload shift as the currency bound relaxes (dissertation §4.7.2, Fig 4.2)" in report
        and "points fit the model within" in report
    )
    assert (out / "workload-shift.png").read_bytes()[:8] == PNG

    # consistency-guards: Table 7.1 measured four ways; the guards the plans carry are the
    # Fig 7.2 decisions (EXPLAIN); the emulated costlier guards held on the data
    with (out / "consistency-guards.csv").open(newline="") as handle:
        consistency = list(csv.DictReader(handle))
    table = [r for r in consistency if r["table"] == "7.1"]
    assert sorted({r["query"] for r in table}) == ["Qa", "Qb", "Qc"]
    guards = {r["query"]: r["guard"] for r in table}
    assert "A12" in guards["Qc"] and "one snapshot" in guards["Qa"], guards
    assert "ordercopy: one snapshot" in guards["Qb"]
    decisions = {r["query"]: r for r in consistency if r["table"] == "7.2"}
    assert "no check" in decisions["$key = c_custkey"]["guard"]
    assert "A12" in decisions["$key = c_nationkey, nation predicate"]["guard"]
    assert all(r["route"] == "local" for r in decisions.values())
    emulated = {(r["query"], r["guard"]) for r in consistency if r["table"] == "emulated"}
    assert emulated == {(q, g) for q in ("Qa", "Qc") for g in ("A11a", "A11b", "S12")}
    assert "**Table 7.1: consistency guard overhead**" in report
    assert "**Fig 7.2: the decision for each $key of Qa**" in report
    assert (out / "consistency-guards.png").read_bytes()[:8] == PNG

    # derived-views: each of the three views answers locally and is kept by the stream; the
    # figures are measured (each view checked against the backend's computation on the way)
    with (out / "derived-views.csv").open(newline="") as handle:
        derived = list(csv.DictReader(handle))
    kinds = {r["kind"] for r in derived}
    assert kinds == {
        "query",
        "maintenance",
        "lag",
        "size",
        "copy",
        "arrangement",
        "first batch",
        "sharing",
    }
    for kind in ("query", "size"):
        assert [r["query"] for r in derived if r["kind"] == kind] == ["Q1", "Q3-like", "Q5-like"]
    assert [(r["updates"], r["query"]) for r in derived if r["kind"] == "maintenance"] == [
        (n, q) for n in ("1", "100") for q in ("Q1", "Q3-like", "Q5-like")
    ]
    # one copy per table, whatever the number of views reading it (lineitem: all three)
    assert sorted(r["query"] for r in derived if r["kind"] == "copy") == sorted(
        ["customer", "lineitem", "nation", "orders", "region", "supplier"]
    )
    # (the changes of lineitem and orders probe every other table the join views read)
    arranged = {r["query"]: int(r["arranged_bytes"]) for r in derived if r["kind"] == "arrangement"}
    assert sorted(arranged) == ["customer", "lineitem", "nation", "orders", "region", "supplier"]
    assert all(n > 0 for n in arranged.values())
    for r in derived:
        if r["kind"] == "query":
            assert float(r["view_s"]) > 0 and float(r["postgresql_s"]) > 0
            assert float(r["point_hit_s"]) > 0
        if r["kind"] == "maintenance":
            assert 0 < float(r["view_delta_s"]) <= float(r["batch_s"])
            assert 0 < float(r["copies_s"]) <= float(r["batch_s"])
        if r["kind"] == "size":
            assert int(r["view_rows"]) > 0 and int(r["copies_rows"]) > int(r["view_rows"])
        if r["kind"] == "copy":
            assert int(r["copies_rows"]) > 0 and int(r["copies_bytes"]) > 0
    # lineitem and orders cached whole: their base views are their copies, or kept beside them
    sharing = {r["query"]: r for r in derived if r["kind"] == "sharing"}
    assert sorted(sharing) == ["apart", "shared"]
    assert int(sharing["shared"]["copies_bytes"]) == 0 < int(sharing["apart"]["copies_bytes"])
    assert all(int(r["base_views_bytes"]) > 0 and float(r["batch_s"]) > 0 for r in sharing.values())
    [lag] = [r for r in derived if r["kind"] == "lag"]
    assert int(lag["transactions"]) == 300 and 0 <= float(lag["lag_p50_s"]) <= float(
        lag["lag_p99_s"]
    )
    assert "## Derived views kept current from the change stream" in report
    assert (out / "derived-views.png").read_bytes()[:8] == PNG

    # --from-csv draws the same plots and report again from the CSVs, measuring nothing
    for drawn in [out / "report.md", *out.glob("*.png")]:
        drawn.unlink()
    again = subprocess.run(
        [mtcache_bin, "experiment", "all", "--out", str(out), "--from-csv"],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert (out / "report.md").read_text() == report
    assert (out / "workload-shift.png").read_bytes()[:8] == PNG
    (out / "tpch.csv").unlink()
    missing = subprocess.run(
        [mtcache_bin, "experiment", "tpch", "--out", str(out), "--from-csv"],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=120,
        check=False,
    )
    assert missing.returncode == 1 and len(missing.stderr.splitlines()) == 1
    assert "tpch.csv is missing: run `mtcache experiment tpch`" in missing.stderr


def test_a_scale_factor_out_of_range_is_one_line(
    mtcache_bin: str, clean_env: dict[str, str], tmp_path: Path
) -> None:
    done = subprocess.run(
        [
            mtcache_bin,
            "--cache",
            str(tmp_path / "c.duckdb"),
            "experiment",
            "tpch",
            "--sf",
            "0",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "mtcache: ProgrammingError: --sf must be a TPC-H scale factor in (0, 100], not 0"
    ]
    assert not (tmp_path / "out").exists()


def test_the_byte_pipe_relays_a_postgresql_session_as_it_is(backend_dsn: str) -> None:
    """bench_server's reference relay (`experiments.byte_pipe`) passes a session through
    unchanged: what a client gets through it is what PostgreSQL answers directly, prepared
    or not."""
    from experiments.server_rig import byte_pipe

    port = psycopg.conninfo.conninfo_to_dict(backend_dsn)["port"]
    query = "SELECT n, n::numeric / 3 AS third, repeat('x', n %% 100) FROM generate_series(1, %s) n"
    with byte_pipe(int(port)) as (pipe_port, _pid):
        piped_dsn = psycopg.conninfo.make_conninfo(backend_dsn, port=pipe_port)
        with psycopg.connect(piped_dsn) as piped, psycopg.connect(backend_dsn) as direct:
            for prepare in (False, True):
                for size in (3, 5000):  # (the second: more than one read of the backend's)
                    cur = piped.execute(query, [size], prepare=prepare)
                    got = (cur.fetchall(), [c.name for c in cur.description or []])
                    cur = direct.execute(query, [size], prepare=prepare)
                    assert got == (cur.fetchall(), [c.name for c in cur.description or []])
