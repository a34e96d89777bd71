#!/usr/bin/env bash
# Headless Chromium for the browser tests (examples/browser): Debian's
# package, installed with apt when missing. Nothing runs between tests:
# each test starts its own browser.
#
#   chromium.sh start DIR   install chromium if missing and print
#                           export IDEM_CHROMIUM=<its binary>
#   chromium.sh stop DIR    nothing to stop
#
# When IDEM_CHROMIUM is already set, nothing is installed or printed.
set -euo pipefail

cmd=${1:-}
if [ -z "$cmd" ] || [ -z "${2:-}" ]; then
  echo "usage: $0 start|stop DIR" >&2
  exit 2
fi
case $cmd in
start)
  [ -z "${IDEM_CHROMIUM:-}" ] || exit 0
  bin=$(command -v chromium || command -v chromium-browser || true)
  if [ -z "$bin" ]; then
    echo "chromium.sh: installing chromium with apt" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq chromium >&2
    bin=$(command -v chromium)
  fi
  echo "export IDEM_CHROMIUM=$bin"
  ;;
stop) ;;
*)
  echo "usage: $0 start|stop DIR" >&2
  exit 2
  ;;
esac
