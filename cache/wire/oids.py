"""PostgreSQL's type OIDs by name, as psycopg's registry of built-in types knows them."""

from __future__ import annotations

import psycopg


def oid_of(name: str) -> int:
    """The OID of a built-in type (``int4``, ``timestamptz``)."""
    info = psycopg.postgres.types.get(name)
    if info is None:
        raise KeyError(f"no built-in PostgreSQL type named {name!r}")
    return info.oid


_ELEMENTS = {info.array_oid: info.oid for info in psycopg.postgres.types if info.array_oid}


def element_oid(oid: int) -> int | None:
    """The element type of a built-in array type (``_int4``: int4), None for any other."""
    return _ELEMENTS.get(oid)


class OID:
    """The built-in types the cache's answers and the server's encoders name."""

    bool = oid_of("bool")
    bytea = oid_of("bytea")
    char = oid_of('"char"')
    name = oid_of("name")
    int8 = oid_of("int8")
    int2 = oid_of("int2")
    int4 = oid_of("int4")
    text = oid_of("text")
    oid = oid_of("oid")
    float4 = oid_of("float4")
    float8 = oid_of("float8")
    bpchar = oid_of("bpchar")
    varchar = oid_of("varchar")
    date = oid_of("date")
    time = oid_of("time")
    timestamp = oid_of("timestamp")
    timestamptz = oid_of("timestamptz")
    interval = oid_of("interval")
    numeric = oid_of("numeric")
    uuid = oid_of("uuid")
