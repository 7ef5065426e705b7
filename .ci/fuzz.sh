#!/usr/bin/env bash
# Runs every native Go fuzz target in the module for $FUZZTIME each (default
# 30s). New interesting inputs land in each package's testdata/fuzz/ and are
# replayed by plain `go test` from then on.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-30s}
status=0
for pkg in $(go list ./...); do
  targets=$(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true)
  for t in $targets; do
    echo "== $pkg $t ($FUZZTIME)"
    if ! go test "$pkg" -run '^$' -fuzz "^${t}\$" -fuzztime "$FUZZTIME"; then
      status=1
    fi
  done
done
exit $status
