#!/usr/bin/env bash
# Server-side cost of the store's statements, without Go: pgbench runs the
# floor's statements and the store's interleaved in one run (each
# transaction picks one of the scripts at random), and prints each
# script's mean latency, its ratio to the floor's and, for the fresh calls,
# how many of the completions on each table were HOT updates. It shows how
# much of the gap between Do and the floor (BenchmarkPostgresFloor) is the
# statements themselves, and what each piece of the schema costs:
#
#   fresh calls (claim + completion): the floor; the store (store.sql.in
#   on pgb.store); the store without its index on sweep_at (store_pk); the
#   store taking its fence from a literal instead of the sequence
#   (store_noseq); the store as it was before issue 23 (store_old.sql:
#   indexes on expires_at and on STARTED keys, a completion that is not
#   HOT);
#   replays (one read of a completed row): the floor's and the store's.
#
#   bash benchmarks/pgbench/run.sh [seconds per run, default 20]
#
# Needs pgbench (Debian: postgresql-client) and IDEM_POSTGRES_URL. Creates
# and drops the schema pgb. The store's statements in store.sql.in and
# store_replay.sql mirror store/postgres/sql.go; update them together.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
url=${IDEM_POSTGRES_URL:?set IDEM_POSTGRES_URL}
secs=${1:-20}
tmp=$(mktemp -d)
cleanup() { psql -q "$url" -c 'DROP SCHEMA IF EXISTS pgb CASCADE' >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
psql -q "$url" -c 'DROP SCHEMA IF EXISTS pgb CASCADE' >/dev/null 2>&1
psql -q -v ON_ERROR_STOP=1 "$url" -f "$here/setup.sql" >/dev/null
cp "$here"/floor.sql "$here"/store_old.sql "$here"/floor_replay.sql "$here"/store_replay.sql "$tmp/"
for t in store store_pk store_noseq; do
  fence="nextval('pgb.seq')"
  [ "$t" = store_noseq ] && fence=1
  sed -e "s/pgb\.TABLE/pgb.$t/g" -e "s/FENCE/$fence/" "$here/store.sql.in" >"$tmp/$t.sql"
done
# report prints each script's mean latency (ms) and the first script's
# latency divided by it, from pgbench's per-script summary.
report() {
  awk '/^SQL script [0-9]+:/ { n++; name[n] = $4; sub(".*/", "", name[n]); sub("[.]sql$", "", name[n]) }
       /^ - latency average/ { lat[n] = $5 }
       /aborted|error/ { print; bad = 1 }
       END { if (bad) exit 1; for (i = 1; i <= n; i++) printf "%-14s %7.3f  %.2f\n", name[i], lat[i], lat[1] / lat[i] }'
}
for clients in 1 16; do
  jobs=$(( clients < 2 ? 1 : 2 ))
  echo "== fresh calls, $clients connection(s), ${secs}s: mean latency (ms), floor ÷ script"
  pgbench -n -M prepared -c "$clients" -j "$jobs" -T "$secs" \
    -f "$tmp/floor.sql@1" -f "$tmp/store.sql@1" -f "$tmp/store_pk.sql@1" -f "$tmp/store_noseq.sql@1" -f "$tmp/store_old.sql@1" "$url" 2>&1 | report
  echo "== replays, $clients connection(s), ${secs}s: mean latency (ms), floor ÷ script"
  pgbench -n -M prepared -c "$clients" -j "$jobs" -T "$secs" \
    -f "$tmp/floor_replay.sql@1" -f "$tmp/store_replay.sql@1" "$url" 2>&1 | report
done
echo "== completions that were HOT updates (all runs)"
sleep 1 # the backends' statistics reach the shared counters within a second
psql -At -F ' ' "$url" -c "SELECT relname, n_tup_hot_upd || ' of ' || n_tup_upd FROM pg_stat_user_tables WHERE schemaname = 'pgb' AND n_tup_upd > 0 ORDER BY 1"
