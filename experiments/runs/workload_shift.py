"""`workload-shift`: the dissertation's §4.7.2 (Fig 4.2): how much of a repeated query the cache
answers as the currency bound B, the refresh interval f and the refresh delay d vary, against
the model p = (B - d) / f (clipped to [0, 1]; §4.6, `optimizer.rules.estimate_cost`).

Measured, not computed: a Q7-style query (a c_acctbal range of the customers of one nation)
runs over and over through the cache while the real refresh scheduler refreshes the view
``cust_shift`` every f; each execution's guard decides local or remote, and the fraction
answered locally is counted per bound. Time is scaled: one of the dissertation's time units
is ``UNIT`` seconds (0.1 s; 0.05 s with --quick), so f = 100 is 10 s. Queries arrive on a fixed
grid (not back to back, which would sample fast local periods more densely) with the bounds
in turns, over whole refresh cycles.

The delays: our pull of ``cust_shift`` takes tens of milliseconds (its natural delay, measured
first). The dissertation's d (1, 5, 8 and 10 units) is a replication agent's delivery delay;
it is emulated by holding each pulled batch back for the rest of d before it is applied
(fault injection ``after_pull:sleep=S``, cache.maintenance.faults). The model's d is the delay
the cache measured (``mtcache.snapshots``), as the planner's is.

Two sweeps, as Fig 4.2: (a) f = 100 and d in {1, 5, 10}, B from 0 to 120; (b) B = 10 and
d in {1, 5, 8}, f from 10 to 100. Our refreshes are pulls, one at a time: a refresh cannot
start before the previous one has landed, so points with f < 1.25 d are not run (the
dissertation's replication is pipelined). And the case the dissertation only states,
continuous propagation (f = 0): a ``REFRESH CONTINUOUSLY`` view under a write load, where the
data's currency moves with the heartbeat (interval h), so p = (B - d) / h, the step at B = d
the dissertation states being its limit as h -> 0.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import statistics
import time
import typing as t
from collections.abc import Iterator
from pathlib import Path

import psycopg

import cache
from cache.store.counters import Counter
from experiments import tpch
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
from experiments.workers import Workers
from optimizer.rules.estimate_cost import local_probability

NAME = "workload-shift"
TITLE = "Workload shift as the currency bound relaxes (dissertation §4.7.2, Fig 4.2)"

VIEW = (
    "CREATE CACHED VIEW cust_shift AS SELECT c_custkey, c_name, c_nationkey, c_acctbal "
    "FROM customer WHERE c_nationkey = 1 REFRESH EVERY {f_ms} MS"
)
LIVE = (
    "CREATE CACHED VIEW cust_live AS SELECT c_custkey, c_name, c_nationkey, c_acctbal "
    "FROM customer REFRESH CONTINUOUSLY"
)
QUERY = (
    "SELECT c.c_custkey, c.c_name, c.c_acctbal FROM customer c WHERE c.c_nationkey = 1 "
    "AND c.c_acctbal BETWEEN 0 AND 400 CURRENCY BOUND {b_ms} MS ON (c)"
)
TOLERANCE = 3.0  # percentage points: a measured point fits the model within this
ARRIVAL = 0.02  # seconds between query arrivals


class Sweep(t.NamedTuple):
    figure: str
    f: list[float]  # dissertation units
    d: list[float]
    bounds: list[float]


def sweeps(quick: bool) -> list[Sweep]:
    if quick:
        return [
            Sweep("4.2a", [100], [1, 5, 10], [0, 10, 30, 60, 90, 110, 120]),
            Sweep("4.2b", [10], [1, 5, 8], [10]),
        ]
    return [
        Sweep("4.2a", [100], [1, 5, 10], [0, 5, 10, 20, 40, 60, 80, 100, 105, 110, 120]),
        Sweep("4.2b", [10, 15, 20, 30, 50, 75, 100], [1, 5, 8], [10]),
    ]


def unit(quick: bool) -> float:
    """Seconds per dissertation time unit."""
    return 0.05 if quick else 0.1


def cycles(quick: bool) -> int:
    """Refresh cycles sampled per point."""
    return 2 if quick else 3


# continuous propagation (f = 0): the heartbeat interval and the bounds, in seconds
HEARTBEAT = 0.2
LIVE_BOUNDS = [0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0]


def run(ctx: Context) -> list[Row]:
    scale = unit(ctx.quick)
    points = [(s, f, d) for s in sweeps(ctx.quick) for d in s.d for f in s.f if f >= 1.25 * d]
    rows: list[Row] = []
    with ctx.progress("workload shift", total=2 + len(points)) as done:
        tpch.load(ctx.dsn, ctx.sf, ["customer"])
        done("measuring the natural delay")
        natural = _natural_delay(ctx)
        for sweep, f, d in points:
            done(f"Fig {sweep.figure}: f = {f:g}, d = {d:g} (x {scale:g} s)")
            rows += _periodic(ctx, sweep, f, d, scale, natural)
        done("continuous propagation")
        rows += _continuous(ctx)
    return rows


def _connect(ctx: Context, path: Path, **options: t.Any) -> cache.Connection:
    path.unlink(missing_ok=True)
    # the guarded plan is kept (the model is about guards: at small p the cost model would
    # send these queries to the backend whole), and every local answer computed
    return cache.connect(
        backend=ctx.dsn,
        cache_path=path,
        plan_choice="guarded",
        result_memo_bytes=0,
        autocommit=True,
        **options,
    )


def _natural_delay(ctx: Context) -> float:
    """The pull's own delay (median of five refreshes), without an emulated one."""
    path = ctx.out / "workload-shift.duckdb"
    with contextlib.closing(_connect(ctx, path, background=False)) as conn:
        conn.cursor().execute(VIEW.format(f_ms=3_600_000))
        for _ in range(5):
            conn.admin.refresh("cust_shift")
        delays = _delays(conn, 0)
    path.unlink(missing_ok=True)
    return statistics.median(delays)


