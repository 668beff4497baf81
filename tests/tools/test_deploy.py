"""deploy/, exercised as far as a machine without a Docker engine allows (issue 53): the
systemd unit passes `systemd-analyze verify`; the compose file, the Prometheus scrape and the
Dockerfile agree with each other and with mtcache's configuration file; the Grafana
dashboard reads only metrics a running server exports; and the image's configuration
(deploy/mtcache.toml, deploy/hba.conf, the entry point `mtcache serve`) starts a server that
answers, run outside a container with only the addresses and the backend overridden by
environment, as the compose file's environment would. Building the image and starting the
stack are not tested here (no Docker engine)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import tomllib
import urllib.request
from pathlib import Path

import psycopg
import pytest
import yaml

from cache.server.options import ServerOptions
from tests.paths import ROOT
from tests.serving import serve_process, server_of

DEPLOY = ROOT / "deploy"
CONFIG = tomllib.loads((DEPLOY / "mtcache.toml").read_text())


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_the_systemd_unit_verifies(tmp_path: Path, mtcache_bin: str) -> None:
    unit = (DEPLOY / "systemd" / "mtcache.service").read_text()
    assert "ExecStart=/opt/mtcache/bin/mtcache serve\n" in unit
    assert "Environment=MTCACHE_CONFIG=/etc/mtcache/mtcache.toml\n" in unit
    assert "KillSignal=SIGTERM\n" in unit  # (the server's graceful stop)
    # the unit as installed, its command where this machine has it
    here = tmp_path / "mtcache.service"
    installed = unit.replace("/opt/mtcache/bin/mtcache", mtcache_bin)
    here.write_text(installed)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(here)], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    # (and verify does catch a mistake in it)
    here.write_text(installed.replace("Restart=on-failure", "Restart=sometimes"))
    wrong = subprocess.run(
        ["systemd-analyze", "verify", str(here)], capture_output=True, text=True, check=False
    )
    assert "Failed to parse service restart" in wrong.stderr


def test_the_compose_stack_holds_together() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "mtcache", "prometheus", "grafana"}
    for service in services.values():  # every file a service mounts is in deploy/
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), source
    build = services["mtcache"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).is_file()
    assert "wal_level=logical" in services["postgres"]["command"]  # REFRESH CONTINUOUSLY
    # a new cache file's first start needs the backend: it waits for PostgreSQL's health
    # check (over TCP), and is started again if it stops
    assert services["mtcache"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["mtcache"]["restart"] == "unless-stopped"
    assert "127.0.0.1" in services["postgres"]["healthcheck"]["test"]
    # mtcache's configuration names the compose's backend, and publishes its own ports
    backend = CONFIG["backend"]
    assert "@postgres:5432/" + services["postgres"]["environment"]["POSTGRES_DB"] in backend
    serve = CONFIG["serve"]
    published = {_port(p) for p in services["mtcache"]["ports"]}
    assert {_port(serve["listen"]), _port(serve["metrics"])} <= published
    # Prometheus scrapes that metrics port, Grafana reads that Prometheus
    scrape = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = scrape["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == [f"mtcache:{_port(serve['metrics'])}"]
    sources = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    assert sources["datasources"][0]["url"] == "http://prometheus:9090"
    uids = {source["uid"] for source in sources["datasources"]}
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "mtcache.json").read_text())
    assert {panel["datasource"]["uid"] for panel in dashboard["panels"]} <= uids


def test_the_dockerfile_builds_the_product_from_what_the_repository_holds() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    copied = re.findall(r"^COPY (.+) \S+$", text, re.M)
    sources = [word for line in copied for word in line.split()]
    assert [s for s in sources if not (ROOT / s).exists()] == []
    # its context holds what it copies and nothing else (deploy/Dockerfile.dockerignore)
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:] for line in ignore if line.startswith("!")}
    assert set(sources) == allowed and ignore[ignore.index("*") - 1].startswith("#")
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    wanted = {name.rstrip("*") for name in packages["packages"]["find"]["include"]}
    assert wanted - set(sources) == set(), "the image must copy every package of the product"
    assert 'ENTRYPOINT ["mtcache"]' in text and 'CMD ["serve"]' in text
    assert "ENV MTCACHE_CONFIG=/etc/mtcache/mtcache.toml" in text
    assert f"127.0.0.1:{_port(CONFIG['serve']['metrics'])}/readyz" in text  # its health check


@pytest.mark.backend
def test_the_dashboard_reads_metrics_a_server_exports(bookstore_dsn: str, tmp_path: Path) -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "mtcache.json").read_text())
    used = {
        re.sub(r"_(bucket|sum|count)$", "", name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bmtcache_[a-z_]+", target["expr"])
    }
    # (with a heartbeat: the stream's lag in seconds is known once a beat is applied)
    with server_of(
        bookstore_dsn,
        tmp_path / "cache.duckdb",
        ServerOptions(metrics="127.0.0.1:0"),
        heartbeat=0.2,
    ) as served:
        assert served.server.metrics is not None
        host, port = served.server.metrics.address
        with psycopg.connect(served.dsn, autocommit=True) as client:
            # a view kept from the stream (the views' and the stream's figures), a statement
            client.execute(
                "CREATE CACHED VIEW authors_live AS SELECT * FROM authors REFRESH CONTINUOUSLY"
            )
            try:
                client.execute("SELECT name FROM authors CURRENCY BOUND 10 MIN").fetchall()
                metrics = f"http://{host!s}:{port}/metrics"
                deadline = time.monotonic() + 60
                while True:
                    with urllib.request.urlopen(metrics, timeout=10) as answer:
                        text = answer.read().decode()
                    if "mtcache_stream_lag_seconds" in text or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
            finally:
                client.execute("DROP CACHED VIEW authors_live")  # (and its replication slot)
        exported = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert len(used) >= 15
    assert used - exported == set()


@pytest.mark.backend
def test_the_images_configuration_serves(
    bookstore_dsn: str, tmp_path: Path, mtcache_bin: str
) -> None:
    # the clients of the stack come from outside the container's loopback: the rule they meet
    # is the file's password line (its loopback trust line left out here)
    rules = [line for line in (DEPLOY / "hba.conf").read_text().splitlines() if "trust" not in line]
    assert any("scram-sha-256" in line for line in rules)
    (tmp_path / "hba.conf").write_text("\n".join(rules) + "\n")
    with psycopg.connect(bookstore_dsn, autocommit=True) as pg:
        pg.execute("DROP ROLE IF EXISTS deploy_app")
        pg.execute("CREATE ROLE deploy_app LOGIN PASSWORD 'deploy secret'")
        pg.execute("GRANT SELECT ON authors TO deploy_app")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTCACHE_")}
    env |= {
        "MTCACHE_CONFIG": str(DEPLOY / "mtcache.toml"),  # (the image's ENV)
        # what the compose stack and the image give by their own means: the backend's
        # address, the file's volume, the mounted rules; free loopback ports here
        "MTCACHE_BACKEND": bookstore_dsn,
        "MTCACHE_CACHE": str(tmp_path / "cache.duckdb"),
        "MTCACHE_HBA": str(tmp_path / "hba.conf"),
        "MTCACHE_LISTEN": "127.0.0.1:0",
        "MTCACHE_METRICS": "127.0.0.1:0",
    }
    # (the image's ENTRYPOINT and CMD)
    with serve_process([mtcache_bin, "serve"], env) as started:
        port, url = started.port, started.metrics
        with urllib.request.urlopen(f"{url}/readyz", timeout=10) as answer:
            assert answer.status == 200
        dbname = psycopg.conninfo.conninfo_to_dict(bookstore_dsn)["dbname"]
        client = (
            f"host=127.0.0.1 port={port} user=deploy_app password='deploy secret' dbname={dbname}"
        )
        with (
            psycopg.connect(client, autocommit=True) as through,
            psycopg.connect(bookstore_dsn) as direct,
        ):
            sql = "SELECT authorid, name FROM authors ORDER BY authorid LIMIT 3"
            assert through.execute(sql).fetchall() == direct.execute(sql).fetchall()
            assert through.execute("SELECT current_user").fetchone() == ("deploy_app",)
            # the file's settings hold (its statement timeout)
            assert through.execute("SHOW statement_timeout").fetchone() == ("30s",)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(client.replace("deploy secret", "wrong")).close()
