"""``mtcache doctor`` against a real backend: every requirement met as the cluster's superuser;
each one a restricted role lacks named, with the change to make, and exit 1."""

from __future__ import annotations

import json
import subprocess

import psycopg

from cache.backend.embedded_pg import EmbeddedPostgres
from tests.roles import login_role


def _doctor(mtcache_bin: str, env: dict[str, str], dsn: str, *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [mtcache_bin, "--backend", dsn, "doctor", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stderr == "", done.stderr
    return done.returncode, done.stdout


def test_doctor_names_what_a_backend_lacks(
    pg_cluster: EmbeddedPostgres, mtcache_bin: str, clean_env: dict[str, str]
) -> None:
    owner = pg_cluster.create_database("doctor")
    code, said = _doctor(mtcache_bin, clean_env, owner)
    assert code == 0 and said.rstrip().endswith("the backend has what the cache needs"), said
    plain = login_role(owner, "doctor_plain", "NOREPLICATION")
    with psycopg.connect(owner, autocommit=True) as pg:
        pg.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    code, said = _doctor(mtcache_bin, clean_env, plain)
    assert code == 1, said
    assert "NEED replication privilege" in said and "ALTER ROLE ... REPLICATION" in said
    assert "NEED the heartbeat table" in said and "GRANT CREATE ON SCHEMA public" in said
    assert "NEED reading pg_authid" in said and "--auth-file" in said
    assert "ok   wal_level" in said and "3 requirements unmet" in said
    code, document = _doctor(mtcache_bin, clean_env, plain, "--json")
    found = json.loads(document)
    assert code == 1 and found["unmet"] == 3
    unmet = {r["name"] for r in found["requirements"] if not r["met"]}
    assert unmet == {"replication privilege", "the heartbeat table", "reading pg_authid"}
    assert all(r["change"] is None for r in found["requirements"] if r["met"])