def _delays(conn: cache.Connection, after: int) -> list[float]:
    """The delays of the refreshes after snapshot ``after``, as the cache measured them."""
    return [
        r[0]
        for r in conn.engine.store.con.execute(
            "SELECT delay_seconds FROM mtcache.snapshots WHERE snapshot_id > ? "
            "AND delay_seconds IS NOT NULL",
            [after],
        ).fetchall()
    ]


@contextlib.contextmanager
def _transport_delay(seconds: float) -> Iterator[None]:
    """Every refresh started meanwhile holds its pulled rows back ``seconds`` before applying
    them (the scheduler's pipelines read MTCACHE_FAULTS as they start)."""
    before = os.environ.get("MTCACHE_FAULTS")
    os.environ["MTCACHE_FAULTS"] = f"after_pull:sleep={seconds:.4f}"
    try:
        yield
    finally:
        if before is None:
            del os.environ["MTCACHE_FAULTS"]
        else:
            os.environ["MTCACHE_FAULTS"] = before


def _periodic(
    ctx: Context, sweep: Sweep, f: float, d: float, scale: float, natural: float
) -> list[Row]:
    path = ctx.out / "workload-shift.duckdb"
    injected = max(0.0, d * scale - natural)
    with _transport_delay(injected), contextlib.closing(_connect(ctx, path)) as conn:
        # the scheduler populates the view a tick after it is declared, then every f
        conn.cursor().execute(VIEW.format(f_ms=round(f * scale * 1000)))
        _wait_until_local(conn, QUERY.format(b_ms=3_600_000))
        first = _last_snapshot(conn)
        bounds = {b: QUERY.format(b_ms=round(b * scale * 1000)) for b in sweep.bounds}
        counts = _sample(conn, bounds, cycles(ctx.quick) * f * scale)
        measured = statistics.median(_delays(conn, first - 1))
    path.unlink(missing_ok=True)
    rows = []
    for b, (local, total, superseded) in counts.items():
        rows.append(
            {
                "figure": sweep.figure,
                "unit_s": scale,
                "f_units": f,
                "d_units": d,
                "b_units": b,
                "f_s": f * scale,
                "b_s": b * scale,
                "d_natural_s": natural,
                "d_injected_s": injected,
                "d_measured_s": measured,
                "queries": total,
                "local": local,
                "superseded": superseded,
                "p_measured": local / total,
                "p_model": local_probability(b * scale, measured, f * scale),
                "p_dissertation": local_probability(b, d, f),
            }
        )
    return rows


