"""Where a result's rows came from: per table access, local or remote, the view
and regions read, their currency and snapshot ids; and what the statement sent where
(`Executed`). Frozen values; `to_json` gives the documented shapes (docs/json-outputs.md).
Each entry also reads like the documented dict (``entry["route"]``), so code written against
the documented shape keeps working.
"""

from __future__ import annotations

import datetime as dt
import typing as t
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from optimizer.rules.evaluate_guards import Binding, Decision


class Executed(t.NamedTuple):
    """What a statement sent where: to PostgreSQL whole (``backend_sql``), or to DuckDB
    (``duckdb_sql``) with the leaf queries it read from PostgreSQL. (A NamedTuple, like the
    other values every execution makes: cheap to make.)"""

    backend_sql: str | None = None
    duckdb_sql: str | None = None
    leaves: tuple[str, ...] = ()


_FIELDS = ("table", "route", "view", "regions", "currency_seconds", "snapshot_ids", "stale")


@dataclass(frozen=True)
class AccessProvenance(Mapping[str, t.Any]):
    table: str  # the base table
    route: t.Literal["local", "remote"]
    view: str | None = None  # the cached view read (local)
    regions: tuple[tuple[t.Any, ...], ...] = ()  # control-key values of the regions read
    currency_seconds: float | None = 0.0  # age of the oldest region read (remote: current)
    snapshot_ids: tuple[int, ...] = ()
    stale: bool = False  # beyond its bound, returned under stale_ok with the backend down

    def to_json(self) -> dict[str, t.Any]:
        return {
            "table": self.table,
            "route": self.route,
            "view": self.view,
            "regions": [list(k) for k in self.regions],
            "currency_seconds": self.currency_seconds,
            "snapshot_ids": list(self.snapshot_ids),
            "stale": self.stale,
        }

    def __getitem__(self, key: str) -> t.Any:
        if key not in _FIELDS:
            raise KeyError(key)
        return self.to_json()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)


@dataclass(frozen=True)
class Provenance(Sequence[AccessProvenance]):
    """One entry per table access of a statement, in statement order."""

    accesses: tuple[AccessProvenance, ...] = ()

    @classmethod
    def remote(cls, tables: t.Iterable[str]) -> Provenance:
        """Every access answered by the backend: current data."""
        return cls(tuple(AccessProvenance(table, "remote") for table in tables))

    @classmethod
    def of(cls, decision: Decision, *, mark_stale: bool = False) -> Provenance:
        """The accesses of a local or mixed decision; with ``mark_stale``, a local access whose
        data is older than its class's bound says so (stale_ok, the backend down)."""
        assert decision.bindings is not None
        return cls(tuple(_entry(b, decision.now, mark_stale) for b in decision.bindings))

    def to_json(self) -> list[dict[str, t.Any]]:
        return [a.to_json() for a in self.accesses]

    @classmethod
    def from_json(cls, document: list[dict[str, t.Any]]) -> Provenance:
        """The provenance `to_json` gave (a cache server's NOTICE carries it)."""
        return cls(
            tuple(
                AccessProvenance(
                    table=e["table"],
                    route=e["route"],
                    view=e["view"],
                    regions=tuple(tuple(k) for k in e["regions"]),
                    currency_seconds=e["currency_seconds"],
                    snapshot_ids=tuple(e["snapshot_ids"]),
                    stale=e["stale"],
                )
                for e in document
            )
        )

    def __getitem__(self, index: int) -> AccessProvenance:  # type: ignore[override]
        return self.accesses[index]

    def __len__(self) -> int:
        return len(self.accesses)


def _entry(binding: Binding, now: dt.datetime, mark_stale: bool) -> AccessProvenance:
    table = binding.access.table
    if binding.guard is None:
        return AccessProvenance(table, "remote")
    stamps = [stamp for _, stamp in binding.regions]
    age = max(((now - s[0]).total_seconds() for s in stamps if s[0]), default=0.0)
    return AccessProvenance(
        table=table,
        route="local",
        view=binding.guard.view,
        regions=tuple(tuple(k) for k, _ in binding.regions),
        currency_seconds=age,
        snapshot_ids=tuple(sorted({s[1] for s in stamps if s[1] is not None})),
        stale=mark_stale and age > binding.bound_seconds,
    )
