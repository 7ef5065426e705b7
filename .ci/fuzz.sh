#!/usr/bin/env bash
# Runs every native Go fuzz target in the module for $FUZZTIME each (default
# 30s): every wire family's decoder, the envelope, frame reader and stream
# header parsers, the close frame, the runner URI, and the daemon session
# state machine (semantics/daemon FuzzSessionFrames).
#
#   FUZZTIME=1m      time per target (go test -fuzztime: 30s, 1m, 10m, 5000x)
#   FUZZ=Session     only targets whose name matches this regexp
#   FUZZJOBS=2       targets fuzzed at the same time (default: the number of
#                    cores, at most the number of targets selected). Each
#                    target still gets FUZZTIME of wall time, so on 2 cores
#                    two targets with one worker each halve the campaign's
#                    length for about the same executions as one target with
#                    two workers.
#   FUZZPARALLEL=1   fuzzing workers per target (default: the cores divided
#                    among the jobs)
#   FUZZMINIMIZETIME=10s  budget to minimize each new interesting or failing
#                    input (go test's default is 60s, which stalls slow
#                    targets such as FuzzSessionFrames for a minute per
#                    new input)
#   FUZZKEEP=8       copy up to N new interesting inputs of each target from
#                    the Go fuzz cache into its package's testdata/fuzz/
#                    (committed corpora are replayed by every `go test`)
#
# Each target's output goes to $FUZZLOGDIR/<pkg>.<Target>.log (default a
# temporary directory); one line per target says how it ended.
#
# A failing input is written to the package's testdata/fuzz/<Target>/ by go
# test itself; the script exits 1 if any target failed.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-30s}
FUZZ=${FUZZ:-.}
FUZZKEEP=${FUZZKEEP:-0}
FUZZMINIMIZETIME=${FUZZMINIMIZETIME:-10s}
FUZZLOGDIR=${FUZZLOGDIR:-$(mktemp -d -t forgeyard-fuzz.XXXXXX)}
mkdir -p "$FUZZLOGDIR"
cache=$(go env GOCACHE)/fuzz

# fuzz_one DIR PKG TARGET: fuzzes one target, logs to its file, and leaves
# "ok" or "FAIL" in its .status file.
fuzz_one() {
  local dir=$1 pkg=$2 t=$3
  local log="$FUZZLOGDIR/${pkg//\//_}.$t.log"
  local before
  before=$(ls "$cache/$pkg/$t" 2>/dev/null | sort || true)
  local result=ok
  if ! go test "$pkg" -run '^$' -fuzz "^${t}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" "${par[@]}" >"$log" 2>&1; then
    # Go ≤ 1.26's coordinator can fail a clean run with a bare "context
    # deadline exceeded" at the end of -fuzztime (go.dev/issue/75804,
    # fixed in Go 1.27). A real finding always writes a failing input;
    # without one, the corpus is replayed to confirm and the run passes.
    if grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input written to' "$log" &&
      go test "$pkg" -run "^${t}\$" -count=1 >>"$log" 2>&1; then
      echo "== $pkg $t: coordinator deadline race (go.dev/issue/75804), no failing input; corpus replay passes" >>"$log"
    else
      result=FAIL
    fi
  fi
  if [ "$FUZZKEEP" -gt 0 ] && [ -d "$cache/$pkg/$t" ]; then
    mkdir -p "$dir/testdata/fuzz/$t"
    comm -13 <(echo "$before") <(ls "$cache/$pkg/$t" | sort) | head -n "$FUZZKEEP" |
      while read -r f; do [ -n "$f" ] && cp "$cache/$pkg/$t/$f" "$dir/testdata/fuzz/$t/"; done
  fi
  local last
  last=$(grep -E '^fuzz: elapsed' "$log" | tail -n 1 || true)
  echo "== $result $pkg $t: ${last:-no progress line} (log: $log)"
  echo "$result" >"$log.status"
}

# Every selected target, as "dir pkg target" lines.
selected=()
while read -r dir pkg; do
  for t in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u | grep -E "$FUZZ" || true); do
    selected+=("$dir $pkg $t")
  done
done < <(go list -f '{{.Dir}} {{.ImportPath}}' ./...)
if [ "${#selected[@]}" -eq 0 ]; then
  echo "fuzz: no target matches FUZZ=$FUZZ" >&2
  exit 1
fi
cores=$(nproc)
FUZZJOBS=${FUZZJOBS:-$cores}
[ "$FUZZJOBS" -ge 1 ] || FUZZJOBS=1
[ "$FUZZJOBS" -le "${#selected[@]}" ] || FUZZJOBS=${#selected[@]}
if [ -n "${FUZZPARALLEL:-}" ]; then
  par=(-parallel "$FUZZPARALLEL")
else
  per=$((cores / FUZZJOBS)); [ "$per" -ge 1 ] || per=1
  par=(-parallel "$per")
fi

echo "fuzzing ${#selected[@]} targets for $FUZZTIME each, $FUZZJOBS at a time, ${par[*]} each; logs in $FUZZLOGDIR"
running=0
for entry in "${selected[@]}"; do
  read -r dir pkg t <<<"$entry"
  if [ "$running" -ge "$FUZZJOBS" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  echo "== start $pkg $t ($FUZZTIME)"
  fuzz_one "$dir" "$pkg" "$t" &
  running=$((running + 1))
done
wait
status=0
failed=()
total=0
for f in "$FUZZLOGDIR"/*.status; do
  [ -e "$f" ] || continue
  total=$((total + 1))
  if [ "$(cat "$f")" != ok ]; then
    status=1
    failed+=("$(basename "$f" .log.status)")
  fi
done
echo "fuzz: $total targets, $((total - ${#failed[@]})) clean, ${#failed[@]} failed (logs in $FUZZLOGDIR)"
if [ "$status" -ne 0 ]; then
  printf 'fuzz failures:\n'; printf '  %s\n' "${failed[@]}"
  for f in "${failed[@]}"; do tail -n 30 "$FUZZLOGDIR/$f.log"; done
fi
exit $status
