#!/usr/bin/env bash
# A throwaway etcd 3.4 member (Debian's etcd-server) for the store/etcd,
# lincheck and benchmark tests, on loopback, on non-default ports, with its
# data under DIR/etcd.
#
#   etcd.sh start DIR    start a fresh member (installing etcd-server and
#                        etcd-client with apt when missing) and print the
#                        export line: DIR's earlier data is wiped
#   etcd.sh stop DIR     stop what "start DIR" started; its data stays
#   etcd.sh restart DIR  stop the member if it runs, and start it again on
#                        DIR's data and port: keys, leases and revisions
#                        survive, as after a crash or an upgrade of a real
#                        member (a lease's TTL restarts in full); prints the
#                        export line
#
# When IDEM_ETCD_ENDPOINTS is already set, start starts nothing and prints
# nothing (restart is explicit, and always acts on DIR). Ports:
# IDEM_ETCD_PORT (default 23790) for clients and the next one for peers;
# when either is taken by a process this script did not start, both move
# up by 100, up to 20 times; restart reuses the port of the last start.
# Only the process whose pid file lives under DIR/etcd is ever stopped.
#
# To rehearse a restart (a service riding out an etcd restart, records and
# fences that must survive it):
#
#   eval "$(scripts/servers/etcd.sh start /tmp/rehearsal)"   # fresh
#   ... run the service, make records ...
#   scripts/servers/etcd.sh restart /tmp/rehearsal           # same data
#   ... check them ...
#   scripts/servers/etcd.sh stop /tmp/rehearsal
#
# The member runs with a 50 ms heartbeat and a 500 ms election timeout, so
# that its minimum lease TTL (1.5 election timeouts, rounded up to whole
# seconds) is 1 s: the conformance suite's leases are whole seconds from 1 s
# up. With etcd's defaults (100 ms, 1 s) the minimum is 2 s, which the
# store reports through idempotency.LimitedStore. It compacts its history
# every 5 minutes, as a production member must (see store/etcd/README.md).
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop|restart DIR" >&2
  exit 2
fi
mkdir -p "$dir"
base=$(cd "$dir" && pwd)/etcd
port=${IDEM_ETCD_PORT:-23790}

log() { echo "etcd.sh: $*" >&2; }

# ours: succeeds when the pid file names a live etcd.
ours() {
  local pid
  [ -f "$base/etcd.pid" ] || return 1
  pid=$(cat "$base/etcd.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  # A member that exited may linger as a zombie of this script's shell.
  ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q etcd
}

stop() {
  local pid i
  if ours; then
    pid=$(cat "$base/etcd.pid")
    kill "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
      [ -d "/proc/$pid" ] || break
      sleep 0.05
    done
    if [ -d "/proc/$pid" ]; then
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$base/etcd.pid"
}

port_busy() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

install() {
  if command -v etcd >/dev/null && command -v etcdctl >/dev/null; then
    return 0
  fi
  log "installing etcd-server and etcd-client with apt"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update >&2
  apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends etcd-server etcd-client >&2
}

start() {
  local i
  if [ -n "${IDEM_ETCD_ENDPOINTS:-}" ]; then
    log "IDEM_ETCD_ENDPOINTS is set; not starting a server"
    return 0
  fi
  install
  mkdir -p "$base"
  stop # a leftover of an earlier run in this DIR
  for i in $(seq 1 20); do
    if ! port_busy "$port" && ! port_busy $((port + 1)); then break; fi
    port=$((port + 100))
  done
  if port_busy "$port" || port_busy $((port + 1)); then
    log "ports $port and $((port + 1)) are in use by processes this script did not start"
    return 1
  fi
  # A fresh member every start: a data dir left by another run would
  # carry its cluster ID, members and keys (restart keeps them).
  rm -rf "$base/data"
  echo "$port" >"$base/port"
  launch
}

# restart starts the member again on the data and the port of DIR's last
# start.
restart() {
  install
  if [ ! -d "$base/data" ] || [ ! -f "$base/port" ]; then
    log "no member to restart in $base: run \"$0 start $dir\" first"
    return 1
  fi
  stop
  port=$(cat "$base/port")
  if port_busy "$port" || port_busy $((port + 1)); then
    log "ports $port and $((port + 1)) are in use by processes this script did not start"
    return 1
  fi
  launch
}

# launch runs the member on $port with its data in $base/data (new or
# kept) and waits until it is healthy.
launch() {
  local i endpoint
  endpoint="http://127.0.0.1:$port"
  # setsid: the member must not get the terminal's signals, and must
  # outlive this script (scripts/test.sh stops it with "stop").
  setsid etcd --name idem --data-dir "$base/data" \
    --listen-client-urls "$endpoint" --advertise-client-urls "$endpoint" \
    --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
    --initial-cluster "idem=http://127.0.0.1:$((port + 1))" \
    --initial-cluster-state new \
    --heartbeat-interval 50 --election-timeout 500 \
    --auto-compaction-mode periodic --auto-compaction-retention 5m \
    --logger zap --log-level warn --log-outputs "$base/etcd.log" \
    </dev/null >>"$base/etcd.out" 2>&1 &
  echo $! >"$base/etcd.pid"
  for i in $(seq 1 200); do
    if ETCDCTL_API=3 etcdctl --endpoints "$endpoint" --dial-timeout 1s endpoint health >/dev/null 2>&1; then
      echo "export IDEM_ETCD_ENDPOINTS=127.0.0.1:$port"
      return 0
    fi
    if ! ours; then break; fi
    sleep 0.05
  done
  log "etcd on port $port did not become healthy; log follows"
  tail -n 20 "$base/etcd.log" "$base/etcd.out" >&2 || true
  return 1
}

case "$cmd" in
start | restart)
  if ! "$cmd"; then
    stop
    exit 1
  fi
  ;;
stop) stop ;;
*)
  echo "usage: $0 start|stop|restart DIR" >&2
  exit 2
  ;;
esac
