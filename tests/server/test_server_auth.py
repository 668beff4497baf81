"""Who may connect to `mtcache serve`: TLS and SCRAM with real clients (psql, psycopg, asyncpg,
pgjdbc), rules in the spirit of pg_hba.conf, a client's backend work running as its role, and
secrets kept out of the logs. The backend itself asks these roles for SCRAM, so a session's
backend login proves the keys the client's proof carried."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import logging
import os
import re
import socket
import ssl
import struct
import subprocess
import typing as t
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import psycopg
import pytest
import trustme

from cache.backend.embedded_pg import EmbeddedPostgres
from cache.server.auth import (
    AuthFile,
    AuthQuery,
    Login,
    LoginRefused,
    Rules,
    backend_membership,
    tls_context,
)
from cache.server.options import ServerOptions
from cache.server.scram import Exchange, ScramError, Verifier
from cache.store.counters import Counter
from cache.wire import protocol
from sql_ext.errors import ProgrammingError
from tests.answers import typed
from tests.conftest import cli_home
from tests.paths import CLIENTS
from tests.serving import Served, serving

JDBC_JAR = Path("/usr/share/java/postgresql.jar")
ROLES = {"auth_alice": "alice secret", "auth_carol": "carol's secret", "auth_dave": "dave-secret"}
RULES = """\
# the tests' rules: the first that matches decides
host     all  postgres      127.0.0.1/32  trust
hostssl  all  +auth_blocked 127.0.0.1/32  reject
hostssl  all  auth_carol    127.0.0.1/32  password
hostssl  all  all           127.0.0.1/32  scram-sha-256
host     all  all           127.0.0.1/32  reject
"""
READ = "SELECT authorid, name FROM authors WHERE authorid = 1 CURRENCY BOUND 10 MIN"
PLAIN_READ = "SELECT authorid, name FROM authors WHERE authorid = 1"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A test CA's certificate, and the server's certificate and key (for localhost and
    127.0.0.1) signed by it."""
    home = tmp_path_factory.mktemp("tls")
    authority = trustme.CA()
    issued = authority.issue_cert("localhost", "127.0.0.1")
    paths = {"ca": home / "ca.pem", "cert": home / "server.pem", "key": home / "server.key"}
    authority.cert_pem.write_to_path(str(paths["ca"]))
    issued.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    issued.private_key_pem.write_to_path(str(paths["key"]))
    paths["key"].chmod(0o600)
    return paths


