"""The statement DuckDB runs for a guarded plan once its guards have chosen (SPEC §5.4): the
query without extensions, in DuckDB's dialect, each table reference rebound to the cached view
its SwitchUnion chose or to its remote leaf's rows (registered under a name of their own), and
its placeholders as DuckDB named parameters. Pure: the executor compiles it once per choice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlglot import exp

from optimizer.leaves import RemoteLeaf, unescape_percent
from optimizer.plan import Plan
from sql_ext.nodes import strip_extensions
from sql_ext.params import NODE_ID, Key, duckdb_name


@dataclass(frozen=True)
class LocalStatement:
    sql: str  # DuckDB
    keys: tuple[Key, ...]  # each placeholder key, in textual order ...
    names: tuple[str, ...]  # ... and its DuckDB parameter name
    leaves: tuple[tuple[str, RemoteLeaf], ...]  # (registered name, leaf), statement order


def leaf_name(instance_id: int) -> str:
    return f"mtcache_leaf_{instance_id}"


def local_statement(plan: Plan, choice: Mapping[int, str | None]) -> LocalStatement:
    """The statement for a choice: instance id -> the cached view read (None: the leaf)."""
    analysis = plan.analysis
    copy = strip_extensions(analysis.query.tree)
    if plan.with_params:
        unescape_percent(copy)
    by_id = {n.meta[NODE_ID]: n for n in copy.walk() if NODE_ID in n.meta}
    leaves = []
    for access in plan.accesses:
        view = choice.get(access.instance.id)
        if view is None:
            target = leaf_name(access.instance.id)
            leaves.append((target, access.leaf))
        else:
            target = view
        by_id[access.access.node.meta[NODE_ID]].replace(
            exp.Table(this=exp.to_identifier(target),
                      alias=exp.TableAlias(this=exp.to_identifier(access.alias)))
        )  # fmt: skip
    for mark in list(copy.find_all(exp.Placeholder)):
        key = analysis.parameter_keys[mark.meta[NODE_ID]]
        mark.replace(exp.Placeholder(this=exp.to_identifier(duckdb_name(key))))
    keys = analysis.keys
    return LocalStatement(
        copy.sql(dialect="duckdb"), keys, tuple(map(duckdb_name, keys)), tuple(leaves)
    )
