"""Remote leaves (§4.4): the remote branch of a SwitchUnion is the same table access as SQL for
PostgreSQL - the columns the query uses from the table under the conjuncts pushed down to it -
whose rows a mixed plan imports into DuckDB (through Arrow, `cache.backend.copy_arrow`).

The SQL is made once per plan, in the form it runs: placeholders as psycopg named parameters
(``%(p0)s``, ``%(name)s``) bound client-side, a literal ``%`` doubled once parameters are passed
(psycopg's rule), every column sent in the text form the cache reads back.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass

from sqlglot import exp

from control_tables.types import select_list, transfer_type
from optimizer.analysis.analyze import Access
from sql_ext.catalog import Table
from sql_ext.dialect import MTCachePlain
from sql_ext.params import NODE_ID, Key, duckdb_name
from sql_ext.quoting import ident, qualified

_MARK = "mtcache_param_"  # placeholders while the SQL is generated, renamed afterwards


@dataclass(frozen=True)
class RemoteLeaf:
    sql: str  # PostgreSQL, with %(name)s parameters when the statement has placeholders
    columns: tuple[tuple[str, str], ...]  # (column, transfer type), in the order of the SQL

    @property
    def parameterized(self) -> bool:
        return "%(" in self.sql


def remote_leaf(
    access: Access, table: Table, keys: t.Mapping[int, Key], with_params: bool
) -> RemoteLeaf:
    """The leaf of an access. ``keys``: each placeholder's key by node number; ``with_params``:
    the statement is executed with parameters (it was parsed reading ``%%`` as ``%``; the
    leaf doubles its own % marks for psycopg)."""
    types = {c.name: c.type for c in table.columns}
    wanted = sorted(access.columns) or [table.column_names[0]]
    columns = tuple((c, transfer_type(types[c]) or "VARCHAR") for c in wanted)
    rendered = []
    used: set[Key] = set()
    for conjunct in access.conjuncts:
        marks = [keys[m.meta[NODE_ID]] for m in conjunct.find_all(exp.Placeholder)]
        if not marks:  # printed as it is (a long IN list of constants: in one go)
            rendered.append(conjunct.sql(dialect=MTCachePlain, copy=False))
            continue
        used.update(marks)
        copy = conjunct.copy()
        for mark in list(copy.find_all(exp.Placeholder)):
            key = keys[mark.meta[NODE_ID]]
            mark.replace(exp.Placeholder(this=exp.to_identifier(f"{_MARK}{key}")))
        rendered.append(copy.sql(dialect=MTCachePlain, copy=False))  # our own copy
    where = " AND ".join(f"({c})" for c in rendered) or "TRUE"
    sql = (
        f"SELECT {select_list(columns)} FROM {qualified(table.schema, table.name)} "
        f"AS {ident(access.alias)} WHERE {where}"
    )
    if keys:
        # psycopg reads % as the start of a placeholder once parameters are passed: double
        # the literal ones, then restore the parameters' own
        sql = sql.replace("%", "%%")
        for key in used:
            sql = sql.replace(f"%%({_MARK}{key})s", f"%({duckdb_name(key)})s")
    return RemoteLeaf(sql, columns)
