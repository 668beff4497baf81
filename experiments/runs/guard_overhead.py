"""`guard-overhead`: the dissertation's §4.7.4 (Tables 4.4 and 4.5): what a currency guard costs.

Three queries on TPC-H customer and orders, cached as ``cust_prj`` and ``orders_prj`` (Table
4.4's, reconstructed): Q1 a point lookup on the customer key, Q2 a customer's ~6 orders (a
join), Q3 the ~6,000 customers of one nation (a scan at SF 1). Each runs four ways, in turns:

- local without a guard: the plan's own DuckDB statement through the cursor's executor, with
  the decision made once beforehand (what runs when no currency checking is asked for);
- local with its guard (``CURRENCY BOUND 10 MIN``): the same, deciding each time; the guard
  passes;
- remote without a guard: the SQL the failing guard sends to PostgreSQL, sent without a
  clause (the cache passes it on as written);
- remote with its guard: a bound the local data has outlived, so the guard fails and the
  backend answers.

Each pair differs only by the guard (and, remote, by finding the clause's plan).

Each run's time is split into the phases of Table 4.5 as this cache has them: lookup (routing
and finding the plan: setup), guard, run (DuckDB or PostgreSQL producing the rows in
PostgreSQL's types) and fetch. Medians over the runs. The result memo is off (DuckDB computes
every local answer) and the guarded plan is kept (``plan_choice="guarded"``): the local
branch is measured even where the cost model would send the query remote.
"""

from __future__ import annotations

import math
import random
import statistics
import time
import typing as t
from pathlib import Path

import psycopg

import cache
from cache.execution.phases import Phases
from cache.store.refresh_times import measured_delays
from experiments.runs import section47
from experiments.runs.framework import (
    Context,
    Read,
    Row,
    figure,
    markdown_table,
    number,
    save,
    scale_of,
)

NAME = "guard-overhead"
TITLE = "Currency guard overhead (dissertation §4.7.4, Tables 4.4 and 4.5)"

# the dissertation's relative overheads (Table 4.4, from the prose: local 15% and 21% for Q1
# and Q2, under 4% for Q3's run phase; remote under 5%)
DISSERTATION_LOCAL = {"Q1": 15.0, "Q2": 21.0, "Q3": 4.0}
DISSERTATION_REMOTE = 5.0
TARGET_LOCAL, TARGET_REMOTE = 5.0, 2.0  # ours (the issue's)
VARIANTS = ("local, no guard", "local, guard", "remote, no guard", "remote, guard")
PHASES = ("lookup", "guard", "run", "fetch")  # shown; the total counts every phase


