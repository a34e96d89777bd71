#!/usr/bin/env bash
# Static analysis of every module of the workspace with staticcheck, at the
# version pinned here (run through the module proxy, nothing to install).
# It is not part of `make test`, to keep CI's suite short: run it before a
# release (RELEASING.md) and after a change across modules. Exits non-zero
# when any module has a finding.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
staticcheck=honnef.co/go/tools/cmd/staticcheck@v0.8.2
bin="${TMPDIR:-/tmp}/idem-lint-$$"
trap 'rm -rf "$bin"' EXIT
GOWORK=off GOBIN="$bin" go install "$staticcheck"
status=0
for dir in $(go list -m -f '{{.Dir}}'); do
  rel=${dir#"$root"}; rel=${rel#/}; rel=${rel:-.}
  echo "== $rel: staticcheck"
  (cd "$dir" && "$bin/staticcheck" ./...) || status=1
done
exit $status
