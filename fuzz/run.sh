#!/usr/bin/env bash
# make fuzz: run every fuzz target in the module for FUZZTIME each (default 30s).
# Go runs one fuzz target per invocation, so targets are listed per package
# and run one after another; new corpus entries land in each package's
# testdata/fuzz/<Target>/ and crashers fail the run (keep them as regressions).
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${1:-${FUZZTIME:-30s}}"
failed=0
for pkg in $(go list ./...); do
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "== $pkg $target ($fuzztime)"
    # Go minimizes every new interesting input for up to a minute by
    # default, with no execs counted meanwhile: with 20-30s per target
    # that stalled whole runs (FuzzAppendData: 219k execs in 15s, 640k
    # with 1s of minimizing). Crashers are kept whether minimized or not.
    if ! go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -fuzzminimizetime 2s "$pkg"; then
      failed=1
    fi
  done
done
exit $failed
