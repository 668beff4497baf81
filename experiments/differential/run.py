"""A run of the differential oracle: TPC-H at scale factor 0.01 on the backend, every table
cached as a fully materialized view, a session bound of 10 minutes, and random queries
(`experiments.differential.generate`) each compared with PostgreSQL's answer twice - through a
connection planning by cost and through one forcing the guarded plan
(``plan_choice="guarded"``) - plus ternary-logic partitioning through the cache.

    mtcache experiment differential [--queries N] [--seed S] [--out DIR]

The queries come from seeds S, S+1, ... (`PER_SEED` queries each). The report
(DIR/differential.md, the failures in DIR/differential.csv; exit 1 if there are any) gives the
queries run, the local share of each pass, the failures by kind and a minimal reproduction of
each in the format of tests/fixtures/differential.sql, where every failure found becomes a
regression test.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import re
import tempfile
import time
import typing as t
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from rich.console import Console

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from experiments import tpch
from experiments.differential.generate import partition_cases, queries
from experiments.differential.oracle import (
    STATEMENT_TIMEOUT_MS,
    TIMEOUT,
    Difference,
    Outcome,
    check_partitions,
    compare,
    minimal,
    on_cache,
    on_postgres,
)
from experiments.differential.shapes import Query
from experiments.provenance import provenance

SCALE = 0.01
PER_SEED = 1000
PASSES = ("cost", "guarded")
GUARD_CHOSE_REMOTE = "a guard chose PostgreSQL when the query ran (a cached view not fresh)"
PARTITION_EVERY = 5  # one ternary-logic partitioning check per this many queries

# the constructs a query's text shows, each counted apart in the report's local shares (a
# query counts under every construct it uses): the next gap shows as a construct answered
# remotely, before a user finds it
CONSTRUCTS: dict[str, re.Pattern[str]] = {
    name: re.compile(pattern, re.IGNORECASE)
    for name, pattern in {
        "join": r"\bJOIN\b",
        "outer join": r"\b(LEFT|RIGHT|FULL) JOIN\b",
        "LATERAL": r"\bLATERAL\b",
        "derived table": r"\bFROM \(SELECT\b|JOIN \(SELECT\b",
        "CTE": r"^WITH\b",
        "WITH RECURSIVE": r"\bWITH RECURSIVE\b",
        "VALUES list": r"\(VALUES\b",
        "generate_series": r"\bgenerate_series\(",
        "GROUP BY": r"\bGROUP BY\b",
        "grouping sets": r"\b(ROLLUP|CUBE|GROUPING SETS)\b",
        "FILTER": r"\bFILTER \(WHERE\b",
        "HAVING": r"\bHAVING\b",
        "DISTINCT": r"\bDISTINCT\b",
        "window": r"\bOVER \(",
        "ORDER BY with LIMIT": r"\bORDER BY\b.*\bLIMIT\b",
        "set operation": r"\b(UNION|INTERSECT|EXCEPT)\b",
        "subquery": r"\((SELECT|EXISTS)\b|\bIN \(SELECT\b",
        "IN list": r"\bIN \((?!SELECT)",
        "row IN list": r"\)\s+(NOT\s+)?IN\s+\(\(",
        "BETWEEN SYMMETRIC": r"\bBETWEEN SYMMETRIC\b",
        "CASE": r"\bCASE\b",
        "string function": r"\b(substring|substr|replace|trim|btrim|ltrim|rtrim|lpad|rpad|left|"
        r"right|split_part|translate|repeat|reverse|concat|concat_ws|length|position|strpos|md5|"
        r"initcap)\(|\|\|",
        "case mapping": r"\b(upper|lower)\(|\bILIKE\b",
        "pattern": r"\bLIKE\b|\bSIMILAR TO\b|~",
        "regular expression": r"\bregexp_\w+\(|~|\bsubstring\([^()]* FROM '",
        "to_char": r"\bto_char\(",
        "date/time arithmetic": r"\binterval\b|\bage\(|\bdate_trunc\(|\bextract\(",
        "string_agg": r"\bstring_agg\(",
        "array_agg": r"\barray_agg\(",
        "div": r"\bdiv\(",
        "statistics": r"\b(stddev|variance|stddev_pop|var_pop|stddev_samp|var_samp)\(",
    }.items()
}


# remote reasons that are no gap of the cache's: PostgreSQL's own answer depends on the order
# its plan feeds rows to a sum of doubles, which no other engine can reproduce
ORDER_DEPENDENT = (
    "it sums floating-point values",
    "it averages float values",
    "of double precision values (PostgreSQL's running sums",
)


# the report's tables also count, per family and construct, the guarded remote answers of
# `ORDER_DEPENDENT` reasons under this name
DOUBLES = "sums of doubles"


def order_dependent(reason: str | None) -> bool:
    """Whether a remote plan's reason is one of `ORDER_DEPENDENT`."""
    return reason is not None and any(r in reason for r in ORDER_DEPENDENT)