def _last_snapshot(conn: cache.Connection) -> int:
    row = conn.engine.store.con.execute("SELECT max(snapshot_id) FROM mtcache.snapshots").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _wait_until_local(conn: cache.Connection, sql: str, timeout: float = 60.0) -> None:
    """Until the view is populated (a query with a loose bound is answered locally)."""
    cur = conn.cursor()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cur.execute(sql)
        cur.fetchall()
        if cur.provenance and cur.provenance[0]["route"] == "local":
            return
        time.sleep(0.02)
    raise RuntimeError(f"the view was not populated within {timeout:g} s")


class Counts(t.NamedTuple):
    local: int
    queries: int
    superseded: int  # remote though every guard held (none since the cursor's last attempt
    # runs inside one DuckDB transaction; counted so a regression would show)


def _sample(
    conn: cache.Connection, bounds: dict[float, str], seconds: float
) -> dict[float, Counts]:
    """Run the query at each arrival on a fixed grid for ``seconds``, the bounds in turns (a
    shuffled order each round); what the guards decided, per bound."""
    cur = conn.cursor()
    counters = conn.session.counters
    counts = {b: [0, 0, 0] for b in bounds}
    order: list[float] = []
    shuffle = random.Random(42).shuffle
    start = time.monotonic()
    slot = 0
    while (due := start + slot * ARRIVAL) < start + seconds:
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        elif now - due > ARRIVAL:  # late: skip the missed arrivals (the grid stays uniform)
            slot = int((now - start) / ARRIVAL) + 1
            continue
        if not order:
            order = list(bounds)
            shuffle(order)
        b = order.pop()
        misses = counters[Counter.CURRENCY_MISSES] + counters[Counter.PRESENCE_MISSES]
        cur.execute(bounds[b])
        cur.fetchall()
        local = cur.provenance[0]["route"] == "local"
        guarded = cur.plan is not None and all(c.guarded for c in cur.plan.classes)
        counts[b][0] += local
        counts[b][1] += 1
        counts[b][2] += (
            not local
            and guarded
            and misses == counters[Counter.CURRENCY_MISSES] + counters[Counter.PRESENCE_MISSES]
        )
        slot += 1
    return {b: Counts(*c) for b, c in counts.items()}


class _Updates(Workers):
    """A steady write load on customer: one-row updates that leave the values as they are
    (the stream carries each; the data other experiments read is unchanged)."""

    def __init__(self, dsn: str, rate: float) -> None:
        self.dsn, self.rate, self.count = dsn, rate, 0
        super().__init__(1)

    def _run(self, index: int) -> None:
        rng = random.Random(index)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            (customers,) = conn.execute("SELECT count(*) FROM customer").fetchone() or (0,)
            while not self.stopping.wait(1 / self.rate):
                conn.execute(
                    "UPDATE customer SET c_acctbal = c_acctbal WHERE c_custkey = %s",
                    (rng.randint(1, customers),),
                )
                self.count += 1


def _continuous(ctx: Context) -> list[Row]:
    path = ctx.out / "workload-shift-live.duckdb"
    seconds = 5.0 if ctx.quick else 20.0
    conn = _connect(ctx, path, heartbeat=HEARTBEAT)
    try:
        cur = conn.cursor()
        cur.execute(LIVE)
        conn.admin.refresh("cust_live")
        with _Updates(ctx.dsn, rate=100) as writes:
            _wait_until_local(conn, QUERY.format(b_ms=3_600_000))
            first = _last_snapshot(conn)
            bounds = {b: QUERY.format(b_ms=round(b * 1000)) for b in LIVE_BOUNDS}
            counts = _sample(conn, bounds, seconds)
            delays = sorted(_delays(conn, first))
            measured = statistics.median(delays)
            p90 = delays[int(0.9 * (len(delays) - 1))]
        cur.execute("DROP CACHED VIEW cust_live")  # drops its replication slot
    finally:
        conn.close()
        path.unlink(missing_ok=True)
        # the updates left dead row versions: the experiments after this one read customer
        # (and PostgreSQL's estimates of it) as loaded
        with psycopg.connect(ctx.dsn, autocommit=True) as raw:
            raw.execute("VACUUM ANALYZE customer")
    rows = []
    for b, (local, total, superseded) in counts.items():
        rows.append(
            {
                "figure": "continuous",
                "f_units": 0,
                "f_s": 0.0,
                "b_s": b,
                "heartbeat_s": HEARTBEAT,
                "d_measured_s": measured,
                "d_p90_s": p90,
                "queries": total,
                "local": local,
                "superseded": superseded,
                "p_measured": local / total,
                "writes": writes.count,
                "p_model": local_probability(b, measured, HEARTBEAT),
                "p_dissertation": 1.0 if b > measured else 0.0,
            }
        )
    return rows


