#!/usr/bin/env bash
# Redis servers for the store/redis tests: one single node (with one replica,
# so the WAIT option can be tested) and a three-master Redis Cluster, all on
# loopback, on non-default ports, with their data under DIR/redis.
#
#   redis.sh start DIR   start them (installing redis-server and redis-tools
#                        with apt when missing) and print the export lines
#   redis.sh stop DIR    stop what "start DIR" started
#
# When IDEM_REDIS_ADDR (and IDEM_REDIS_CLUSTER_ADDRS) are already set, the
# matching servers are not started and nothing is printed for them.
# Ports: IDEM_REDIS_PORT (default 16379; its replica listens on the next
# port) and IDEM_REDIS_CLUSTER_PORT (default 17001; the cluster uses it and
# the next two, plus the same ports + 10000 for its bus). When a port is
# taken by a process this script did not start (another checkout's run, say)
# the whole set moves up by 100, up to 20 times; the export lines give the
# ports used. Only processes whose pid files live under DIR/redis are ever
# stopped.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop DIR" >&2
  exit 2
fi
mkdir -p "$dir"
base=$(cd "$dir" && pwd)/redis
single_port=${IDEM_REDIS_PORT:-16379}
cluster_port=${IDEM_REDIS_CLUSTER_PORT:-17001}

log() { echo "redis.sh: $*" >&2; }

# ours PIDFILE: succeeds when the pid file names a live redis-server.
ours() {
  local pf=$1 pid
  [ -f "$pf" ] || return 1
  pid=$(cat "$pf" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q redis-server
}

# stop_one NAME: stops the server whose pid file is $base/NAME/redis.pid.
stop_one() {
  local d="$base/$1" pf pid i
  pf="$d/redis.pid"
  if ours "$pf"; then
    pid=$(cat "$pf")
    kill "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
      [ -d "/proc/$pid" ] || break
      sleep 0.05
    done
    if [ -d "/proc/$pid" ]; then
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$pf"
}

stop_all() {
  local d
  for d in "$base"/*/; do
    [ -d "$d" ] || continue
    stop_one "$(basename "$d")"
  done
}

port_busy() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

wait_ping() {
  local port=$1 i
  for i in $(seq 1 200); do
    if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = "PONG" ]; then
      return 0
    fi
    sleep 0.05
  done
  log "redis-server on port $port did not answer; log follows"
  tail -n 20 "$base"/*/redis.log >&2 || true
  return 1
}

# start_one NAME PORT [ARGS...]: a fresh, non-persistent redis-server.
start_one() {
  local name=$1 port=$2 d
  shift 2
  d="$base/$name"
  stop_one "$name"
  if port_busy "$port"; then
    log "port $port is in use by a process this script did not start"
    return 1
  fi
  # Leftovers of an earlier run (a stale nodes.conf makes a cluster node
  # remember a cluster that no longer exists) are removed.
  rm -rf "$d"
  mkdir -p "$d"
  redis-server --bind 127.0.0.1 --port "$port" --dir "$d" \
    --daemonize yes --pidfile "$d/redis.pid" --logfile "$d/redis.log" \
    --save '' --appendonly no --protected-mode yes "$@"
}

install() {
  if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
    return 0
  fi
  log "installing redis-server and redis-tools with apt"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update >&2
  apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends redis-server redis-tools >&2
}

# free_ports PORT...: succeeds when no process (other than ours, which are
# stopped first) listens on any of them.
free_ports() {
  local p
  for p in "$@"; do
    if port_busy "$p"; then return 1; fi
  done
}

start() {
  local want_single=1 want_cluster=1 p i addrs
  [ -n "${IDEM_REDIS_ADDR:-}" ] && want_single=0
  [ -n "${IDEM_REDIS_CLUSTER_ADDRS:-}" ] && want_cluster=0
  if [ $want_single = 0 ] && [ $want_cluster = 0 ]; then
    return 0
  fi
  install
  mkdir -p "$base"
  stop_all # leftovers of an earlier run in this DIR
  if [ $want_single = 1 ]; then
    for i in $(seq 1 20); do
      free_ports "$single_port" $((single_port + 1)) && break
      single_port=$((single_port + 100))
    done
    replica_port=$((single_port + 1))
    start_one single "$single_port"
    start_one replica "$replica_port" --replicaof 127.0.0.1 "$single_port"
    wait_ping "$single_port"
    wait_ping "$replica_port"
  fi
  if [ $want_cluster = 1 ]; then
    for i in $(seq 1 20); do
      free_ports "$cluster_port" $((cluster_port + 1)) $((cluster_port + 2)) \
        $((cluster_port + 10000)) $((cluster_port + 10001)) $((cluster_port + 10002)) && break
      cluster_port=$((cluster_port + 100))
    done
    cluster_ports=("$cluster_port" $((cluster_port + 1)) $((cluster_port + 2)))
    for i in 1 2 3; do
      p=${cluster_ports[$((i - 1))]}
      start_one "cluster-$i" "$p" --cluster-enabled yes \
        --cluster-config-file "$base/cluster-$i/nodes.conf" \
        --cluster-node-timeout 5000
    done
    for p in "${cluster_ports[@]}"; do wait_ping "$p"; done
    addrs=""
    for p in "${cluster_ports[@]}"; do addrs="$addrs 127.0.0.1:$p"; done
    # shellcheck disable=SC2086
    redis-cli --cluster create $addrs --cluster-replicas 0 --cluster-yes >&2
    wait_cluster
  fi
  if [ $want_single = 1 ]; then
    wait_replica
    echo "export IDEM_REDIS_ADDR=127.0.0.1:$single_port"
  fi
  if [ $want_cluster = 1 ]; then
    echo "export IDEM_REDIS_CLUSTER_ADDRS=127.0.0.1:${cluster_ports[0]},127.0.0.1:${cluster_ports[1]},127.0.0.1:${cluster_ports[2]}"
  fi
}

wait_cluster() {
  local i p ok
  for i in $(seq 1 200); do
    ok=1
    for p in "${cluster_ports[@]}"; do
      if ! redis-cli -h 127.0.0.1 -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then
        ok=0
      fi
    done
    [ $ok = 1 ] && return 0
    sleep 0.1
  done
  log "cluster did not reach cluster_state:ok"
  return 1
}

wait_replica() {
  local i
  for i in $(seq 1 200); do
    if redis-cli -h 127.0.0.1 -p "$single_port" info replication 2>/dev/null | grep -q '^connected_slaves:1'; then
      if redis-cli -h 127.0.0.1 -p "$replica_port" info replication 2>/dev/null | grep -q '^master_link_status:up'; then
        return 0
      fi
    fi
    sleep 0.05
  done
  log "replica on port $replica_port did not connect"
  return 1
}

case "$cmd" in
start)
  if ! start; then
    stop_all
    exit 1
  fi
  ;;
stop) stop_all ;;
*)
  echo "usage: $0 start|stop DIR" >&2
  exit 2
  ;;
esac
