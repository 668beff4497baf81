"""PEP 249 type objects: each compares equal to the PostgreSQL type codes of its group, as a
cursor's ``description`` reports them (psycopg's OIDs, for local and remote answers alike)."""

from __future__ import annotations


class DBAPITypeObject:
    """Compares equal to every type code of its group (PEP 249 type objects)."""

    def __init__(self, name: str, *pg_types: str) -> None:
        self.name = name
        self._types = pg_types
        self._values: frozenset[int] | None = None

    @property
    def values(self) -> frozenset[int]:
        """The group's OIDs (found when first compared: importing `cache` loads no driver)."""
        if self._values is None:
            import psycopg

            types = psycopg.postgres.types
            self._values = frozenset(
                info.oid for n in self._types if (info := types.get(n)) is not None
            )
        return self._values

    def __eq__(self, other: object) -> bool:
        return other in self.values if isinstance(other, int) else other is self

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"<DBAPITypeObject {self.name}>"


STRING = DBAPITypeObject(
    "STRING", "text", "varchar", "bpchar", "char", "name", "json", "jsonb", "xml", "uuid"
)
BINARY = DBAPITypeObject("BINARY", "bytea")
NUMBER = DBAPITypeObject("NUMBER", "int2", "int4", "int8", "float4", "float8", "numeric", "oid")
DATETIME = DBAPITypeObject(
    "DATETIME", "date", "time", "timetz", "timestamp", "timestamptz", "interval"
)
ROWID = DBAPITypeObject("ROWID", "oid", "tid")