# -- plots and report -----------------------------------------------------------------------


def _points(rows: list[Read], fig: str) -> list[Read]:
    return [r for r in rows if r["figure"] == fig]


def _fits(row: Read) -> bool:
    return abs((number(row["p_measured"]) or 0) - (number(row["p_model"]) or 0)) * 100 <= TOLERANCE


def plot(rows: list[Read], out: Path) -> list[Path]:
    drawn, (left, right, live) = figure(15, 4.2, columns=3)
    colors = ["tab:blue", "tab:orange", "tab:green"]
    for axes, fig, x, by in (
        (left, "4.2a", "b_units", "d_units"),
        (right, "4.2b", "f_units", "d_units"),
    ):
        points = _points(rows, fig)
        for color, nominal in zip(colors, dict.fromkeys(r[by] for r in points), strict=False):
            mine = sorted((r for r in points if r[by] == nominal), key=lambda r: float(r[x]))
            xs = [float(r[x]) for r in mine]
            measured = float(mine[0]["d_measured_s"]) / float(mine[0]["unit_s"])
            grid = _grid(min(xs), max(xs))
            model = [_model(fig, g, mine[0], measured) for g in grid]
            axes.plot(
                grid, model, color=color, linewidth=1, label=f"model, d = {measured:.1f} (measured)"
            )
            axes.scatter(
                xs,
                [100 * float(r["p_measured"]) for r in mine],
                color=color,
                s=18,
                zorder=3,
                label=f"measured, d = {float(nominal):g}",
            )
        axes.set_ylim(-5, 105)
        axes.set_ylabel("% answered locally")
        axes.legend(fontsize=7)
    left.set_xlabel("currency bound B (f = 100)")
    left.set_title("(a) varying B")
    right.set_xlabel("refresh interval f (B = 10)")
    right.set_title("(b) varying f")
    points = sorted(_points(rows, "continuous"), key=lambda r: float(r["b_s"]))
    if points:
        d, h = float(points[0]["d_measured_s"]), float(points[0]["heartbeat_s"])
        xs = [float(r["b_s"]) for r in points]
        grid = _grid(0, max(xs))
        live.plot(
            grid,
            [100 * local_probability(g, d, h) for g in grid],
            color="tab:purple",
            linewidth=1,
            label=f"p = (B - d) / h, h = {h:g} s",
        )
        live.step(
            [0, d, max(xs)],
            [0, 100, 100],
            where="post",
            color="gray",
            linestyle="--",
            linewidth=1,
            label=f"f = 0: step at d = {d * 1000:.0f} ms",
        )
        live.scatter(
            xs,
            [100 * float(r["p_measured"]) for r in points],
            color="tab:purple",
            s=18,
            zorder=3,
            label="measured",
        )
        live.set_xscale("symlog", linthresh=0.1)
        live.set_xlabel("currency bound B, seconds")
        live.set_title("(c) REFRESH CONTINUOUSLY")
        live.set_ylim(-5, 105)
        live.legend(fontsize=7)
    unit_s = rows[0].get("unit_s", "") if rows else ""
    drawn.suptitle(
        f"Fig 4.2, measured: fraction answered locally (1 unit = {unit_s} s, "
        f"TPC-H SF {scale_of(rows)})"
    )
    return [save(drawn, out / "workload-shift.png")]


def _grid(low: float, high: float, steps: int = 200) -> list[float]:
    return [low + (high - low) * i / steps for i in range(steps + 1)]


def _model(fig: str, x: float, row: Read, d: float) -> float:
    """The model's % local at x (B for Fig 4.2a, f for 4.2b), d in units."""
    if fig == "4.2a":
        return 100 * local_probability(x, d, float(row["f_units"]))
    return 100 * local_probability(float(row["b_units"]), d, x)


