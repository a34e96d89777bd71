#!/usr/bin/env bash
# Server-side cost of a fresh call's two statements, without Go: pgbench
# runs the floor's statements and the store's (on its table, and on
# variants of it) interleaved in one run (each transaction picks one of
# the scripts at random), and prints each script's mean latency and its
# ratio to the floor's. It shows how much of the gap between Do and the
# floor (BenchmarkPostgresFloor) is the statements themselves, and what
# the table's indexes and a CHECK constraint cost.
#
#   bash benchmarks/pgbench/run.sh [seconds per run, default 20]
#
# Needs pgbench (Debian: postgresql-client) and IDEM_POSTGRES_URL. Creates
# and drops the schema pgb. The store's statements in store.sql.in mirror
# store/postgres/sql.go; update them together.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
url=${IDEM_POSTGRES_URL:?set IDEM_POSTGRES_URL}
secs=${1:-20}
tmp=$(mktemp -d)
cleanup() { psql -q "$url" -c 'DROP SCHEMA IF EXISTS pgb CASCADE' >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
psql -q "$url" -c 'DROP SCHEMA IF EXISTS pgb CASCADE' >/dev/null 2>&1
psql -q -v ON_ERROR_STOP=1 "$url" -f "$here/setup.sql" >/dev/null
cp "$here/floor.sql" "$tmp/floor.sql"
for t in store store_pk store_check; do sed "s/pgb\.TABLE/pgb.$t/g" "$here/store.sql.in" >"$tmp/$t.sql"; done
for clients in 1 16; do
  echo "== $clients connection(s), ${secs}s, mean latency per fresh call (ms) and floor ÷ script"
  pgbench -n -M prepared -c "$clients" -j "$(( clients < 2 ? 1 : 2 ))" -T "$secs" \
    -f "$tmp/floor.sql@1" -f "$tmp/store.sql@1" -f "$tmp/store_pk.sql@1" -f "$tmp/store_check.sql@1" "$url" 2>&1 |
    awk '/^SQL script [0-9]+:/ { n++; name[n] = $4; sub(".*/", "", name[n]); sub("[.]sql$", "", name[n]) }
         /^ - latency average/ { lat[n] = $5 }
         /aborted|error/ { print; bad = 1 }
         END { if (bad) exit 1; for (i = 1; i <= n; i++) printf "%-12s %7.3f  %.2f\n", name[i], lat[i], lat[1] / lat[i] }'
done
