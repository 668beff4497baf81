"""View matching (§4.5): which cached views can answer a table access, and what their guard
must prove at run time.

A view V covers access A on table T when V selects from T, V's columns include A's, and V's
WHERE is implied by A's conjuncts (each of its conjuncts appears among A's, qualifiers aside).
Then:
* a fully materialized V needs only its currency checked;
* a presence-controlled V needs A to probe one of its presence keys with constants: the guard
  checks the probed values are present;
* otherwise A must probe a completeness key with constants the guard finds complete.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from control_tables.kinds import GuardKind
from control_tables.schema import CachedView, CacheSchema
from optimizer.analysis.analyze import Access
from sql_ext.blocks import split_and


@dataclass(frozen=True)
class Match:
    view: CachedView
    kind: GuardKind
    columns: tuple[str, ...] = ()  # the probed key (presence or completeness columns)
    control: str | None = None  # where the guard looks the probed values up (None: full)
    control_columns: tuple[str, ...] = ()


def match_access(access: Access, schema: CacheSchema) -> list[Match]:
    """Every way a cached view can answer the access, cheapest guard first."""
    found: list[Match] = []
    for view in sorted(schema.views.values(), key=lambda v: v.name):
        if view.is_derived:  # (its rows are not the table's: it answers no table access)
            continue
        if view.table != access.table or not access.columns <= set(view.columns):
            continue
        if not _where_implied(view, access):
            continue
        if view.is_fully_materialized:
            found.append(Match(view, GuardKind.FULL))
            continue
        for edge in view.presence:
            if all(c in access.probes for c in edge.columns):
                found.append(
                    Match(
                        view, GuardKind.PRESENCE, edge.columns, edge.control, edge.control_columns
                    )
                )
        spec = view.completeness
        if spec is not None and all(c in access.probes for c in spec.columns):
            found.append(
                Match(view, GuardKind.COMPLETENESS, spec.columns, spec.control, spec.columns)
            )
    return found


def _where_implied(view: CachedView, access: Access) -> bool:
    if view.where is None:
        return True
    have = {_unqualified(c) for c in access.conjuncts}
    return all(_unqualified(c) in have for c in split_and(view.where))


def _unqualified(node: exp.Expr) -> str:
    copy = node.copy()
    for column in copy.find_all(exp.Column):
        column.set("table", None)
    return copy.sql(dialect="postgres")
