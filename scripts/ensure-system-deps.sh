#!/usr/bin/env bash
# Installs what pip cannot: the PostgreSQL server binaries (the embedded backend and the tests'
# private cluster), a Java runtime (Spark's refresh pipeline), and the clients the server's
# tests and benchmark drive: psql and pgbench, pgbouncer, a JDK and pgjdbc (Debian's
# libpostgresql-jdbc-java), and systemd-analyze for the service unit. Does nothing when present.
set -euo pipefail

have_postgres() {
  command -v pg_ctl >/dev/null 2>&1 && return 0
  compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null 2>&1
}

missing=()
have_postgres || missing+=(postgresql)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
command -v javac >/dev/null 2>&1 || missing+=(default-jdk-headless)
# psql and pgbench (Debian's postgresql-client brings both)
{ command -v psql && command -v pgbench; } >/dev/null 2>&1 || missing+=(postgresql-client)
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
[ -f /usr/share/java/postgresql.jar ] || missing+=(libpostgresql-jdbc-java)
command -v runuser >/dev/null 2>&1 || missing+=(util-linux)
# deploy/systemd/mtcache.service is checked with systemd-analyze verify (tests/tools/test_deploy.py)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "mtcache needs: ${missing[*]}; install them (e.g. sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "installing system packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
