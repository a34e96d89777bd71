#!/usr/bin/env bash
# Throwaway PostgreSQL for the store/postgres tests.
#
#   postgres.sh start DIR   prints "export IDEM_POSTGRES_URL=..." on stdout
#   postgres.sh stop DIR    stops the server started under DIR
#
# When IDEM_POSTGRES_URL is already set, start prints nothing and starts
# nothing. Otherwise it installs PostgreSQL 15 if missing, initdbs a cluster
# as the postgres user (initdb refuses root) under DIR/postgres, with
# fsync off, listening on 127.0.0.1 on a port that is not 5432 (54329, or
# the next free one), its unix socket inside the data root, and creates the
# database "idem". Running start again reuses a server that is already up;
# a server left over from a crashed run is restarted. If the postgres user
# cannot reach DIR, the data lives in /tmp/idem-postgres-<hash of DIR>
# instead (DIR/postgres.root says where). Everything but the export line
# goes to stderr. The server keeps PostgreSQL's stock max_connections
# (100): the tests of every module fit in it, as they must on a server of
# one's own.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop DIR" >&2
  exit 2
fi

bin=/usr/lib/postgresql/15/bin
log() { echo "postgres.sh: $*" >&2; }

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

# The postgres user must be able to reach its data. DIR usually sits in the
# repository, which it can traverse; if it cannot, keep the data under /tmp,
# keyed by DIR, and remember where.
root_for() {
  if runuser -u postgres -- test -x "$dir" 2>/dev/null; then
    echo "$dir/postgres"
  else
    echo "/tmp/idem-postgres-$(printf '%s' "$dir" | cksum | cut -d' ' -f1)"
  fi
}

pg() { runuser -u postgres -- "$@"; }

# ready PORT TRIES: wait until the server on PORT accepts connections,
# trying every 0.1s.
ready() {
  for _ in $(seq 1 "$2"); do
    if pg "$bin/pg_isready" -q -h 127.0.0.1 -p "$1"; then return 0; fi
    sleep 0.1
  done
  return 1
}

port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

case "$cmd" in
start)
  if [ -n "${IDEM_POSTGRES_URL:-}" ]; then
    log "IDEM_POSTGRES_URL is set; not starting a server"
    exit 0
  fi
  if [ ! -x "$bin/initdb" ]; then
    log "installing postgresql-15"
    # Only the binaries are wanted: no default cluster on port 5432.
    if [ ! -e /etc/postgresql-common/createcluster.conf ]; then
      mkdir -p /etc/postgresql-common
      echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.conf
    fi
    (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
      -o Dpkg::Options::=--force-confold postgresql-15) >&2
  fi
  root=$(root_for)
  data=$root/data
  sock=$root/sock
  mkdir -p "$root" "$sock"
  chown postgres: "$root" "$sock"
  chmod 700 "$root"
  echo "$root" >"$dir/postgres.root"

  if [ ! -s "$data/PG_VERSION" ]; then
    rm -rf "$data"
    log "initdb in $data"
    pg "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 --no-sync >&2
  fi

  running=
  if pg "$bin/pg_ctl" status -D "$data" >/dev/null 2>&1; then
    port=$(sed -n 4p "$data/postmaster.pid")
    if ready "$port" 30; then
      running=1
      log "reusing the server already running on port $port"
    else
      # A server that was killed and is still going away, or hangs: make
      # sure it is gone before starting afresh.
      log "the server in $data does not answer; stopping it"
      for _ in $(seq 1 50); do
        pg "$bin/pg_ctl" status -D "$data" >/dev/null 2>&1 || break
        sleep 0.1
      done
      if pg "$bin/pg_ctl" status -D "$data" >/dev/null 2>&1; then
        pg "$bin/pg_ctl" stop -D "$data" -m immediate -w >&2 || true
      fi
    fi
  fi
  if [ -z "$running" ]; then
    # A port that looks free may be taken by another server starting at
    # the same moment: then the next one is tried.
    port=54329
    while :; do
      if [ "$port" -gt 54399 ]; then
        log "no free port in 54329-54399"
        exit 1
      fi
      if ! port_free "$port"; then
        port=$((port + 1))
        continue
      fi
      # A leftover postmaster.pid of a dead server is removed by postgres
      # itself; pg_ctl -w waits until it accepts connections.
      log "starting on 127.0.0.1:$port"
      rm -f "$root/server.log"
      if pg "$bin/pg_ctl" start -w -t 60 -D "$data" -l "$root/server.log" -o "\
        -c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$sock \
        -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
        -c shared_buffers=128MB" >&2; then
        break
      fi
      if grep -q "Address already in use" "$root/server.log"; then
        log "port $port was taken meanwhile; trying the next"
        port=$((port + 1))
        continue
      fi
      tail -n 30 "$root/server.log" >&2 || true
      exit 1
    done
  fi

  if ! ready "$port" 100; then
    log "the server on port $port does not accept connections"
    tail -n 30 "$root/server.log" >&2 || true
    exit 1
  fi
  if ! pg "$bin/psql" -h 127.0.0.1 -p "$port" -d postgres -tAc "select 1 from pg_database where datname='idem'" | grep -q 1; then
    pg "$bin/createdb" -h 127.0.0.1 -p "$port" idem >&2
  fi
  echo "export IDEM_POSTGRES_URL='postgres://postgres@127.0.0.1:$port/idem?sslmode=disable'"
  ;;
stop)
  if [ -f "$dir/postgres.root" ]; then
    root=$(cat "$dir/postgres.root")
  else
    root=$(root_for)
  fi
  data=$root/data
  if [ -s "$data/PG_VERSION" ] && pg "$bin/pg_ctl" status -D "$data" >/dev/null 2>&1; then
    log "stopping the server in $data"
    pg "$bin/pg_ctl" stop -D "$data" -m fast -w >&2
  fi
  ;;
*)
  echo "usage: $0 start|stop DIR" >&2
  exit 2
  ;;
esac
