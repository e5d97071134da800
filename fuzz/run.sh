#!/usr/bin/env bash
# make fuzz: run every fuzz target in the module for FUZZTIME each (default 30s).
# Go runs one fuzz target per invocation, so targets are listed per package
# and run one after another. Crashers land in each package's
# testdata/fuzz/<Target>/ and fail the run (keep them as regressions). Go
# keeps the other inputs that found new coverage in its build cache; they are
# copied into testdata/fuzz/<Target>/ too (names are content hashes, so a
# copy is never duplicated), so that the corpus lives in the repository:
# commit them, and every `go test` replays them.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${1:-${FUZZTIME:-30s}}"
cache="$(go env GOCACHE)/fuzz"
failed=0
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "== $pkg $target ($fuzztime)"
    # Go minimizes every new interesting input for up to a minute by
    # default, with no execs counted meanwhile: with 20-30s per target
    # that stalled whole runs (FuzzAppendData: 219k execs in 15s, 640k
    # with 1s of minimizing). Crashers are kept whether minimized or not.
    if ! go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -fuzzminimizetime 2s "$pkg"; then
      failed=1
    fi
    learned="$cache/$pkg/$target"
    if [ -d "$learned" ]; then
      mkdir -p "$dir/testdata/fuzz/$target"
      before=$(ls "$dir/testdata/fuzz/$target" | wc -l)
      cp -n "$learned"/* "$dir/testdata/fuzz/$target/" 2>/dev/null || true
      echo "   corpus: $(( $(ls "$dir/testdata/fuzz/$target" | wc -l) - before )) new inputs kept in ${dir#$PWD/}/testdata/fuzz/$target"
    fi
  done
done
exit $failed
