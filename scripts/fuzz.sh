#!/usr/bin/env bash
# Fuzz every go test -fuzz target of the workspace, one after the other,
# each for FUZZTIME (default 2m), with FUZZPARALLEL workers (default 1, the
# machine may be shared). FUZZMINIMIZETIME (default 10s) bounds the
# minimization of each new input: go test's default, 60s, can keep a
# single worker minimizing most of the run (the exec count then stands
# still: "execs: N (0/sec)"). `make test` (plain go test) already runs every
# target on its seed corpus (testdata/fuzz); this explores beyond it.
#
#   scripts/fuzz.sh                      # every target, 2 minutes each
#   FUZZTIME=10m scripts/fuzz.sh Key     # targets whose name contains Key
#
# A failing input is written to the package's testdata/fuzz/<Target>/ by
# go test: fix the bug and commit the file as a regression seed. The
# store/postgres targets run its test binary, whose TestMain wants
# IDEM_POSTGRES_URL (scripts/servers/postgres.sh start DIR prints it; see scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-2m}
parallel=${FUZZPARALLEL:-1}
minimize=${FUZZMINIMIZETIME:-10s}
filter=${1:-}

status=0
for dir in $(go list -m -f '{{.Dir}}'); do
  for pkg in $(cd "$dir" && go list ./...); do
    pdir=$(cd "$dir" && go list -f '{{.Dir}}' "$pkg")
    targets=$(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$pdir"/*_test.go 2>/dev/null | sed 's/^func //' || true)
    for target in $targets; do
      [[ -z $filter || $target == *"$filter"* ]] || continue
      echo "== $pkg $target ($fuzztime)"
      (cd "$pdir" && go test -run '^$' -fuzz "^$target\$" -fuzztime "$fuzztime" \
        -fuzzminimizetime "$minimize" -parallel "$parallel" .) || status=1
    done
  done
done
exit $status
