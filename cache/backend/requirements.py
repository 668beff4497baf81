"""What the cache needs of its backend, checked on a connection: each requirement met or not,
what it is needed for, and the change to make (`mtcache doctor`; `REFRESH CONTINUOUSLY`
checks its own before it makes anything, `cache.backend.replication.check_stream`)."""

from __future__ import annotations

import typing as t
from dataclasses import dataclass

import psycopg

HEARTBEAT_TABLE = "mtcache_heartbeat"  # (heartbeat.beat's table, named here for the check)


@dataclass(frozen=True)
class Requirement:
    name: str
    met: bool
    needed_for: str  # the feature that needs it
    found: str  # what the backend has
    change: str  # what to do when it is not met

    def to_json(self) -> dict[str, t.Any]:
        return {
            "name": self.name,
            "met": self.met,
            "needed_for": self.needed_for,
            "found": self.found,
            "change": None if self.met else self.change,
        }


STREAM = "REFRESH CONTINUOUSLY (the logical replication stream)"


def stream_requirements(wal_level: str, replication: bool, free_slots: int) -> list[Requirement]:
    """What continuous maintenance needs: ``wal_level``, whether the role may replicate
    (REPLICATION or superuser), and the replication slots still free."""
    return [
        Requirement(
            "wal_level",
            wal_level == "logical",
            STREAM,
            f"wal_level = {wal_level}",
            f"wal_level is {wal_level}, and logical decoding needs logical: set wal_level = "
            "logical in postgresql.conf and restart the backend",
        ),
        Requirement(
            "replication privilege",
            replication,
            STREAM,
            "the role may replicate" if replication else "the role may not replicate",
            "the role may not replicate: ALTER ROLE ... REPLICATION (or connect as one that may)",
        ),
        Requirement(
            "a free replication slot",
            free_slots > 0,
            STREAM,
            f"{free_slots} free",
            "no replication slot is free: raise max_replication_slots (a restart) or drop an "
            "unused slot (pg_drop_replication_slot)",
        ),
    ]


def backend_requirements(conn: psycopg.Connection[t.Any]) -> list[Requirement]:
    """Every requirement, checked on ``conn`` (as the role the cache connects as)."""
    row = conn.execute(
        "SELECT current_setting('wal_level'), "
        "(SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), "
        "current_setting('max_replication_slots')::int "
        "- (SELECT count(*) FROM pg_replication_slots), "
        "to_regclass(%s) IS NOT NULL, "
        "has_schema_privilege(current_schema(), 'CREATE'), "
        "(SELECT has_table_privilege(to_regclass(%s), 'INSERT, UPDATE') "
        " WHERE to_regclass(%s) IS NOT NULL), "
        "has_table_privilege('pg_catalog.pg_authid', 'SELECT'), current_schema()",
        (HEARTBEAT_TABLE, HEARTBEAT_TABLE, HEARTBEAT_TABLE),
    ).fetchone()
    assert row is not None
    wal, replication, slots, table, create, writes, authid, schema = row
    heartbeat = (
        Requirement(
            "the heartbeat table",
            bool(writes),
            "currency by the heartbeat (mtcache heartbeat, serve --heartbeat)",
            f"{HEARTBEAT_TABLE} exists" + ("" if writes else ", and the role may not write it"),
            f"GRANT INSERT, UPDATE ON {HEARTBEAT_TABLE} TO the cache's role",
        )
        if table
        else Requirement(
            "the heartbeat table",
            bool(create),
            "currency by the heartbeat (mtcache heartbeat, serve --heartbeat)",
            f"no {HEARTBEAT_TABLE} yet; the role "
            + ("may create it" if create else f"may not create tables in {schema}"),
            f"GRANT CREATE ON SCHEMA {schema} TO the cache's role, or create {HEARTBEAT_TABLE} "
            "as another role and grant INSERT, UPDATE on it",
        )
    )
    return [
        *stream_requirements(str(wal), bool(replication), int(slots)),
        heartbeat,
        Requirement(
            "reading pg_authid",
            bool(authid),
            "mtcache serve's default role verifiers (without --auth-file or --auth-query)",
            "the role may read pg_authid" if authid else "the role may not read pg_authid",
            "connect as a superuser, or give mtcache serve --auth-file FILE or --auth-query "
            "with a function of a role that may",
        ),
    ]


__all__ = ["Requirement", "backend_requirements", "stream_requirements"]