def queries(dsn: str) -> list[tuple[str, str, str]]:
    """(name, statement, the tables' clause)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT o_custkey FROM orders GROUP BY 1 HAVING count(*) = 6 ORDER BY 1 LIMIT 1"
        ).fetchone()
        six = row[0] if row else 1
        row = conn.execute(
            "SELECT c_custkey FROM customer ORDER BY c_custkey OFFSET "
            "(SELECT count(*) / 3 FROM customer) LIMIT 1"
        ).fetchone()
        key = row[0] if row else 1
    return [
        (
            "Q1",
            f"SELECT c.c_custkey, c.c_name, c.c_acctbal FROM customer c WHERE c.c_custkey = {key}",
            "ON (c)",
        ),
        (
            "Q2",
            "SELECT c.c_name, o.o_orderkey, o.o_totalprice FROM customer c JOIN orders o "
            f"ON o.o_custkey = c.c_custkey WHERE c.c_custkey = {six}",
            "ON (c), {b} ON (o)",
        ),
        (
            "Q3",
            "SELECT c.c_custkey, c.c_name, c.c_acctbal FROM customer c WHERE c.c_nationkey = 1",
            "ON (c)",
        ),
    ]


def clause(bound: str, tables: str) -> str:
    return f"CURRENCY BOUND {bound} {tables.replace('{b}', bound)}"


def run(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    with ctx.progress("guard overhead", total=5) as done:
        section47.load_backend(ctx.dsn, ctx.sf)
        plan = queries_plan(ctx)
        done("caching cust_prj and orders_prj")
        path = ctx.out / "guard-overhead.duckdb"
        path.unlink(missing_ok=True)
        conn = cache.connect(
            backend=ctx.dsn,
            cache_path=path,
            admit_on_miss=False,
            background=False,
            result_memo_bytes=0,
            plan_choice="guarded",
            autocommit=True,
        )
        try:
            section47.create_views(conn)
            refreshed = time.monotonic()
            # a bound the data outlives soon, but above the refresh delay (else no guard)
            delay = max(measured_delays(conn.engine.store).values(), default=1.0)
            failing = math.ceil(2 * delay) + 1
            done(plan[0][0])
            time.sleep(max(0.0, refreshed + failing + 0.5 - time.monotonic()))
            for index, (name, statement, tables, rounds) in enumerate(plan):
                rows += measure(conn, name, statement, tables, failing, rounds)
                done(plan[index + 1][0] if index + 1 < len(plan) else "done")
        finally:
            conn.close()
            path.unlink(missing_ok=True)
    return rows


def queries_plan(ctx: Context) -> list[tuple[str, str, str, int]]:
    """The queries with their rounds (how many times each variant runs)."""
    rounds = (
        {"Q1": 2000, "Q2": 400, "Q3": 300} if not ctx.quick else {"Q1": 200, "Q2": 60, "Q3": 40}
    )
    return [(n, s, c, rounds[n]) for n, s, c in queries(ctx.dsn)]


def measure(
    conn: cache.Connection, name: str, statement: str, tables: str, failing: int, rounds: int
) -> list[Row]:
    """The four ways of one query, in turns, each answer checked first; rows of medians per
    variant and phase (also the consistency-guards experiment's)."""
    local_sql = f"{statement} {clause('10 MIN', tables)}"
    failing_sql = f"{statement} {clause(f'{failing} SEC', tables)}"
    with psycopg.connect(conn.backend) as raw:
        want = sorted(raw.execute(statement).fetchall())  # type: ignore[call-overload]
    cur = conn.cursor()
    for sql, route in ((local_sql, "local"), (failing_sql, "remote"), (statement, "remote")):
        cur.execute(sql)
        assert sorted(cur.fetchall()) == want, f"{name}: the cache's answer differs"
        routes = {p["route"] for p in cur.provenance}
        assert routes == {route}, f"{name}: {sql} ran {routes}, not {route}"
        if sql == failing_sql:
            assert cur.plan is not None and cur.plan.local, f"{name}: no guard to fail"
    # Each pair differs only by the guard. Local: both run the plan through the session's
    # own steps (`prepare`, `decide`, `run`, as `execute` composes them), one deciding each
    # time, the other with the decision made once beforehand (what runs when no currency
    # checking is asked for). Remote: the failing guard's statement, and the very SQL text it
    # sends to PostgreSQL sent without a clause (which the cache passes on as written).
    session = conn.session
    cur.execute(local_sql)
    decision = session.decide(session.prepare(local_sql))
    remote_sql = session.prepare(failing_sql).remote.backend_sql
    assert remote_sql is not None
    cur.execute(remote_sql)
    assert sorted(cur.fetchall()) == want, f"{name}: the plan's remote SQL answers otherwise"
    phases = session.phases = Phases()

    def local(guarded: bool) -> t.Callable[[], None]:
        def once() -> None:
            phases.start()
            found = session.prepare(local_sql)
            phases.mark("lookup")
            chosen = decision
            if guarded:
                chosen = session.decide(found)
                phases.mark("guard")
            ran = session.run(found, chosen)
            phases.mark("run")
            assert ran is not None and ran.rows is not None, f"{name}: the local run was superseded"
            list(ran.rows)
            phases.mark("fetch")

        return once

    def through_cursor(sql: str) -> t.Callable[[], None]:
        def once() -> None:
            cur.execute(sql)
            phases.mark("return")  # the cursor's bookkeeping after its last phase
            cur.fetchall()
            phases.mark("fetch")

        return once

    actions = {
        "local, no guard": local(False),
        "local, guard": local(True),
        "remote, no guard": through_cursor(remote_sql),
        "remote, guard": through_cursor(failing_sql),
    }
    samples: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    # in turns, each round in a shuffled order: a variant that always ran right after a
    # local one would share the cores with DuckDB's threads winding down
    order = random.Random(0)
    try:
        for _ in range(rounds):
            for variant in order.sample(VARIANTS, len(VARIANTS)):
                phases.take()
                actions[variant]()
                samples[variant].append(phases.take())
    finally:
        session.phases = None
    rows = []
    for variant in VARIANTS:
        runs = samples[variant]
        total = statistics.median(sum(s.values()) for s in runs)
        for phase in (*PHASES, "total"):
            value = (
                total if phase == "total" else statistics.median(s.get(phase, 0.0) for s in runs)
            )
            rows.append(
                {
                    "query": name,
                    "variant": variant,
                    "phase": phase,
                    "median_us": value * 1e6,
                    "runs": len(runs),
                    "rows_returned": len(want),
                }
            )
    return rows


def _table(rows: list[Read]) -> dict[tuple[str, str, str], float]:
    return {(r["query"], r["variant"], r["phase"]): number(r["median_us"]) or 0.0 for r in rows}


def plot(rows: list[Read], out: Path) -> list[Path]:
    found = _table(rows)
    names = list(dict.fromkeys(r["query"] for r in rows))
    drawn, axes = figure(8, 4)
    width = 0.35
    for offset, (side, color) in enumerate((("local", "tab:green"), ("remote", "tab:gray"))):
        values = [relative(found, n, side) for n in names]
        axes.bar(
            [i + (offset - 0.5) * width for i in range(len(names))],
            values,
            width,
            color=color,
            label=f"{side}: ours",
        )
    axes.scatter(
        [i - width / 2 for i in range(len(names))],
        [DISSERTATION_LOCAL[n] for n in names],
        color="black",
        marker="_",
        s=400,
        label="local: dissertation",
        zorder=3,
    )
    axes.axhline(
        TARGET_LOCAL,
        color="tab:green",
        linestyle="--",
        linewidth=0.8,
        label=f"target local {TARGET_LOCAL:g}%",
    )
    axes.axhline(
        TARGET_REMOTE,
        color="tab:gray",
        linestyle="--",
        linewidth=0.8,
        label=f"target remote {TARGET_REMOTE:g}%",
    )
    axes.set_xticks(range(len(names)), names)
    axes.set_ylabel("guard overhead, % of the time without it")
    axes.set_title(f"Currency guard overhead, TPC-H SF {scale_of(rows)}")
    axes.legend(fontsize=8)
    return [save(drawn, out / "guard-overhead.png")]


def relative(found: dict[tuple[str, str, str], float], name: str, side: str) -> float:
    """The guard's overhead on one side (local, remote), % of the time without it."""
    without = found[(name, f"{side}, no guard", "total")]
    return 100.0 * (found[(name, f"{side}, guard", "total")] - without) / without


def report(rows: list[Read], plots: list[Path]) -> str:
    found = _table(rows)
    names = list(dict.fromkeys(r["query"] for r in rows))
    returned = {r["query"]: r["rows_returned"] for r in rows}
    overall = []
    for name in names:
        cells = [name, returned[name]]
        verdicts = []
        for side, target in (("local", TARGET_LOCAL), ("remote", TARGET_REMOTE)):
            without = found[(name, f"{side}, no guard", "total")]
            guarded = found[(name, f"{side}, guard", "total")]
            overhead = relative(found, name, side)
            cells += [
                f"{without:.0f}",
                f"{guarded:.0f}",
                f"{guarded - without:+.0f}",
                f"{overhead:+.1f}%",
            ]
            verdicts.append(f"{side} {'meets' if overhead <= target else 'misses'} {target:g}%")
        cells.insert(6, f"{DISSERTATION_LOCAL[name]:g}%")
        cells.append(f"< {DISSERTATION_REMOTE:g}%")
        cells.append("; ".join(verdicts))
        overall.append(cells)
    phases = []
    for name in names:
        for side in ("local", "remote"):
            cells = [name, side]
            for phase in PHASES:
                without = found[(name, f"{side}, no guard", phase)]
                guarded = found[(name, f"{side}, guard", phase)]
                cells.append(f"{without:.0f} / {guarded:.0f}")
            phases.append(cells)
    return "\n".join(
        [
            "Reconstructed from the prose (Table 4.4's queries were lost in the text form): Q1 a "
            "point lookup on c_custkey, Q2 one customer joined with its 6 orders, Q3 the "
            "customers of one nation (~6,000 rows at SF 1). Times in microseconds, medians of "
            "the runs, the four ways run in turns (each round in a shuffled order). Our "
            "orders_prj is keyed by o_orderkey (the table's key), so the local Q2 scans it "
            "where the dissertation's clustered index on (o_custkey, o_orderkey) made it an "
            "indexed nested loop.",
            "",
            "**Table 4.4: with and without the currency guard** (overhead = with - without)",
            "",
            markdown_table(
                [
                    "query",
                    "rows",
                    "local without",
                    "local with",
                    "local +us",
                    "local %",
                    "dissertation local %",
                    "remote without",
                    "remote with",
                    "remote +us",
                    "remote %",
                    "dissertation remote %",
                    "verdict",
                ],
                overall,
            ),
            "",
            "**Table 4.5: where the time goes** (each phase without / with the guard, us)",
            "",
            markdown_table(["query", "branch", *PHASES], phases),
            "",
            *(f"![{p.stem}]({p.name})" for p in plots),
        ]
    )
