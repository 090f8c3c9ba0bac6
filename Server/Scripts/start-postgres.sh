#!/usr/bin/env bash
# Installs PostgreSQL from Debian's packages if needed and starts a cluster of its own on
# 127.0.0.1 only, with a database `strata` that the user `postgres` reaches without a password
# (trust, loopback only: for development and tests, never for production).
#   STRATA_PG_DIR (default /tmp/strata-pg)   STRATA_PG_PORT (default 5432)
set -euo pipefail
dir="${STRATA_PG_DIR:-/tmp/strata-pg}"
port="${STRATA_PG_PORT:-5432}"
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
fi
bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
as_pg() { if [ "$(id -un)" = postgres ]; then "$@"; else su postgres -s /bin/bash -c "$(printf '%q ' "$@")"; fi; }
if [ ! -f "$dir/PG_VERSION" ]; then
    mkdir -p "$dir" && chown postgres "$dir"
    as_pg "$bin/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 >/dev/null
fi
if ! as_pg "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
    as_pg "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w \
        -o "-c listen_addresses=127.0.0.1 -p $port -k /tmp -c max_connections=200" start >/dev/null
fi
as_pg "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'strata'" | grep -q 1 \
    || as_pg "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres strata
echo "PostgreSQL on 127.0.0.1:$port: postgres://postgres@127.0.0.1:$port/strata"
