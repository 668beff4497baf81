"""The driver: the checker's database made afresh, a run from start to verdict, and the
command line."""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import random
import shutil
import tempfile
import threading
import time
import typing as t
from pathlib import Path

import psycopg
from psycopg import sql
from rich.console import Console

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from experiments.chaos.owner import Owner, owner_main, reader
from experiments.chaos.run import Run, extender, fault_injector, supervisor, writer
from experiments.chaos.wire import (
    Wire,
    disconnector,
    free_port,
    wire_faults,
    wire_maintainer,
    wire_supervisor,
)
from experiments.chaos.world import (
    ACCOUNTS,
    BACKEND_SCHEMA,
    CACHE_SCHEMA,
    DATABASE,
    Journal,
    entries_of,
    group_of,
    logged_failures,
    observation_from,
    read_journal,
)
from experiments.chaos_check import Observation, Tick, Timeline, Unit, Verdict, check
from experiments.faulty_network import FaultyNetwork
from experiments.provenance import append_rows
from sql_ext.quoting import ident


def backend_timeline(run: Run, ended: float) -> Timeline:
    """The history from the backend's own log (complete: a tick and its log row commit
    together), with each commit's time from the writer that saw it return; a commit whose
    writer was killed or cut off before seeing it is bounded by the next tick's clock reading
    (that transaction waited on the clock row for it) or by the run's end."""
    with psycopg.connect(run.dsn) as pg:
        log = pg.execute(
            "SELECT tick, writes, visible_after FROM chaos_log ORDER BY tick"
        ).fetchall()
    ticks = []
    for index, (tick, writes, visible_after) in enumerate(log):
        committed = run.commits.get(tick)
        if committed is None:
            committed = log[index + 1][2] if index + 1 < len(log) else ended
        ticks.append(
            Tick(
                int(tick),
                committed,
                {int(k): int(v) for k, v in writes.items()},
                float(visible_after),
            )
        )
    rows = {i: group_of(i) for i in range(1, ACCOUNTS + 1)}
    rows |= {e: -1 for a in range(1, ACCOUNTS + 1) for e in entries_of(a)}  # entries: no group
    return Timeline(rows, ticks)


def final_regions(run: Run, timeline: Timeline) -> Verdict:
    """Every cached region equals the backend's rows at one snapshot as fresh as the region
    says (its refresh time); a presence region includes its gray child's rows."""
    observations = []
    with cache.Admin.open(run.cache_path) as admin:
        con = admin.store.con
        for view in admin.status()["views"]:
            name = view["name"]
            for region in view["regions"]:
                kind, key = region["kind"], region["key"]
                if kind == "presence":
                    rows = con.execute(
                        f"SELECT id, version FROM {ident(name)} WHERE id = ?", key
                    ).fetchall()
                    rows += con.execute(
                        "SELECT id, version FROM entry_hot WHERE account = ?", key
                    ).fetchall()
                elif kind in ("consistency", "completeness"):
                    rows = con.execute(
                        f"SELECT id, version FROM {ident(name)} WHERE grp = ?", key
                    ).fetchall()
                else:
                    rows = con.execute(f"SELECT id, version FROM {ident(name)}").fetchall()
                moment = _epoch(region["refreshed_at"])
                unit = Unit(rows=tuple((int(i), int(v)) for i, v in rows))
                observations.append(
                    Observation(-1, moment, moment, 0.0, (unit,), f"region {name} {kind} {key}")
                )
    return check(timeline, observations)


def _epoch(value: t.Any) -> float:
    moment = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
    return moment.timestamp()


def prepare(dsn: str) -> str:
    """The checker's own database on the backend, made afresh."""
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (DATABASE,)
        )
        pg.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(DATABASE)))
        pg.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info["dbname"] = DATABASE
    chaos_dsn = psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items()})
    with psycopg.connect(chaos_dsn, autocommit=True) as pg:
        pg.execute(BACKEND_SCHEMA)
    return chaos_dsn


