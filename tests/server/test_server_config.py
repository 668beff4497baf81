"""`mtcache serve --config FILE` with a file that sets every option the server takes, global
and its own (issue 53): it starts, a client logs in as the file's rules and secrets say (SCRAM
over TLS, the role's verifier from the file's auth file), and the file's settings hold."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import psycopg
import pytest
import trustme

import cache
from cache.tools.cli.wiring import settable
from tests.serving import serve_process

ROLE, PASSWORD = "cfg_app", "cfg secret"


def test_serve_starts_with_a_file_of_every_option(
    bookstore_dsn: str, tmp_path: Path, mtcache_bin: str
) -> None:
    with psycopg.connect(bookstore_dsn, autocommit=True) as pg:
        pg.execute(f"DROP ROLE IF EXISTS {ROLE}")
        pg.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'")
        pg.execute(f"GRANT SELECT ON authors TO {ROLE}")
        row = pg.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", [ROLE]).fetchone()
        assert row is not None
    authority = trustme.CA()
    issued = authority.issue_cert("localhost", "127.0.0.1")
    ca, cert, key = tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key"
    authority.cert_pem.write_to_path(str(ca))
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    key.chmod(0o600)
    hba, auth = tmp_path / "hba.conf", tmp_path / "users.txt"
    hba.write_text("hostssl all all 127.0.0.1/32 scram-sha-256\n")
    auth.write_text(f'"{ROLE}" "{row[0]}"\n')
    auth.chmod(0o600)
    top = {
        "backend": repr(bookstore_dsn).replace("'", '"'),
        "cache": f'"{tmp_path / "cache.duckdb"}"',
        "memory_limit": '"1GB"',
        "threads": "2",
        "cache_size_limit": '"200MB"',
        "spark_master": '"local[2]"',
    }
    serve = {
        "listen": '"127.0.0.1:0"',
        "heartbeat": "0.5",
        "cache_size_limit": '"100MB"',
        "doorkeeper": "30",
        "currency_bound": '"10 min"',
        "grace": "5",
        "hba": f'"{hba}"',
        "auth_file": f'"{auth}"',
        "auth_query": '"SELECT rolpassword FROM pg_authid WHERE rolname = $1"',
        "tls_cert": f'"{cert}"',
        "tls_key": f'"{key}"',
        "metrics": '"127.0.0.1:0"',
        "max_sessions": "50",
        "max_sessions_per_role": "10",
        "statement_timeout": "30000",  # ms, as PostgreSQL's setting
        "idle_in_transaction_timeout": '"10min"',
        "max_result_bytes": "10000000",
        "pool_size": "5",
        "pool_timeout": '"30s"',
        "spark_master": '"local[1]"',
        # (an existing cache file is served as it is: no peer is asked for a seed)
        "seed_from": '"127.0.0.1:1"',
    }
    # every option: one the server gains later must be added here (but `server`, which names
    # a server for the clients' commands: the server itself ignores it)
    assert sorted([*top, "server"]) == settable() and sorted(serve) == settable("serve")
    with cache.connect(bookstore_dsn, tmp_path / "cache.duckdb", background=False):
        pass  # (the file exists: seed_from is not used)
    config = tmp_path / "mtcache.toml"
    config.write_text(
        "".join(f"{k} = {v}\n" for k, v in top.items())
        + "\n[serve]\n"
        + "".join(f"{k} = {v}\n" for k, v in serve.items())
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTCACHE_")}
    env["MTCACHE_SERVER"] = "postgresql://app@cache.example:6432/shop"  # (for clients: ignored)
    with serve_process([mtcache_bin, "--config", str(config), "serve"], env) as started:
        port, url = started.port, started.metrics
        with urllib.request.urlopen(f"{url}/readyz", timeout=10) as answer:
            assert answer.status == 200
        dbname = psycopg.conninfo.conninfo_to_dict(bookstore_dsn)["dbname"]
        client = psycopg.conninfo.make_conninfo(
            host="127.0.0.1",
            port=port,
            user=ROLE,
            password=PASSWORD,
            dbname=dbname,
            sslmode="verify-full",
            sslrootcert=str(ca),
            channel_binding="require",  # (SCRAM-SHA-256-PLUS over the file's TLS)
        )
        with psycopg.connect(client, autocommit=True) as through:
            assert through.execute("SELECT current_user").fetchone() == (ROLE,)
            assert through.execute("SHOW statement_timeout").fetchone() == ("30s",)
            assert through.execute("SHOW mtcache.currency_bound").fetchone() == ("10 min",)
            names = through.execute("SELECT name FROM authors ORDER BY authorid LIMIT 2")
            assert [r[0] for r in names.fetchall()] == ["Author 1", "Author 2"]
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(client.replace(PASSWORD, "wrong")).close()