def constructs(sql: str) -> list[str]:
    """The constructs (`CONSTRUCTS`) a query's text uses."""
    return [name for name, pattern in CONSTRUCTS.items() if pattern.search(sql)]


@dataclass(frozen=True)
class Failure:
    seed: int
    number: int  # the query's place in its seed's sequence
    plan: str  # the pass: cost, guarded or partition
    kind: str
    detail: str
    sql: str
    reproduction: str  # a smaller query failing the same way


@dataclass
class Report:
    queries: int = 0
    seconds: float = 0.0
    slow: int = 0  # not compared: PostgreSQL ran past the statement timeout
    errors: int = 0  # queries PostgreSQL raised an error for (compared by SQLSTATE)
    partitions: int = 0
    routes: dict[str, Counter[str]] = field(default_factory=lambda: {p: Counter() for p in PASSES})
    shapes: Counter[str] = field(default_factory=Counter)
    # per shape (the report's families) and per construct: pass -> route -> count
    by_shape: dict[str, dict[str, Counter[str]]] = field(default_factory=dict)
    by_construct: dict[str, dict[str, Counter[str]]] = field(default_factory=dict)
    remote_reasons: Counter[str] = field(default_factory=Counter)
    failures: list[Failure] = field(default_factory=list)

    def local_share(self, plan: str) -> float:
        counted = sum(self.routes[plan].values())
        return self.routes[plan]["local"] / counted if counted else 0.0

    def count_route(
        self, query: Query, plan: str, route: str, order_dependent: bool = False
    ) -> None:
        """Count a route under the query's family and constructs (``order_dependent``: a
        guarded remote answer for an `ORDER_DEPENDENT` reason, also counted as such)."""
        for table, key in [(self.by_shape, query.kind)] + [
            (self.by_construct, name) for name in constructs(query.sql())
        ]:
            passes = table.setdefault(key, {p: Counter() for p in (*PASSES, DOUBLES)})
            passes[plan][route] += 1
            passes[DOUBLES][route] += order_dependent

    @property
    def order_dependent(self) -> int:
        """The guarded remote answers for `ORDER_DEPENDENT` reasons (each query has one
        family)."""
        return sum(sum(passes[DOUBLES].values()) for passes in self.by_shape.values())

    def by_kind(self) -> Counter[str]:
        return Counter(f"{f.plan}: {f.kind}" for f in self.failures)


