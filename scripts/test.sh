#!/usr/bin/env bash
# The project's one test command (see README.md): vet and race-test every
# module of the workspace, against real servers. A server whose address is
# not given in the environment is installed if missing and started on
# loopback for this run, then stopped.
#
# Server scripts live in scripts/servers/NAME.sh. Each takes "start DIR",
# starts its servers with their data under DIR, and prints the shell
# "export VAR=..." lines that point the tests at them; "stop DIR" stops them.
# A script skips starting (prints nothing) when its variables are set.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
work="${IDEM_SERVER_DIR:-$root/.tmp/servers}"
mkdir -p "$work"

started=()
cleanup() {
  for s in "${started[@]}"; do bash "$s" stop "$work" || true; done
}
trap cleanup EXIT

for s in scripts/servers/*.sh; do
  [ -e "$s" ] || continue
  echo "== starting servers: $s"
  out=$(bash "$s" start "$work")
  started+=("$s")
  eval "$out"
done

modules=$(go list -m -f '{{.Dir}}')
status=0
echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go') 2>&1)
if [ -n "$unformatted" ]; then
  echo "not gofmt'ed (run gofmt -w):"; echo "$unformatted"; status=1
fi
for dir in $modules; do
  rel=${dir#"$root"}; rel=${rel#/}; rel=${rel:-.}
  echo "== $rel: go vet"
  (cd "$dir" && go vet ./...) || status=1
  echo "== $rel: go test -race"
  (cd "$dir" && go test -race -count=1 -timeout 5m ./...) || status=1
done
# A server script that cannot get its server anywhere (MongoDB without a
# Docker daemon: mongo.sh) exports IDEM_<NAME>_ABSENT with the reason; the
# suites that need it are skipped, and this is said here, loudly, never as
# a pass. IDEM_REQUIRE_SERVERS=1 (CI with servers) makes it a failure.
notrun=""
while IFS= read -r line; do
  [ -n "$line" ] || continue
  name=${line%%_ABSENT=*}; name=${name#IDEM_}
  case $name in
  MONGO) what="the MongoDB real-server suite (store/mongo server tests, lincheck TestMongo, benchmarks' mongo backend, idemctl's mongo backend, examples/reconcile's Example_mongo)" ;;
  *) what="the $name real-server suite" ;;
  esac
  notrun="$notrun$what DID NOT RUN: ${line#*_ABSENT=}; "
done < <(env | grep -E '^IDEM_[A-Z0-9]+_ABSENT=' | sort)
if [ "$status" -ne 0 ]; then
  [ -z "$notrun" ] || echo "!!!!! NOT RUN: $notrun!!!!!"
  echo "FAIL: some module failed (see above)"
  exit 1
fi
if [ -n "$notrun" ]; then
  echo "!!!!! NOT A FULL PASS: every module passed, but $notrun!!!!!"
  [ "${IDEM_REQUIRE_SERVERS:-}" != 1 ] || exit 1
  exit 0
fi
echo "ok: all modules passed"
