"""Roles the tests log in as."""

from __future__ import annotations

import psycopg


def login_role(dsn: str, role: str, attributes: str = "") -> str:
    """``role`` able to log in (created once per cluster: roles outlive the databases made
    for each test), and the DSN of ``dsn``'s database as it."""
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute(
            f"DO $$ BEGIN CREATE ROLE {role} LOGIN {attributes}; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
    return psycopg.conninfo.make_conninfo(dsn, user=role)