@contextlib.contextmanager
def connections(
    dsn: str, cache_path: Path
) -> Iterator[tuple[psycopg.Connection[t.Any], dict[str, cache.Connection]]]:
    """PostgreSQL itself, and one cache connection per pass, on one cache file holding every
    TPC-H table (refreshed now)."""
    # no parallel plans: PostgreSQL's own sums of doubles would change with the workers' order
    options = (
        (f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c max_parallel_workers_per_gather=0")
        .replace(" ", "%20")
        .replace("=", "%3D")
    )
    limited = f"{dsn}{'&' if '?' in dsn else '?'}options={options}"
    pg = psycopg.connect(limited, autocommit=True)
    opened: dict[str, cache.Connection] = {}
    try:
        for plan in PASSES:
            opened[plan] = cache.connect(
                backend=limited,
                cache_path=cache_path,
                currency_bound="10 min",
                admit_on_miss=False,
                background=False,
                autocommit=True,
                plan_choice=plan,
            )
        tpch.cache_every_table(opened["cost"])
        yield pg, opened
    finally:
        for conn in opened.values():
            conn.close()
        pg.close()


def check(
    query: Query, pg: psycopg.Connection[t.Any], conn: cache.Connection
) -> tuple[Outcome, Outcome, Difference | None]:
    sql = query.sql()
    expected = on_postgres(pg, sql)
    got = on_cache(conn, sql)
    return expected, got, compare(expected, got, query.ordered)


def run(
    dsn: str,
    cache_path: Path,
    count: int,
    seed: int,
    step: Callable[[str], None] | None = None,
) -> Report:
    """Run ``count`` queries from seeds ``seed``, ``seed + 1``, ... (`PER_SEED` each)."""
    tpch.load(dsn, SCALE, list(tpch.TABLES))
    with connections(dsn, cache_path) as (pg, conns):
        return run_queries(pg, conns, count, seed, step)


def run_queries(
    pg: psycopg.Connection[t.Any],
    conns: dict[str, cache.Connection],
    count: int,
    seed: int,
    step: Callable[[str], None] | None = None,
) -> Report:
    """``count`` queries from seeds ``seed``, ``seed + 1``, ... through ``conns`` (one cache
    connection per pass) and on ``pg``."""
    report = Report()
    started = time.monotonic()
    done = 0
    current = seed
    while done < count:
        block = min(PER_SEED, count - done)
        if done:
            # pulled again: a long run outlives the session bound, and queries whose guards
            # then chose PostgreSQL would measure the clock, not the cache
            conns[PASSES[0]].admin.refresh()
        _run_seed(report, pg, conns, current, block, step)
        done += block
        current += 1
    report.seconds = time.monotonic() - started
    return report


def _run_seed(
    report: Report,
    pg: psycopg.Connection[t.Any],
    conns: dict[str, cache.Connection],
    seed: int,
    count: int,
    step: Callable[[str], None] | None,
) -> None:
    cases = partition_cases(seed, count // PARTITION_EVERY + 1)
    for number, query in enumerate(queries(seed, count)):
        report.queries += 1
        report.shapes[query.kind] += 1
        for plan in PASSES:
            expected, got, difference = check(query, pg, conns[plan])
            if expected.sqlstate == TIMEOUT:
                report.slow += 1
                break
            if plan == PASSES[0] and expected.failed:
                report.errors += 1
            if not expected.failed and not got.failed:
                report.routes[plan][got.route] += 1
                remote = plan == "guarded" and got.route != "local"
                report.count_route(query, plan, got.route, remote and order_dependent(got.reason))
                if remote:
                    report.remote_reasons[
                        _reason_kind(got.reason) if got.reason else GUARD_CHOSE_REMOTE
                    ] += 1
            if difference is not None:
                report.failures.append(
                    _failure(seed, number, plan, query, difference, pg, conns[plan])
                )
        if number % PARTITION_EVERY == 0:
            base, predicate = next(cases)
            report.partitions += 1
            difference = check_partitions(conns["cost"], base, predicate, pg)
            if difference is not None:
                report.failures.append(
                    Failure(
                        seed,
                        number,
                        "partition",
                        difference.kind,
                        difference.detail,
                        base.sql(),
                        f"{base.sql()} -- p: {predicate}",
                    )
                )
        if step is not None:
            step(f"seed {seed}, query {number + 1}")


def _failure(
    seed: int,
    number: int,
    plan: str,
    query: Query,
    difference: Difference,
    pg: psycopg.Connection[t.Any],
    conn: cache.Connection,
) -> Failure:
    def fails(candidate: Query) -> bool:
        expected, _, found = check(candidate, pg, conn)
        return (
            found is not None
            and found.kind == difference.kind
            and (expected.failed or difference.kind != "answered")
        )

    smaller = minimal(query, fails)
    return Failure(
        seed, number, plan, difference.kind, difference.detail, query.sql(), smaller.sql()
    )


def _reason_kind(reason: str) -> str:
    """A remote plan's reason without the statement's own text (for counting): its first
    clause after the tables, quoted text and literals masked, up to 16 words."""
    text = reason.split("PostgreSQL: ", 1)[-1].split("; (", 1)[0]
    text = re.sub(r"'(?:[^']|'')*'", "'…'", text)
    text = re.sub(r"\b\d+(\.\d+)?\b", "N", text)
    return " ".join(text.split()[:16])


# -- the report ---------------------------------------------------------------------------------


def write(report: Report, out: Path, seed: int) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stamp = provenance()
    with (out / "differential.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["seed", "number", "plan", "kind", "detail", "sql", "reproduction", *stamp])
        for f in report.failures:
            writer.writerow(
                [f.seed, f.number, f.plan, f.kind, f.detail, f.sql, f.reproduction, *stamp.values()]
            )
    lines = [
        "# Differential oracle",
        "",
        f"{report.queries} queries (seeds {seed}..{seed + max(report.queries - 1, 0) // PER_SEED}"
        f", {PER_SEED} per seed), each run on PostgreSQL and through the cache with the "
        f"cost-based plan and the guarded plan; {report.partitions} ternary-logic "
        f"partitionings; {report.seconds / 60:.1f} min. TPC-H SF {SCALE:g}, every table cached, "
        "a session bound of 10 min.",
        "",
        f"- PostgreSQL raised an error for {report.errors} queries (compared by SQLSTATE); "
        f"{report.slow} ran past {STATEMENT_TIMEOUT_MS / 1000:g} s and were not compared.",
    ]
    for plan in PASSES:
        routes = report.routes[plan]
        lines.append(
            f"- {plan} plan: local {routes['local']}, mixed {routes['mixed']}, remote "
            f"{routes['remote']} - local share {report.local_share(plan):.1%}"
        )
    guarded = report.routes["guarded"]
    if report.order_dependent:
        counted = sum(guarded.values()) - report.order_dependent
        lines.append(
            f"- of the guarded plan's remote answers, {report.order_dependent} are sums or "
            "averages of doubles, whose value PostgreSQL's own plan decides by the order it adds "
            f"them in; without those, the guarded local share is {guarded['local'] / counted:.1%}"
        )
    lines += ["", f"## Failures: {len(report.failures)}", ""]
    for kind, number in sorted(report.by_kind().items()):
        lines.append(f"- {kind}: {number}")
    for f in report.failures[:200]:
        lines += [
            "",
            f"### seed {f.seed} #{f.number} ({f.plan}: {f.kind})",
            "",
            f.detail,
            "",
            "```sql",
            f"-- case: seed{f.seed}_{f.number}_{f.plan}",
            f.reproduction,
            "```",
        ]
    lines += ["", "## Why the guarded plan went remote", ""]
    for reason, number in report.remote_reasons.most_common(30):
        lines.append(f"- {number}: {reason}")
    lines += _share_table(
        "## Local share by family (the shape a query was made as)", report.by_shape
    )
    lines += _share_table(
        "## Local share by construct (a query counts under each it uses)", report.by_construct
    )
    path = out / "differential.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _share_table(title: str, table: dict[str, dict[str, Counter[str]]]) -> list[str]:
    lines = [
        "",
        title,
        "",
        "| | queries | guarded local | guarded share | cost local | cost share | guarded share "
        "without sums of doubles |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, passes in sorted(table.items(), key=lambda kv: -sum(kv[1]["guarded"].values())):
        cells = []
        for plan in ("guarded", "cost"):
            routes = passes[plan]
            counted = sum(routes.values())
            cells += [str(routes["local"]), f"{routes['local'] / counted:.1%}" if counted else "-"]
        guarded = passes["guarded"]
        rest = sum(guarded.values()) - sum(passes[DOUBLES].values())
        cells.append(f"{guarded['local'] / rest:.1%}" if rest else "-")
        lines.append(f"| {name} | {sum(passes['guarded'].values())} | {' | '.join(cells)} |")
    return lines


def main(
    argv: list[str] | None = None, backend: str | None = None, embedded: Path | None = None
) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="mtcache-experiments")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    if backend is None:
        cluster = EmbeddedPostgres(embedded or Path(".mtcache/pg"))
        cluster.ensure_running()
        backend = cluster.ensure_database("tpch_sf0_01")
    work = Path(tempfile.mkdtemp(prefix="mtcache-differential-"))
    from rich.progress import Progress

    with Progress(console=console) as bar:
        task = bar.add_task("differential", total=args.queries)
        report = run(
            backend,
            work / "cache.duckdb",
            args.queries,
            args.seed,
            lambda _: bar.update(task, advance=1),
        )
    path = write(report, Path(args.out), args.seed)
    console.print(
        f"{report.queries} queries, {len(report.failures)} failures; local share "
        f"cost {report.local_share('cost'):.1%}, guarded "
        f"{report.local_share('guarded'):.1%}; report: {path}"
    )
    return 0 if not report.failures else 1