def run_chaos(
    dsn: str,
    seconds: float,
    seed: int,
    console: Console | None = None,
    restart: t.Callable[[], None] | None = None,
    spark: bool = True,
    wire: bool = False,
    completeness: bool = True,
    patience: float = 3.0,
) -> dict[str, t.Any]:
    """A run against ``dsn`` (its server gets a database of the checker's own); ``restart``
    stops and starts that server (faults of that kind are injected only when given);
    ``wire``: the cache as `mtcache serve`, driven over the protocol (see the module);
    ``completeness=False``: no completeness region is ever admitted (group reads then come
    from the consistency-controlled view or the backend; what a completeness region holds:
    docs/decisions/regions-and-their-stamps.md); ``patience``: the run goes on, up to this many
    times ``seconds``, while a fault kind has not had its turn."""
    console = console or Console()
    started = time.time()
    chaos_dsn = prepare(dsn)
    work = Path(tempfile.mkdtemp(prefix="mtcache-chaos-"))
    served: Wire | None = None
    try:
        run = Run(
            chaos_dsn,
            work / "cache.duckdb",
            seed,
            time.time() + seconds,
            work,
            spark and not wire,
            restart,
        )
        with cache.connect(chaos_dsn, run.cache_path) as conn:
            conn.admin.apply_ddl(CACHE_SCHEMA)
            conn.admin.admit("acct_pct", [1, 2, 3])
            conn.admin.admit("grp_csct", [0])
            if completeness:
                conn.admin.admit("grp_cpct", [1])
        threads = [threading.Thread(target=writer, args=(run, i)) for i in range(2)]
        if wire:
            info = psycopg.conninfo.conninfo_to_dict(chaos_dsn)
            network = FaultyNetwork(
                (str(info.get("host", "127.0.0.1")), int(str(info.get("port", 5432))))
            )
            proxied = psycopg.conninfo.make_conninfo(
                chaos_dsn, host="127.0.0.1", port=str(network.port)
            )
            served = Wire(free_port(), network, proxied)
            clients = Owner(
                chaos_dsn,
                run.cache_path,
                seed,
                run.deadline,
                1,
                Journal(work / "clients.jsonl"),
                False,
                {},
                server=served.address,
            )
            served.clients = clients
            run.incarnations.append(work / "clients.jsonl")
            threads += [
                threading.Thread(target=wire_supervisor, args=(run, served)),
                threading.Thread(target=wire_faults, args=(run, served)),
                threading.Thread(target=wire_maintainer, args=(clients, completeness)),
                threading.Thread(
                    target=disconnector, args=(clients, functools.partial(run.note, run.faults))
                ),
            ]
            threads += [threading.Thread(target=reader, args=(clients, i)) for i in range(3)]
        else:
            threads += [
                threading.Thread(target=supervisor, args=(run,)),
                threading.Thread(target=fault_injector, args=(run,)),
                # (every fault kind gets its turn however loaded the machine: at most
                # ``patience`` times the run's length)
                threading.Thread(target=extender, args=(run, started + patience * seconds)),
            ]
        console.print(f"chaos for {seconds:g}s, seed {seed}{' over the wire' if wire else ''} ...")
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if served is not None and served.clients is not None:
            served.clients.journal.close()
        ended = time.time()
        observations, events = [], []
        for journal in run.incarnations:
            for record in read_journal(journal):
                kind = record["kind"]
                if kind == "observation":
                    observations.append(observation_from(record))
                elif kind == "tick":
                    run.commits[record["tick"]] = record["committed"]
                elif kind == "count":
                    getattr(run, record["counter"])[record["key"]] += 1
                elif kind == "event":
                    events.append((record["at"], record["what"]))
        timeline = backend_timeline(run, ended)
        verdict = check(timeline, observations)
        regions = final_regions(run, timeline)
        violations = verdict.violations + regions.violations
        violations += [k for k in run.errors if k.startswith("VIOLATION")]
        with psycopg.connect(chaos_dsn) as pg:  # what a client abandoned never committed
            kept = pg.execute("SELECT id FROM chaos_abandoned ORDER BY id").fetchall()
        violations += [
            f"VIOLATION an abandoned transaction's row {i} was committed" for (i,) in kept
        ]
        return {
            "seed": seed,
            "seconds": seconds,
            "ticks": timeline.last,
            "answers_checked": verdict.checked,
            "answers_local": verdict.local,
            "local_during_outages": sum(
                1
                for o in observations
                if o.local and any(down <= o.start <= up for down, up in run.outages)
            ),
            "regions_checked": regions.checked,
            "owner_incarnations": run.incarnations_served if wire else len(run.incarnations),
            "faults": dict(run.faults),
            "operations": dict(run.operations),
            "errors": {k: v for k, v in run.errors.items() if not k.startswith("VIOLATION")},
            "logged_failures": logged_failures(work),
            "violations": violations,
            "events": sorted(events),
        }
    finally:
        if served is not None:
            served.network.close()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.chaos",
        description="A randomized concurrent checker of the cache's currency and consistency.",
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int)
    parser.add_argument(
        "--backend",
        help="a PostgreSQL DSN (default: the embedded cluster, "
        "which the run also restarts now and then)",
    )
    parser.add_argument(
        "--embedded",
        default=".mtcache/pg",
        help="the embedded cluster's directory (default .mtcache/pg)",
    )
    parser.add_argument(
        "--no-spark",
        action="store_true",
        help="refresh inline only (no JVM in the cache's process)",
    )
    parser.add_argument(
        "--wire",
        action="store_true",
        help="the cache as `mtcache serve`, its clients over the protocol, a "
        "faulty network between it and the backend",
    )
    parser.add_argument("--owner", help=argparse.SUPPRESS)  # the cache's process, started here
    args = parser.parse_args(argv)
    if args.owner:
        return owner_main(json.loads(args.owner))
    console = Console()
    restart = None
    if args.backend:
        dsn = args.backend
    else:
        cluster = EmbeddedPostgres(Path(args.embedded))
        dsn = cluster.ensure_running()

        def restart() -> None:
            cluster.stop()
            cluster.ensure_running()

    seed = args.seed if args.seed is not None else random.randrange(2**31)
    result = run_chaos(
        dsn, args.seconds, seed, console, restart, spark=not args.no_spark, wire=args.wire
    )
    console.print(
        f"ticks committed {result['ticks']}; answers checked "
        f"{result['answers_checked']} ({result['answers_local']} local); regions "
        f"checked {result['regions_checked']}; the cache's process ran "
        f"{result['owner_incarnations']} times"
    )
    console.print(
        f"faults injected: {result['faults']}; answered locally while the backend "
        f"was down: {result['local_during_outages']}"
    )
    console.print(f"operations: {result['operations']}")
    console.print(f"errors (refused or retried, not checked): {result['errors']}")
    console.print(f"failures the cache's processes logged: {result['logged_failures']}")
    console.print(f"violations: {len(result['violations'])}")
    for violation in result["violations"][:20]:
        console.print(f"  {violation}", markup=False)
        moment = float(violation.split(" at ")[1].split(":")[0]) if " at " in violation else 0
        for began, event in result["events"]:
            if moment - 3 < began < moment + 1:
                console.print(f"      {event}", markup=False)
    append_rows(
        "chaos",
        [
            {
                k: (json.dumps(v) if isinstance(v, dict | list) else v)
                for k, v in result.items()
                if k != "events"
            }
        ],
    )
    return 1 if result["violations"] else 0