@pytest.fixture(scope="module")
def roles(pg_cluster: EmbeddedPostgres, bookstore_dsn: str) -> Iterator[None]:
    """The tests' roles on the backend, which asks them (and only them) for SCRAM."""
    hba = pg_cluster.data_dir / "pg_hba.conf"
    before = hba.read_text()
    with psycopg.connect(bookstore_dsn, autocommit=True) as conn:
        for role in (*ROLES, "auth_md5", "auth_blocked"):
            conn.execute(f"DROP OWNED BY {role} CASCADE" if _exists(conn, role) else "SELECT 1")
            conn.execute(f"DROP ROLE IF EXISTS {role}")
        for role, password in ROLES.items():
            conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD {_literal(password)}")
            conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
        conn.execute("SET password_encryption = 'md5'")
        conn.execute("CREATE ROLE auth_md5 LOGIN PASSWORD 'md5-secret'")
        conn.execute("CREATE ROLE auth_blocked NOLOGIN")
        conn.execute("GRANT auth_blocked TO auth_dave")
        hba.write_text(
            f"host all {','.join([*ROLES, 'auth_md5'])} 127.0.0.1/32 scram-sha-256\n" + before
        )
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        hba.write_text(before)
        with psycopg.connect(bookstore_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")


def _exists(conn: psycopg.Connection[t.Any], role: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone() is not None


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@pytest.fixture(scope="module")
def secured(
    bookstore_dsn: str,
    roles: None,
    certificates: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    context, binding = tls_context(certificates["cert"], certificates["key"])
    login = Login(
        Rules.parse(RULES, "the tests' rules"),
        AuthQuery(bookstore_dsn),
        binding,
        backend_membership(bookstore_dsn),
    )
    with serving(
        bookstore_dsn,
        tmp_path_factory.mktemp("auth") / "cache.duckdb",
        (1, 2),
        ServerOptions(login=login, tls=context),
    ) as served:
        yield served


def conninfo(served: Served, certificates: dict[str, Path], user: str, **extra: str) -> str:
    options = {
        "host": served.host,
        "port": str(served.port),
        "dbname": served.dbname,
        "user": user,
        "sslmode": "verify-full",
        "sslrootcert": str(certificates["ca"]),
        **extra,
    }
    return psycopg.conninfo.make_conninfo("", **options)


# -- SCRAM and TLS with real clients -----------------------------------------------------------


def test_psql_over_tls_with_scram_and_channel_binding(
    secured: Served, certificates: dict[str, Path]
) -> None:
    dsn = conninfo(secured, certificates, "auth_alice", channel_binding="require")
    done = subprocess.run(
        [
            "psql",
            "-X",
            "-At",
            "-d",
            dsn,
            "-c",
            "SELECT current_user, session_user",
            "-c",
            READ,
            "-c",
            "\\conninfo",
        ],
        env=dict(os.environ, PGPASSWORD=ROLES["auth_alice"]),
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    with psycopg.connect(secured.backend) as pg:
        rows = pg.execute(PLAIN_READ).fetchall()
    said = done.stdout.splitlines()
    assert said[:-2] == ["auth_alice|auth_alice", *(f"{a}|{n}" for a, n in rows)]
    assert said[-1].startswith("SSL connection (protocol: TLSv1.3"), said


def test_psycopg_reads_and_writes_as_its_role(
    secured: Served, certificates: dict[str, Path]
) -> None:
    dsn = conninfo(secured, certificates, "auth_alice", password=ROLES["auth_alice"])
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        psycopg.connect(secured.backend, autocommit=True) as pg,
    ):
        assert conn.pgconn.ssl_in_use
        hits = secured.engine.counters()[Counter.HITS]
        got = conn.execute(READ).fetchall()
        assert typed(got) == typed(pg.execute(PLAIN_READ).fetchall())
        assert secured.engine.counters()[Counter.HITS] > hits  # the cache's answer
        # the backend work is the role's: the backend refuses what the role may not do
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO authors VALUES (99, 'x', 'f', 'y', 'zz')")
        # a worker's long answer goes out through TLS (the loop writes it)
        long = "SELECT n, repeat(md5(n::text), 20) FROM generate_series(1, 5000) AS n"
        assert conn.execute(long).fetchall() == pg.execute(long).fetchall()


def test_asyncpg_over_tls(secured: Served, certificates: dict[str, Path]) -> None:
    context = ssl.create_default_context(cafile=str(certificates["ca"]))

    async def run() -> list[tuple[int, str]]:
        conn = await asyncpg.connect(
            host=secured.host,
            port=secured.port,
            user="auth_alice",
            password=ROLES["auth_alice"],
            database=secured.dbname,
            ssl=context,
        )
        try:
            return [tuple(r) for r in await conn.fetch(READ)]
        finally:
            await conn.close()

    with psycopg.connect(secured.backend) as pg:
        assert asyncio.run(run()) == pg.execute(PLAIN_READ).fetchall()


def test_jdbc_over_tls(secured: Served, certificates: dict[str, Path], tmp_path: Path) -> None:
    assert JDBC_JAR.exists(), f"{JDBC_JAR} is missing: make test installs libpostgresql-jdbc-java"
    subprocess.run(
        ["javac", "-d", str(tmp_path), str(CLIENTS / "JdbcLogin.java")],
        check=True,
        timeout=300,
        capture_output=True,
    )
    url = (
        f"jdbc:postgresql://localhost:{secured.port}/{secured.dbname}?sslmode=verify-full"
        f"&sslrootcert={certificates['ca']}"
    )

    def run(user: str, password: str) -> list[str]:
        done = subprocess.run(
            ["java", "-cp", f"{tmp_path}:{JDBC_JAR}", "JdbcLogin", url, user, password],
            text=True,
            capture_output=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    with psycopg.connect(secured.backend) as pg:
        rows = pg.execute(PLAIN_READ).fetchall()
    assert run("auth_alice", ROLES["auth_alice"]) == [
        "user: auth_alice",
        *(f"row: {a} {n}" for a, n in rows),
    ]
    assert run("auth_alice", "wrong") == ["error: 28P01"]


def test_cleartext_password_over_tls(secured: Served, certificates: dict[str, Path]) -> None:
    dsn = conninfo(secured, certificates, "auth_carol", password=ROLES["auth_carol"])
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("auth_carol",)
    with pytest.raises(
        psycopg.OperationalError, match='password authentication failed for user "auth_carol"'
    ):
        psycopg.connect(conninfo(secured, certificates, "auth_carol", password="nope"))


# -- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "user, password",
    [("auth_alice", "wrong"), ("auth_nobody", "anything"), ("auth_md5", "md5-secret")],
)
def test_a_wrong_password_an_unknown_role_and_an_md5_one_fail_alike(
    secured: Served, certificates: dict[str, Path], user: str, password: str
) -> None:
    with pytest.raises(psycopg.OperationalError) as raised:
        psycopg.connect(conninfo(secured, certificates, user, password=password))
    assert f'FATAL:  password authentication failed for user "{user}"' in str(raised.value)


def test_rules_refuse_by_encryption_and_by_group(
    secured: Served, certificates: dict[str, Path]
) -> None:
    plain = conninfo(
        secured, certificates, "auth_alice", password=ROLES["auth_alice"], sslmode="disable"
    )
    with pytest.raises(
        psycopg.OperationalError,
        match=re.escape(
            'the cache server\'s rules reject connection for host "127.0.0.1", user "auth_alice"'
        ),
    ):
        psycopg.connect(plain)
    blocked = conninfo(secured, certificates, "auth_dave", password=ROLES["auth_dave"])
    with pytest.raises(psycopg.OperationalError, match="rules reject"):
        psycopg.connect(blocked)
    # other sessions go on
    with psycopg.connect(
        conninfo(secured, certificates, "auth_alice", password=ROLES["auth_alice"])
    ) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_client_that_breaks_the_tls_handshake_is_let_go(secured: Served) -> None:
    """A client that asks for TLS and then sends what is not TLS is disconnected, and other
    logins go on."""
    broken = socket.create_connection(secured.server.address, timeout=30)
    broken.sendall(struct.pack("!ii", 8, protocol.SSL_REQUEST))
    assert broken.recv(1) == b"S"
    broken.sendall(b"\x16\x03\x01\x00\x05hello" * 4)  # not a TLS ClientHello
    received = b""
    while data := broken.recv(65536):  # (a TLS alert at most, then the end)
        received += data
    assert len(received) < 100
    broken.close()
    with psycopg.connect(secured.dsn) as conn:  # (postgres: trusted on loopback)
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_secrets_stay_out_of_the_log(
    secured: Served, certificates: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for password in (ROLES["auth_alice"], "a wrong one"):
        with contextlib.suppress(psycopg.OperationalError):
            psycopg.connect(
                conninfo(secured, certificates, "auth_alice", password=password)
            ).close()
    text = caplog.text
    assert "refused a login of role 'auth_alice'" in text
    assert ROLES["auth_alice"] not in text and "a wrong one" not in text
    with psycopg.connect(secured.backend) as pg:
        secret = pg.execute(
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'auth_alice'"
        ).fetchone()[0]
    for piece in secret.replace("$", ":").split(":")[1:]:
        assert piece not in text


# -- the exchange and the rules alone -------------------------------------------------------------


def test_the_exchange_verifies_rfc_7677s_example() -> None:
    verifier = Verifier.of_password("pencil", base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="), 4096)
    exchange = Exchange(verifier, None, server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    assert (
        exchange.first("SCRAM-SHA-256", "n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
        == "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    final, keys = exchange.final(
        "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert final == "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert keys.server_key == verifier.server_key and "***" in repr(keys)
    wrong = Exchange(verifier, None, server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    wrong.first("SCRAM-SHA-256", "n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    with pytest.raises(ScramError) as raised:
        wrong.final(
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
            "p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
        )
    assert not raised.value.malformed


@pytest.mark.parametrize(
    "mechanism, first, why",
    [
        ("SCRAM-SHA-1", "n,,n=,r=abc", "invalid SASL authentication mechanism"),
        ("SCRAM-SHA-256", "y,,n=,r=abc", "negotiation error"),  # a downgrade, with binding offered
        ("SCRAM-SHA-256-PLUS", "n,,n=,r=abc", "unexpected channel-binding flag"),
        ("SCRAM-SHA-256", "n,a=someone,n=,r=abc", "authorization identity"),
        ("SCRAM-SHA-256", "n,,r=abc", "expected n= and r="),
        ("SCRAM-SHA-256", "garbage", "no GS2 header"),
    ],
)
def test_a_malformed_exchange_is_refused(mechanism: str, first: str, why: str) -> None:
    verifier = Verifier.of_password("pw", b"salt-salt", 4096)
    with pytest.raises(ScramError, match=why) as raised:
        Exchange(verifier, b"\x01" * 32).first(mechanism, first)
    assert raised.value.malformed


def test_verifiers_parse_as_postgresql_stores_them() -> None:
    made = Verifier.of_password("pw", b"0123456789abcdef", 4096)
    text = (
        f"SCRAM-SHA-256$4096:{base64.b64encode(made.salt).decode()}$"
        f"{base64.b64encode(made.stored_key).decode()}:"
        f"{base64.b64encode(made.server_key).decode()}"
    )
    assert Verifier.parse(text) == made and made.checks("pw") and not made.checks("pW")
    for other in (None, "", "md5" + "0" * 32, "plain password", text.replace("$4096", "$x")):
        assert Verifier.parse(other) is None


@pytest.mark.parametrize(
    "line, why",
    [
        ("host all all 0.0.0.0/0 trust", "trust beyond loopback"),
        ("host all all all trust", "trust beyond loopback"),
        ("host all all 10.0.0.0/8 password", "only on a hostssl line"),
        ("host all all 10.0.0.0/8 md5", "use scram-sha-256"),
        ("local all all peer", "type 'local' is not one of"),
        ("host all all 10.0.0.0/8 ident", "method 'ident' is not one of"),
        ("host all all 10.0.0.300/8 reject", "not 'all' or an address"),
        ("host all all", "write TYPE DATABASE USER ADDRESS METHOD"),
    ],
)
def test_rules_that_would_let_anyone_in_or_cannot_be_read_are_refused(line: str, why: str) -> None:
    with pytest.raises(ProgrammingError, match=f"the file line 1: .*{why}"):
        Rules.parse(line + "\n", "the file")


def test_the_first_matching_rule_decides() -> None:
    rules = Rules.parse(RULES, "the tests' rules")

    def blocked(role: str, group: str) -> bool:
        return role == "auth_dave" and group == "auth_blocked"

    def method(tls: bool, role: str, address: str = "127.0.0.1") -> str:
        return rules.rule_for(tls, "db", role, ipaddress.ip_address(address), blocked).method

    assert method(False, "postgres") == "trust" and method(True, "postgres") == "trust"
    assert method(True, "auth_dave") == "reject" and method(True, "auth_alice") == "scram-sha-256"
    assert method(True, "auth_carol") == "password" and method(False, "auth_carol") == "reject"
    refused = re.escape('no rule of the cache server for host "10.1.1.1"')
    with pytest.raises(LoginRefused, match=refused):
        method(True, "auth_alice", "10.1.1.1")


# -- mtcache serve's options -----------------------------------------------------------------------


def _serve_env(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTCACHE_")}
    cli_home(env, dsn, "mtcache-auth-")
    return env


def test_mtcache_serve_with_rules_and_tls(
    bookstore_dsn: str, roles: None, mtcache_bin: str, certificates: dict[str, Path], tmp_path: Path
) -> None:
    rules = tmp_path / "hba.conf"
    rules.write_text(RULES)
    process = subprocess.Popen(
        [
            mtcache_bin,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--hba",
            str(rules),
            "--tls-cert",
            str(certificates["cert"]),
            "--tls-key",
            str(certificates["key"]),
        ],
        env=_serve_env(bookstore_dsn),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        for line in iter(process.stderr.readline, ""):
            if "listening on" in line:
                port = int(line.split("listening on 127.0.0.1:")[1].split()[0])
                break
        else:
            raise AssertionError(f"the server stopped: exit {process.wait(60)}")
        dsn = psycopg.conninfo.make_conninfo(
            "",
            host="localhost",
            port=port,
            dbname=psycopg.conninfo.conninfo_to_dict(bookstore_dsn)["dbname"],
            user="auth_alice",
            sslmode="verify-full",
            sslrootcert=str(certificates["ca"]),
            channel_binding="require",
        )
        done = subprocess.run(
            ["psql", "-X", "-At", "-d", dsn, "-c", "SELECT current_user"],
            env=dict(os.environ, PGPASSWORD=ROLES["auth_alice"]),
            text=True,
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert (done.returncode, done.stdout) == (0, "auth_alice\n"), done.stderr
        refused = subprocess.run(
            ["psql", "-X", "-At", "-d", dsn, "-c", "SELECT 1"],
            env=dict(os.environ, PGPASSWORD="not it"),
            text=True,
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert refused.returncode == 2
        assert 'password authentication failed for user "auth_alice"' in refused.stderr
    finally:
        process.terminate()
        _, logs = process.communicate(timeout=60)
    assert ROLES["auth_alice"] not in logs and "not it" not in logs


@pytest.mark.parametrize(
    "case, why",
    [
        ("beyond loopback", "listening beyond loopback needs client authentication"),
        ("cert without key", "give both --tls-cert and --tls-key"),
        ("hostssl without tls", "has hostssl rules: give --tls-cert and --tls-key"),
        ("readable key", "others may read it; chmod 600 it"),
        ("trust beyond loopback", "line 1: trust beyond loopback"),
        ("missing rules", "cannot read it"),
        ("failing auth query", "--auth-query fails on the backend"),
    ],
)
def test_mtcache_serve_refuses_unsafe_or_broken_settings(
    bookstore_dsn: str,
    mtcache_bin: str,
    certificates: dict[str, Path],
    tmp_path: Path,
    case: str,
    why: str,
) -> None:
    rules = tmp_path / "hba.conf"
    rules.write_text("hostssl all all 0.0.0.0/0 scram-sha-256\n")
    readable = tmp_path / "readable.key"
    readable.write_bytes(certificates["key"].read_bytes())
    readable.chmod(0o644)
    tls = ["--tls-cert", str(certificates["cert"]), "--tls-key", str(certificates["key"])]
    args = {
        "beyond loopback": ["--listen", "0.0.0.0:0"],
        "cert without key": ["--tls-cert", str(certificates["cert"])],
        "hostssl without tls": ["--hba", str(rules)],
        "readable key": ["--tls-cert", str(certificates["cert"]), "--tls-key", str(readable)],
        "trust beyond loopback": ["--hba", str(_written(tmp_path, "host all all all trust"))],
        "missing rules": ["--hba", str(tmp_path / "nowhere.conf")],
        "failing auth query": [
            "--listen",
            "127.0.0.1:0",
            "--hba",
            str(rules),
            *tls,
            "--auth-query",
            "SELECT nothing FROM nowhere WHERE %s = ''",
        ],
    }[case]
    done = subprocess.run(
        [mtcache_bin, "serve", *args],
        env=_serve_env(bookstore_dsn),
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("mtcache: ") and why in lines[0], lines


def _written(home: Path, text: str) -> Path:
    path = home / "written.conf"
    path.write_text(text + "\n")
    return path


def test_an_auth_file_of_verifiers_serves_as_the_backends(
    bookstore_dsn: str, roles: None, certificates: dict[str, Path], tmp_path: Path
) -> None:
    with psycopg.connect(bookstore_dsn) as pg:
        secret = pg.execute(
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'auth_alice'"
        ).fetchone()[0]
    listed = tmp_path / "userlist.txt"
    listed.write_text(f'; verifiers as pg_authid holds them\n"auth_alice" "{secret}"\n')
    context, binding = tls_context(certificates["cert"], certificates["key"])
    login = Login(Rules.parse(RULES, "the tests' rules"), AuthFile(listed), binding)
    with serving(
        bookstore_dsn, tmp_path / "cache.duckdb", (1,), ServerOptions(login=login, tls=context)
    ) as served:
        with psycopg.connect(
            conninfo(served, certificates, "auth_alice", password=ROLES["auth_alice"])
        ) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("auth_alice",)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(
                conninfo(served, certificates, "auth_carol", password=ROLES["auth_carol"])
            )  # (not in the file)


@pytest.mark.parametrize(
    "text, why",
    [
        ('"auth_alice" "md5abcdef"\n', "has no SCRAM-SHA-256 verifier"),
        ("auth_alice SCRAM-SHA-256$1:x$y:z\n", 'write "role" "SCRAM-SHA-256$..."'),
    ],
)
def test_an_auth_file_that_cannot_serve_is_refused(tmp_path: Path, text: str, why: str) -> None:
    listed = tmp_path / "userlist.txt"
    listed.write_text(text)
    with pytest.raises(ProgrammingError, match=re.escape(why)):
        AuthFile(listed)
