#!/usr/bin/env bash
# MongoDB for the store/mongo real-server suite (and lincheck's, and the
# benchmarks'): mongo:7 as a single-member replica set in Docker, started
# with dockertest by internal/testservers (go run ./internal/testservers/cmd/testserver).
#
#   mongo.sh start DIR   prints "export IDEM_MONGO_URI=..." on stdout, or,
#                        when no server can be had, "export IDEM_MONGO_ABSENT=..."
#                        with the reason
#   mongo.sh stop DIR    removes the container start made
#
# When IDEM_MONGO_URI is already set, start starts nothing and prints
# only "unset IDEM_MONGO_ABSENT". MongoDB has no Debian package, so without a Docker daemon
# there is no server: the tests then run everything that needs none, the
# real-server suite is skipped with the reason, and scripts/test.sh ends
# with a loud line saying it did not run. Everything but the export line
# goes to stderr.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop DIR" >&2
  exit 2
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
cd "$(dirname "$0")/../.."

# Built rather than run with "go run", which turns every failing exit
# status into 1: status 3 means "no Docker daemon".
testserver() {
  go build -o "$dir/testserver" ./internal/testservers/cmd/testserver
  "$dir/testserver" "$@"
}

case "$cmd" in
start)
  if [ -n "${IDEM_MONGO_URI:-}" ]; then
    echo "mongo.sh: IDEM_MONGO_URI is set; not starting a server" >&2
    echo "unset IDEM_MONGO_ABSENT" # the suite runs: nothing is absent
    exit 0
  fi
  set +e
  out=$(testserver start mongo "$dir" 2>"$dir/mongo.err")
  status=$?
  set -e
  cat "$dir/mongo.err" >&2
  case $status in
  0) echo "$out" ;;
  3)
    reason="IDEM_MONGO_URI is not set and no Docker daemon answers to start mongo:7 ($(tail -n 1 "$dir/mongo.err" | tr "'" '"'))"
    echo "export IDEM_MONGO_ABSENT='$reason'"
    ;;
  *)
    echo "mongo.sh: a Docker daemon answers but mongo:7 did not start (see above)" >&2
    exit 1
    ;;
  esac
  ;;
stop)
  testserver stop mongo "$dir"
  ;;
*)
  echo "usage: $0 start|stop DIR" >&2
  exit 2
  ;;
esac
