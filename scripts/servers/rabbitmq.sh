#!/usr/bin/env bash
# A throwaway RabbitMQ node (Debian's rabbitmq-server) for the brokers/
# trials, on loopback, on non-default ports, with its data under
# DIR/rabbitmq.
#
#   rabbitmq.sh start DIR   start it (installing rabbitmq-server with apt when
#                           missing) and print the export line
#   rabbitmq.sh stop DIR    stop what "start DIR" started
#
# When IDEM_RABBITMQ_URL is already set, start starts nothing and prints
# nothing. Ports: IDEM_RABBITMQ_PORT (default 35672) for AMQP, the next one
# for Erlang distribution and the one after for the node's own epmd (the
# port mapper, which Erlang would otherwise share on 4369 with every node of
# the machine); when any is taken by a process this script did not start,
# all three move up by 100, up to 20 times. Only the processes whose pid
# files live under DIR/rabbitmq (the node, and the epmd on its port) are
# ever stopped. The node keeps no state between runs: its database is
# created afresh by every start.
#
# The node boots in 5-10 s on an idle machine (Erlang's VM and RabbitMQ's
# boot steps), and in 20-30 s on a loaded 2-core one: start waits for up to
# 180 s for the AMQP listener, which opens at the end of the boot.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop DIR" >&2
  exit 2
fi
mkdir -p "$dir"
base=$(cd "$dir" && pwd)/rabbitmq
port=${IDEM_RABBITMQ_PORT:-35672}
bin=/usr/lib/rabbitmq/bin

log() { echo "rabbitmq.sh: $*" >&2; }

# ours: succeeds when the pid file names a live node of this directory.
ours() {
  local pid
  [ -f "$base/node.pid" ] || return 1
  pid=$(cat "$base/node.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$base"
}

stop() {
  local pid i
  if ours; then
    pid=$(cat "$base/node.pid")
    kill "$pid" 2>/dev/null || true
    for i in $(seq 1 200); do
      [ -d "/proc/$pid" ] || break
      sleep 0.05
    done
    if [ -d "/proc/$pid" ]; then
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$base/node.pid"
  # The node's own epmd (started by its VM, on the port recorded at start).
  if [ -f "$base/epmd.port" ]; then
    epmd -port "$(cat "$base/epmd.port")" -kill >/dev/null 2>&1 || true
    rm -f "$base/epmd.port"
  fi
}

port_busy() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

install() {
  if [ -x "$bin/rabbitmq-server" ] && command -v epmd >/dev/null; then
    return 0
  fi
  log "installing rabbitmq-server with apt"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update >&2
  # The package's own service (on the default port 5672) is not started
  # where policy-rc.d forbids it, as in containers; a running one does
  # not disturb this node, which uses ports, names and epmd of its own.
  apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends rabbitmq-server >&2
}

start() {
  local i node pid
  if [ -n "${IDEM_RABBITMQ_URL:-}" ]; then
    log "IDEM_RABBITMQ_URL is set; not starting a server"
    return 0
  fi
  install
  mkdir -p "$base"
  stop # a leftover of an earlier run in this DIR
  for i in $(seq 1 20); do
    if ! port_busy "$port" && ! port_busy $((port + 1)) && ! port_busy $((port + 2)); then break; fi
    port=$((port + 100))
  done
  if port_busy "$port" || port_busy $((port + 1)) || port_busy $((port + 2)); then
    log "ports $port-$((port + 2)) are in use by processes this script did not start"
    return 1
  fi
  rm -rf "$base/mnesia" "$base/log" "$base/home"
  mkdir -p "$base/mnesia" "$base/log" "$base/home"
  echo "[]." >"$base/enabled_plugins"
  : >"$base/rabbitmq-env.conf"
  cat >"$base/rabbitmq.conf" <<EOF
listeners.tcp.1 = 127.0.0.1:$port
loopback_users.guest = true
log.console = false
log.file.level = warning
EOF
  echo $((port + 2)) >"$base/epmd.port"
  node="idem$port@localhost"
  # HOME holds the node's Erlang cookie. setsid: the node must not get the
  # terminal's signals, and must outlive this script (scripts/test.sh
  # stops it with "stop").
  HOME="$base/home" \
    RABBITMQ_NODENAME="$node" \
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT="$port" \
    RABBITMQ_DIST_PORT=$((port + 1)) \
    ERL_EPMD_ADDRESS=127.0.0.1 \
    ERL_EPMD_PORT=$((port + 2)) \
    RABBITMQ_MNESIA_BASE="$base/mnesia" \
    RABBITMQ_LOG_BASE="$base/log" \
    RABBITMQ_CONFIG_FILE="$base/rabbitmq.conf" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$base/enabled_plugins" \
    RABBITMQ_PID_FILE="$base/node.pid" \
    RABBITMQ_CONF_ENV_FILE="$base/rabbitmq-env.conf" \
    setsid "$bin/rabbitmq-server" </dev/null >>"$base/node.out" 2>&1 &
  for i in $(seq 1 900); do
    if [ -s "$base/node.pid" ] && ours && port_busy "$port"; then
      echo "export IDEM_RABBITMQ_URL=amqp://guest:guest@127.0.0.1:$port/"
      return 0
    fi
    if [ "$i" -gt 100 ] && [ -s "$base/node.pid" ] && ! ours; then break; fi
    sleep 0.2
  done
  log "RabbitMQ on port $port did not start; log follows"
  tail -n 30 "$base/node.out" "$base"/log/*.log >&2 || true
  return 1
}

case "$cmd" in
start)
  if ! start; then
    stop
    exit 1
  fi
  ;;
stop) stop ;;
*)
  echo "usage: $0 start|stop DIR" >&2
  exit 2
  ;;
esac
