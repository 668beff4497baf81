"""What one maintenance operation did (admission, eviction or refresh)."""

from __future__ import annotations

import datetime as dt
import typing as t
from dataclasses import dataclass, field

NAMED_KEYS = 10  # a report or an error names this many keys and counts the rest


@dataclass
class Report:
    operation: str
    engine: str
    engine_reason: str | None = None  # why that engine (an engine chosen by size says)
    snapshot_id: int | None = None
    backend_time: dt.datetime | None = None
    regions: list[str] = field(default_factory=list)
    rows_deleted: dict[str, int] = field(default_factory=dict)
    rows_inserted: dict[str, int] = field(default_factory=dict)
    rounds: int = 0
    seconds: float = 0.0
    # the size budget (cache.maintenance.budget): presence keys it evicted, per control table,
    # and the data's bytes it left (None: no budget, or not passed)
    evicted: dict[str, int] = field(default_factory=dict)
    data_bytes: int | None = None
    # how many regions, when ``regions`` names only some (an operation on very many keys)
    region_count: int | None = None

    @property
    def regions_counted(self) -> int:
        return self.region_count if self.region_count is not None else len(self.regions)

    def name_regions(self, named: list[str], count: int) -> None:
        """The regions of an operation on very many keys: a few named, all counted (a
        million names would be the report's bulk)."""
        self.regions, self.region_count = named, count

    def to_json(self) -> dict[str, t.Any]:
        return {
            "operation": self.operation,
            "engine": self.engine,
            "engine_reason": self.engine_reason,
            "snapshot_id": self.snapshot_id,
            "backend_time": self.backend_time.isoformat() if self.backend_time else None,
            "regions": self.regions,
            "rows_deleted": self.rows_deleted,
            "rows_inserted": self.rows_inserted,
            "rounds": self.rounds,
            "seconds": round(self.seconds, 3),
            "evicted": self.evicted,
            "data_bytes": self.data_bytes,
            "region_count": self.regions_counted,
        }

    @classmethod
    def from_json(cls, document: dict[str, t.Any]) -> Report:
        """The report `to_json` gave (a cache server's NOTICE carries it)."""
        moment = document["backend_time"]
        return cls(
            **{**document, "backend_time": dt.datetime.fromisoformat(moment) if moment else None}
        )