def report(rows: list[Read], plots: list[Path]) -> str:
    periodic = [r for r in rows if r["figure"] != "continuous"]
    live = _points(rows, "continuous")
    table = []
    for r in periodic:
        fits = _fits(r)
        table.append(
            [
                r["figure"],
                f"{float(r['f_units']):g}",
                f"{float(r['d_units']):g}",
                f"{float(r['b_units']):g}",
                f"{float(r['d_measured_s']) * 1000:.0f}",
                f"{100 * float(r['p_dissertation']):.1f}",
                f"{100 * float(r['p_model']):.1f}",
                f"{100 * float(r['p_measured']):.1f}",
                r["queries"],
                "fits" if fits else _why(r),
            ]
        )
    live_table = [
        [
            f"{float(r['b_s']) * 1000:.0f}",
            f"{100 * float(r['p_dissertation']):.0f}",
            f"{100 * float(r['p_model']):.1f}",
            f"{100 * float(r['p_measured']):.1f}",
            r["queries"],
            "fits" if _fits(r) else _why(r),
        ]
        for r in live
    ]
    fitting = sum(_fits(r) for r in periodic)
    unit_s = periodic[0]["unit_s"] if periodic else "?"
    lines = [
        f"Time scale: one dissertation time unit = {unit_s} s (f = 100 is "
        f"{100 * float(unit_s or 0):g} s). d is emulated as a held-back delivery on top of "
        "the pull's own delay and measured by the cache; the model column is "
        "p = (B - d) / f with the measured d, the dissertation column with its nominal d. "
        f"**{fitting} of {len(periodic)} points fit the model within ±{TOLERANCE:g} "
        "percentage points.**",
        "",
        markdown_table(
            [
                "Fig",
                "f",
                "d",
                "B",
                "d measured (ms)",
                "dissertation % local",
                "model % local",
                "measured % local",
                "queries",
                "verdict",
            ],
            table,
        ),
    ]
    if live:
        d, h = float(live[0]["d_measured_s"]), float(live[0]["heartbeat_s"])
        lines += [
            "",
            f"**Continuous propagation (f = 0)**: a REFRESH CONTINUOUSLY view under "
            f"{live[0]['writes']} one-row updates; measured propagation delay d = "
            f"{d * 1000:.0f} ms (p90 {float(live[0]['d_p90_s']) * 1000:.0f} ms). The "
            "data's currency advances with the heartbeat (every "
            f"{h:g} s), so p = (B - d) / h between d and d + h; the dissertation's step "
            "(p = 1 for B > d) is its limit as h shrinks.",
            "",
            markdown_table(
                [
                    "B (ms)",
                    "dissertation % local",
                    "model % local (h)",
                    "measured % local",
                    "queries",
                    "verdict",
                ],
                live_table,
            ),
        ]
    lines += ["", *(f"![{p.stem}]({p.name})" for p in plots)]
    return "\n".join(lines)


def _why(row: Read) -> str:
    off = 100 * ((number(row["p_measured"]) or 0) - (number(row["p_model"]) or 0))
    b = number(row.get("b_s", "")) or 0
    d = number(row["d_measured_s"]) or 0
    if b <= math.ceil(d * 100) / 100 and off < 0:
        return (
            f"off by {off:+.1f} pp: the planner rounds d up to a hundredth of a second, "
            f"so this bound is planned remote (§4.4's rule)"
        )
    measured = number(row["p_measured"]) or 0
    f = number(row.get("f_s", "")) or 0
    if f and 0 < measured < 1:  # periodic
        return (
            f"off by {off:+.1f} pp: B - d is {(b - d) * 1000:.0f} ms of a {f:g} s cycle, "
            "so each refresh's delay varying by tens of ms (d is their median), and "
            "the lag from the due time to the pull's snapshot, move the share by "
            "points"
        )
    p90 = number(row.get("d_p90_s", "")) or 0
    if p90 > 1.5 * d:
        return (
            f"off by {off:+.1f} pp: the delivery delay varies (median {d * 1000:.0f} ms, "
            f"p90 {p90 * 1000:.0f} ms); the model takes the median"
        )
    return f"off by {off:+.1f} pp"
