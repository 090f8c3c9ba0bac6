#!/usr/bin/env bash
# The first-sync benchmark in one command, from the repository's root:
#   Server/Scripts/sync-bench.sh [row counts, default 10000,100000,1000000]
# Starts PostgreSQL (Server/Scripts/start-postgres.sh), builds the server, the benchmark and
# the `strata` command in release mode, and runs strata-sync-bench.
set -euo pipefail
cd "$(dirname "$0")/../.."
rows="${1:-10000,100000,1000000}"
bash Server/Scripts/start-postgres.sh
swift build -c release --product strata
swift build -c release --package-path Server
Server/.build/release/strata-sync-bench --rows "$rows" --strata .build/release/strata --tables Server/Examples/tables.json
