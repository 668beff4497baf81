#!/usr/bin/env bash
# Installs what pip cannot: the PostgreSQL server binaries (the embedded backend and the tests'
# private cluster) and a Java runtime (Spark's refresh pipeline). Does nothing when present.
set -euo pipefail

have_postgres() {
  command -v pg_ctl >/dev/null 2>&1 && return 0
  compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null 2>&1
}

missing=()
have_postgres || missing+=(postgresql)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
command -v runuser >/dev/null 2>&1 || missing+=(util-linux)

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
